"""Which worker serves a request: the one likely holding its prompt's KV cache, unless overloaded.

Pure: the workers' loads and the request's prefix hashes in, a worker name out. The pool calls
`choose()` per request and `bench/pool_sim.py` drives the very same function, so the simulated
policy is the shipped one.

A prompt is cut into blocks of `BLOCK_CHARS` characters and hashed cumulatively (block k's hash
covers blocks 0..k), the way vLLM hashes KV blocks: two prompts share hash k exactly when they
share their first k+1 blocks. `PrefixTable` remembers, for recent hashes, which worker last
served them; the deepest remembered hash names the worker most likely to still hold that prefix.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from providers.contract.chat import content_text

BLOCK_CHARS = 256  # about 64 tokens: a few of vLLM's 16-token KV blocks
MAX_BLOCKS = 256  # prompts longer than this many blocks are matched on their first ones
TABLE_SIZE = 200_000  # remembered prefix hashes (about 20 MB), least recently used dropped


@dataclass(slots=True)
class Load:
    """What is known of one worker's load: our own count, and its engine's scraped figures."""

    inflight: int = 0  # requests this gateway has open on it
    running: int = 0  # vllm:num_requests_running
    waiting: int = 0  # vllm:num_requests_waiting
    kv_cache: float = 0.0  # vllm:kv_cache_usage_perc, 0..1


@dataclass(frozen=True, slots=True)
class Policy:
    """How much imbalance prefix affinity may cost before least-loaded wins."""

    min_slack: float = 4.0  # an affine worker may carry this many more requests than the least
    relative_slack: float = 0.5  # ...or this fraction more, whichever is larger
    kv_weight: float = 4.0  # a full KV cache counts as this many queued requests


def pressure(load: Load, policy: Policy = Policy()) -> float:
    """One number for how busy a worker is; lower is better."""
    # Our in-flight requests are also in the engine's running count once scraped: take the larger
    # rather than the sum. Waiting requests count twice, since they add directly to TTFT.
    return (max(load.inflight, load.running + load.waiting) + load.waiting
            + policy.kv_weight * load.kv_cache)


def prefix_hashes(text: str, block: int = BLOCK_CHARS, limit: int = MAX_BLOCKS) -> tuple[int, ...]:
    """Cumulative hashes of the prompt's whole blocks: hash k covers blocks 0..k."""
    digest = hashlib.blake2b(digest_size=8)
    hashes = []
    for start in range(0, min(len(text), block * limit) - block + 1, block):
        digest.update(text[start:start + block].encode("utf-8", "surrogatepass"))
        hashes.append(int.from_bytes(digest.copy().digest(), "little"))
    return tuple(hashes)


class PrefixTable:
    """Recently served prefix hashes → the worker that served them, bounded LRU."""

    def __init__(self, size: int = TABLE_SIZE) -> None:
        self.size = size
        self._owner: OrderedDict[int, str] = OrderedDict()

    def match(self, hashes: Sequence[int], workers: Mapping[str, object]) -> tuple[str, int] | None:
        """The worker (among `workers`) holding the deepest known prefix, and that depth."""
        for depth in range(len(hashes), 0, -1):
            owner = self._owner.get(hashes[depth - 1])
            if owner is not None and owner in workers:
                return owner, depth
        return None

    def record(self, hashes: Sequence[int], worker: str) -> None:
        """`worker` now holds these prefixes (it will cache them while serving)."""
        owner = self._owner
        for value in hashes:
            owner[value] = worker
            owner.move_to_end(value)
        while len(owner) > self.size:
            owner.popitem(last=False)

    def forget(self, worker: str) -> None:
        """The worker restarted: its cache is empty."""
        for value in [h for h, w in self._owner.items() if w == worker]:
            del self._owner[value]


def choose(loads: Mapping[str, Load], hashes: Sequence[int], table: PrefixTable,
           policy: Policy = Policy()) -> str:
    """Pick a worker from `loads` (not empty) for a prompt with these prefix hashes."""
    least = min(loads, key=lambda name: (pressure(loads[name], policy), name))
    chosen = least
    if hashes and (found := table.match(hashes, loads)) is not None:
        affine = found[0]
        lowest = pressure(loads[least], policy)
        slack = max(policy.min_slack, policy.relative_slack * lowest)
        if pressure(loads[affine], policy) <= lowest + slack:
            chosen = affine
    if hashes:
        table.record(hashes, chosen)
    return chosen


def prompt_text(body: Mapping[str, object]) -> str:
    """The text a worker's KV cache is keyed on, in prompt order: messages, or a prompt."""
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            if isinstance(message, dict):
                parts.append(f"<{message.get('role')}>{content_text(message.get('content'))}")
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else ""


