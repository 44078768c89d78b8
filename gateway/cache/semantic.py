"""The semantic cache's rules, pure: what of a chat request is embedded, what must match
exactly, whose entries it may be served, and how near two questions are.

A request is split in two. Its last turn, a user's, gives the text that is embedded (its text
parts). Everything else forms the *partition*: the alias, whose entries it may read (`owner`),
the embedding alias, the conversation before the last turn (its system prompt among it), the
last turn's other parts (an image), the tools, every sampling parameter. Within one partition
the nearest question is served only at or above the alias's threshold, so a different system
prompt, tool list or temperature can never be served another's answer, however close the
question. Not cached: `n` above `max_n`, a temperature above `max_temperature`, a last turn
that is not the user's, has no text or is longer than `max_chars`.
"""

from __future__ import annotations

import hashlib
import math
import operator
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.core.settings import CachePolicy, SemanticCache

ENDPOINT = "chat/completions"
# Fields that do not change what the answer says (as the exact cache reads them).
_IGNORED = frozenset({"stream", "stream_options", "user"})


@dataclass(frozen=True, slots=True)
class Question:
    """A request the semantic cache may serve: the text embedded, and its partition."""

    text: str
    partition: str


def owner(scope: str, key_id: str | None, team: str | None) -> str | None:
    """Whose entries a request reads and writes: its key's, its team's (a key without a team
    reads its own), or everyone's (None, as a gateway without keys)."""
    if scope == "global":
        return None
    if scope == "team" and team is not None:
        return f"team:{team}"
    return None if key_id is None else f"key:{key_id}"


def question(body: Mapping[str, Any], alias: str, policy: CachePolicy, semantic: SemanticCache,
             whose: str | None, betas: Sequence[str] = ()) -> Question | None:
    """The question this chat body asks and its partition; None when it is not cached."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not cacheable(body, semantic):
        return None
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "user":
        return None
    text, rest = _split(last.get("content"))
    if not text.strip() or len(text) > semantic.max_chars:
        return None
    kept = {name: value for name, value in body.items()
            if name not in _IGNORED and name != "messages"}
    turn = {name: value for name, value in last.items() if name != "content"}
    named: list[Any] = [ENDPOINT, alias, whose, semantic.embedding_alias, kept, messages[:-1],
                        turn, rest, sorted(betas)]
    identity = msgspec.json.encode(named, order="sorted")
    return Question(text, hashlib.sha256(identity).hexdigest())


def cacheable(body: Mapping[str, Any], semantic: SemanticCache) -> bool:
    """Whether the request's own parameters let its answer be kept and served: `n` and
    `temperature` within the alias's bounds (a wrong type is the admission's to refuse)."""
    n, temperature = body.get("n"), body.get("temperature")
    if n is not None and (not isinstance(n, int) or n > semantic.max_n):
        return False
    return temperature is None or (isinstance(temperature, (int, float))
                                   and temperature <= semantic.max_temperature)


def _split(content: Any) -> tuple[str, list[Any]]:
    """The text of a turn's content, and its other parts (matched exactly)."""
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        return "", []
    texts, rest = [], []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text" \
                and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            rest.append(part)
    return "\n".join(texts), rest


def unit(values: Sequence[float]) -> array[float] | None:
    """A vector scaled to length 1, as 32-bit floats; None when it is empty, all zero or not
    finite (then no similarity can be trusted)."""
    try:
        vector = array("f", values)
    except (TypeError, OverflowError):
        return None
    norm = math.sqrt(math.fsum(v * v for v in vector))
    if not vector or not math.isfinite(norm) or norm == 0:
        return None
    return array("f", (v / norm for v in vector))


def similarity(one: array[float], other: array[float]) -> float:
    """The cosine similarity of two unit vectors (0 when their sizes differ: another model
    embedded one of them)."""
    if len(one) != len(other):
        return 0.0
    return float(sum(map(operator.mul, one, other)))


def nearest(vector: array[float], candidates: Sequence[tuple[str, array[float]]]
            ) -> tuple[str, float] | None:
    """The candidate most similar to `vector`, and how similar; None when there is none."""
    best: tuple[str, float] | None = None
    for name, other in candidates:
        score = similarity(vector, other)
        if best is None or score > best[1]:
            best = (name, score)
    return best


def has_tool_calls(answer: Mapping[str, Any]) -> bool:
    """Whether a whole chat answer calls a tool (or a function, as older clients ask)."""
    for choice in answer.get("choices") or ():
        message = choice.get("message") if isinstance(choice, dict) else None
        if isinstance(message, dict) and (message.get("tool_calls")
                                          or message.get("function_call")):
            return True
    return False
