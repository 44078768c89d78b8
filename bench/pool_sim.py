"""Simulated pool of vLLM workers: prefix-cache hits and time to first token per picking policy.

A seeded discrete-event simulation. The same workload (multi-turn chats, shared system prompts,
one-off prompts) goes through round-robin, least-loaded and `providers.kinds.pool.picking.choose()`,
and the tables compare cache-hit rate, TTFT and balance. `--out` also writes a Markdown report.

    .venv/bin/python bench/pool_sim.py [--workers 4] [--requests 20000] [--seed 1] [--rate R]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import string
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from harness import percentile

from providers.kinds.pool.picking import (
    BLOCK_CHARS,
    Load,
    Policy,
    PrefixTable,
    choose,
    prefix_hashes,
    pressure,
)

CHARS_PER_TOKEN = 4  # so a 256-character block is about 64 tokens
BLOCK_TOKENS = BLOCK_CHARS // CHARS_PER_TOKEN
RATE_PER_WORKER = 3.375  # requests/s per worker that keeps about 80% of batch slots busy
LIGHT, HEAVY = 0.6, 1.05  # the lighter and heavier rates: the pool saturates near 1.1x
SLO_SLACK = 0.10  # ours may cost this much p99 TTFT over least-loaded
SHIPPED = Policy()  # the defaults in picking.py

# Events, in the order they run when simultaneous: a completion frees a slot before an arrival.
WORKER_EVENT, SCRAPE, ARRIVAL = 0, 1, 2
PREFILLED, DONE = 0, 1  # milestones of a running request


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """The simulated engines, and how often the gateway scrapes their metrics."""

    workers: int = 4
    cache_blocks: int = 2000  # prefix KV cache per worker, in 256-character blocks
    max_num_seqs: int = 16  # running slots of continuous batching
    prefill_s_per_block: float = 0.012  # ~5k prompt tokens/s on an empty batch
    decode_s_per_token: float = 0.020
    batch_slowdown: float = 0.04  # alpha: per-token time x (1 + alpha * running)
    scrape_interval: float = 1.0  # running/waiting/kv_cache are this stale at worst


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    """The mix of traffic: shares of each kind, sizes in blocks and tokens."""

    requests: int = 20_000
    rate: float = 4 * RATE_PER_WORKER  # requests/s, Poisson
    seed: int = 1
    chat_share: float = 0.5  # (a) turns of multi-turn conversations
    system_share: float = 0.3  # (b) one-off questions under a shared system prompt
    # the rest: (c) unique one-off prompts
    system_prompts: int = 8  # distinct shared system prompts, Zipf-popular
    max_prompt_blocks: int = 40
    max_turns: int = 8
    think_s: float = 12.0  # mean pause after reading a reply, before the next turn
    read_s_per_token: float = 0.035  # the user reads the reply as it streams, ~28 tokens/s
    min_output: int = 20
    max_output: int = 400


@dataclass(frozen=True, slots=True)
class Request:
    """One prompt: its prefix hashes, and what the worker will cache once it is done."""

    id: int
    arrival: float
    kind: str  # "chat", "system" or "unique"
    hashes: tuple[int, ...]  # cumulative hashes of the prompt's whole blocks
    tail: float  # the partial last block, as a fraction: always computed, never cached
    output_tokens: int
    after: tuple[int, ...]  # hashes of prompt + reply blocks, cached when the request ends
    turn: int = 0  # position in its conversation: 0 for the first turn and for one-offs


@dataclass(slots=True)
class Outcome:
    """What happened to one request in one run."""

    worker: int = -1
    cached: int = 0
    admitted: float = math.nan
    first_token: float = math.nan
    done: float = math.nan


@dataclass(frozen=True, slots=True)
class Result:
    """One policy on one workload: the figures of the report."""

    policy: str
    rate: float
    requests: int
    completed: int
    hit_rate: float
    ttft_p50: float
    ttft_p99: float
    mean_wait: float
    served: tuple[int, ...]
    busy: float  # mean fraction of batch slots in use

    @property
    def imbalance(self) -> float:
        """Most requests served by one worker over fewest."""
        return max(self.served) / min(self.served) if min(self.served) else math.inf


# --- Workload ---------------------------------------------------------------------------------


class Text:
    """Random words from a seeded vocabulary: prompt text reproducible from the seed."""

    def __init__(self, rng: random.Random, vocabulary: int = 4000) -> None:
        self.rng = rng
        self.words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9)))
                      for _ in range(vocabulary)]

    def make(self, chars: int) -> str:
        """Exactly `chars` characters of random words."""
        text = " ".join(self.rng.choices(self.words, k=chars // 5 + 2))
        return text[:chars].ljust(chars)


def block_hashes(text: str) -> tuple[tuple[int, ...], float]:
    """The prompt's prefix hashes and its partial last block as a fraction."""
    return prefix_hashes(text), len(text) % BLOCK_CHARS / BLOCK_CHARS


def output_tokens(rng: random.Random, config: WorkloadConfig) -> int:
    """Log-uniform reply length: many short answers, some long ones."""
    low, high = math.log(config.min_output), math.log(config.max_output)
    return round(math.exp(rng.uniform(low, high)))


def unique_blocks(request_id: int, prompt: tuple[int, ...], tokens: int) -> tuple[int, ...]:
    """Hashes for reply blocks nobody will ask for again: they only take cache space."""
    count = math.ceil(tokens / BLOCK_TOKENS)
    # Small integers: no 64-bit prefix hash will collide with them in practice.
    return prompt + tuple((request_id << 12 | k) + 1 for k in range(count))


@dataclass(slots=True)
class Draft:
    """A request before arrival times and ids are known."""

    kind: str
    text_hashes: tuple[int, ...]
    tail: float
    output_tokens: int
    reply_hashes: tuple[int, ...] | None  # known for chats: the reply is in the next prompt
    turn: int = 0
    gap: float = 0.0  # seconds after the previous turn of its conversation


def conversation(text: Text, rng: random.Random, config: WorkloadConfig) -> list[Draft]:
    """The turns of one chat: each prompt is the whole conversation so far plus a message."""
    limit = config.max_prompt_blocks * BLOCK_CHARS
    turns: list[Draft] = []
    history = ""
    previous_tokens = 0
    for turn in range(rng.randint(2, config.max_turns)):
        # A first message sets the scene (at least a block); follow-ups are shorter.
        message = text.make(rng.randint(300, 1500) if turn == 0 else rng.randint(50, 800))
        prompt = f"{history}\nUser: {message}\nAssistant: "
        if len(prompt) > limit:
            break  # the client would start a new conversation here
        tokens = output_tokens(rng, config)
        history = prompt + text.make(tokens * CHARS_PER_TOKEN)
        hashes, tail = block_hashes(prompt)
        gap = 0.0
        if turn:  # the previous reply streamed while read, then the user thought and typed
            gap = (previous_tokens * config.read_s_per_token
                   + rng.expovariate(1 / config.think_s))
        turns.append(Draft("chat", hashes, tail, tokens, block_hashes(history)[0], turn, gap))
        previous_tokens = tokens
    return turns


def one_off(text: Text, rng: random.Random, config: WorkloadConfig,
            systems: Sequence[str]) -> Draft:
    """A single-turn request: under a shared system prompt, or entirely its own."""
    share = config.system_share / (1 - config.chat_share)
    limit = config.max_prompt_blocks * BLOCK_CHARS
    if rng.random() < share:
        weights = [1 / (rank + 1) for rank in range(len(systems))]
        system = rng.choices(systems, weights)[0]
        prompt = system + text.make(rng.randint(50, min(3000, limit - len(system))))
        kind = "system"
    else:
        prompt = text.make(rng.randint(BLOCK_CHARS, limit))
        kind = "unique"
    hashes, tail = block_hashes(prompt)
    return Draft(kind, hashes, tail, output_tokens(rng, config), None)


def poisson_times(rng: random.Random, rate: float, count: int) -> list[float]:
    """`count` arrival times of a Poisson process."""
    now, times = 0.0, []
    for _ in range(count):
        now += rng.expovariate(rate)
        times.append(now)
    return times


def make_workload(config: WorkloadConfig) -> list[Request]:
    """The requests, sorted by arrival, identical for a given config."""
    rng = random.Random(config.seed)
    text = Text(rng)
    systems = [text.make(rng.randint(2 * BLOCK_CHARS, 6 * BLOCK_CHARS + BLOCK_CHARS - 1))
               for _ in range(config.system_prompts)]
    chats: list[list[Draft]] = []
    turns = 0
    while turns < config.requests * config.chat_share:
        chats.append(conversation(text, rng, config))
        turns += len(chats[-1])
    singles = [one_off(text, rng, config, systems)
               for _ in range(round(config.requests * (1 - config.chat_share)))]
    # Conversations start at the rate that makes their turns `chat_share` of the traffic.
    mean_turns = turns / len(chats) if chats else 1.0
    starts = poisson_times(rng, config.rate * config.chat_share / mean_turns, len(chats))
    timed: list[tuple[float, Draft]] = []
    for start, chat in zip(starts, chats, strict=True):
        now = start
        for draft in chat:
            now += draft.gap
            timed.append((now, draft))
    rest = poisson_times(rng, config.rate * (1 - config.chat_share), len(singles))
    timed += zip(rest, singles, strict=True)
    timed.sort(key=lambda pair: pair[0])
    return [finish(index, at, draft) for index, (at, draft) in enumerate(timed[:config.requests])]


def finish(index: int, arrival: float, draft: Draft) -> Request:
    """A draft with its id and arrival time."""
    after = draft.reply_hashes
    if after is None:
        after = unique_blocks(index, draft.text_hashes, draft.output_tokens)
    return Request(index, arrival, draft.kind, draft.text_hashes, draft.tail,
                   draft.output_tokens, after, draft.turn)


def reuse_bound(requests: Sequence[Request]) -> float:
    """Hit rate of one infinite cache: the share of prompt blocks seen in earlier requests."""
    seen: set[int] = set()
    hits = total = 0
    for request in requests:
        hits += prefix_depth(request.hashes, seen)
        total += len(request.hashes)
        seen.update(request.after)
    return hits / total if total else 0.0


def prefix_depth(hashes: Sequence[int], cache: Mapping[int, object] | set[int]) -> int:
    """How many leading blocks are cached: vLLM reuses a prefix only up to its first miss."""
    depth = 0
    for value in hashes:
        if value not in cache:
            break
        depth += 1
    return depth


# --- Workers ----------------------------------------------------------------------------------


class Worker:
    """One vLLM engine: LRU prefix cache, `max_num_seqs` running slots, a FIFO waiting queue.

    Running requests advance on a shared clock of work-seconds that ticks at 1/(1 + alpha*n) per
    real second with n running, so every admission or exit slows or speeds up the whole batch.
    """

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.waiting: deque[int] = deque()
        self.milestones: list[tuple[float, int, int]] = []  # (work clock, kind, request)
        self.running = 0
        self.kv_blocks = 0  # blocks held by running requests: vllm:kv_cache_usage_perc
        self.clock = 0.0  # work-seconds each running request has received
        self.updated = 0.0  # real time the clock was last brought up to date
        self.version = 0  # invalidates the scheduled wake-up when the batch changes

    def factor(self) -> float:
        """Real seconds per work-second at the current batch size."""
        return 1 + self.config.batch_slowdown * self.running

    def advance(self, now: float) -> None:
        """Bring the work clock up to real time `now`."""
        elapsed = now - self.updated
        self.clock += elapsed / self.factor()
        self.updated = now

    def admit(self, request: Request) -> int:
        """Start a request (the clock must be current): cache lookup, then its milestones."""
        cached = prefix_depth(request.hashes, self.cache)
        self.touch(request.hashes)
        # vLLM always computes the partial last block, and at least the last token.
        blocks = max(len(request.hashes) - cached + request.tail, 1 / BLOCK_TOKENS)
        prefill = blocks * self.config.prefill_s_per_block
        decode = request.output_tokens * self.config.decode_s_per_token
        heapq.heappush(self.milestones, (self.clock + prefill, PREFILLED, request.id))
        heapq.heappush(self.milestones, (self.clock + prefill + decode, DONE, request.id))
        self.running += 1
        self.kv_blocks += kv_blocks(request)
        return cached

    def release(self, request: Request) -> None:
        """A request ended: its slot and blocks free, its prompt and reply stay cached."""
        self.running -= 1
        self.kv_blocks -= kv_blocks(request)
        self.touch(request.after)

    def touch(self, hashes: Sequence[int]) -> None:
        """Mark blocks most recently used, evicting the least recently used beyond capacity."""
        cache = self.cache
        # Deepest block first, so a prefix's root is the last to go (vLLM frees in reverse).
        for value in reversed(hashes):
            cache[value] = None
            cache.move_to_end(value)
        while len(cache) > self.config.cache_blocks:
            cache.popitem(last=False)

    def wake_at(self, now: float) -> float | None:
        """Real time of the next milestone if the batch stays as it is."""
        if not self.milestones:
            return None
        return now + max(self.milestones[0][0] - self.clock, 0.0) * self.factor()


def kv_blocks(request: Request) -> int:
    """KV blocks a running request holds: its prompt and its reply."""
    return len(request.hashes) + 1 + math.ceil(request.output_tokens / BLOCK_TOKENS)


# --- Policies ---------------------------------------------------------------------------------

Picker = Callable[[Mapping[str, Load], Sequence[int]], str]


def round_robin() -> Picker:
    """Each worker in turn, blind to load and prefixes."""
    turn = 0

    def pick(loads: Mapping[str, Load], hashes: Sequence[int]) -> str:
        nonlocal turn
        names = sorted(loads)
        turn += 1
        return names[(turn - 1) % len(names)]

    return pick


def least_loaded(policy: Policy = SHIPPED) -> Picker:
    """The lowest `pressure()`, exactly as `choose()` ranks workers, without affinity."""

    def pick(loads: Mapping[str, Load], hashes: Sequence[int]) -> str:
        return min(loads, key=lambda name: (pressure(loads[name], policy), name))

    return pick


def prefix_affinity(policy: Policy = SHIPPED) -> Picker:
    """The shipped `choose()` with its own `PrefixTable`."""
    table = PrefixTable()

    def pick(loads: Mapping[str, Load], hashes: Sequence[int]) -> str:
        return choose(loads, hashes, table, policy)

    return pick


# --- Simulation -------------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """The mutable state of one simulation run."""

    requests: Sequence[Request]
    config: PoolConfig
    pick: Picker
    workers: list[Worker] = field(init=False)
    names: list[str] = field(init=False)
    view: dict[str, Load] = field(init=False)  # the gateway's picture of each worker
    outcomes: list[Outcome] = field(init=False)
    events: list[tuple[float, int, int, int, int]] = field(default_factory=list)
    sequence: int = 0
    completed: int = 0

    def __post_init__(self) -> None:
        self.workers = [Worker(self.config) for _ in range(self.config.workers)]
        self.names = [f"w{index}" for index in range(self.config.workers)]
        self.view = {name: Load() for name in self.names}
        self.outcomes = [Outcome() for _ in self.requests]

    def push(self, at: float, kind: int, first: int, second: int = 0) -> None:
        """Schedule an event; the sequence number keeps ties in scheduling order."""
        self.sequence += 1
        heapq.heappush(self.events, (at, kind, self.sequence, first, second))

    def reschedule(self, index: int, now: float) -> None:
        """The worker's batch changed: replace its pending wake-up."""
        worker = self.workers[index]
        worker.version += 1
        wake = worker.wake_at(now)
        if wake is not None:
            self.push(wake, WORKER_EVENT, index, worker.version)


def simulate(requests: Sequence[Request], config: PoolConfig, pick: Picker) -> list[Outcome]:
    """Run the workload through the pool, every worker picked by `pick`; outcomes by request."""
    run = Run(requests, config, pick)
    for request in requests:
        run.push(request.arrival, ARRIVAL, request.id)
    for index in range(config.workers):  # scrapes staggered, as independent timers would be
        run.push(config.scrape_interval * index / config.workers, SCRAPE, index)
    while run.events:
        now, kind, _, first, second = heapq.heappop(run.events)
        if kind == ARRIVAL:
            arrive(run, requests[first], now)
        elif kind == SCRAPE:
            scrape(run, first, now)
        elif second == run.workers[first].version:
            wake(run, first, now)
    return run.outcomes


def arrive(run: Run, request: Request, now: float) -> None:
    """The gateway picks a worker; the worker starts the request or queues it."""
    name = run.pick(run.view, request.hashes)
    index = run.names.index(name)
    run.view[name].inflight += 1  # the gateway counts its own requests exactly
    run.outcomes[request.id].worker = index
    worker = run.workers[index]
    if worker.running < run.config.max_num_seqs:
        start(run, index, request, now)
        run.reschedule(index, now)
    else:
        worker.waiting.append(request.id)


def start(run: Run, index: int, request: Request, now: float) -> None:
    """Admit a request into the worker's batch (its clock brought up to `now` first)."""
    worker = run.workers[index]
    worker.advance(now)
    outcome = run.outcomes[request.id]
    outcome.admitted = now
    outcome.cached = worker.admit(request)


def wake(run: Run, index: int, now: float) -> None:
    """Handle the worker's due milestones: first tokens and finished requests."""
    worker = run.workers[index]
    worker.advance(now)
    # The wake-up was computed for the top milestone: rounding must not leave it pending.
    worker.clock = max(worker.clock, worker.milestones[0][0])
    while worker.milestones and worker.milestones[0][0] <= worker.clock + 1e-9:
        _, kind, request_id = heapq.heappop(worker.milestones)
        outcome = run.outcomes[request_id]
        if kind == PREFILLED:
            outcome.first_token = now
            continue
        outcome.done = now
        worker.release(run.requests[request_id])
        run.view[run.names[index]].inflight -= 1
        run.completed += 1
        if worker.waiting:
            start(run, index, run.requests[worker.waiting.popleft()], now)
    run.reschedule(index, now)


def scrape(run: Run, index: int, now: float) -> None:
    """The gateway refreshes one worker's engine metrics; they stay as read until the next."""
    worker = run.workers[index]
    load = run.view[run.names[index]]
    load.running = worker.running
    load.waiting = len(worker.waiting)
    load.kv_cache = worker.kv_blocks / run.config.cache_blocks
    if run.completed < len(run.requests):
        run.push(now + run.config.scrape_interval, SCRAPE, index)


# --- Results ----------------------------------------------------------------------------------


def summarize(label: str, rate: float, requests: Sequence[Request], outcomes: Sequence[Outcome],
              config: PoolConfig) -> Result:
    """The report's figures for one run."""
    done = [o for o in outcomes if not math.isnan(o.done)]
    total = sum(len(r.hashes) for r in requests)
    served = [0] * config.workers
    for outcome in done:
        served[outcome.worker] += 1
    end = max((o.done for o in done), default=0.0)
    slots = config.workers * config.max_num_seqs * end
    ttft = [o.first_token - r.arrival for r, o in zip(requests, outcomes, strict=True)]
    waits = [o.admitted - r.arrival for r, o in zip(requests, outcomes, strict=True)]
    return Result(
        policy=label, rate=rate, requests=len(requests), completed=len(done),
        hit_rate=sum(o.cached for o in outcomes) / total if total else 0.0,
        ttft_p50=percentile(ttft, 0.50), ttft_p99=percentile(ttft, 0.99),
        mean_wait=sum(waits) / len(waits), served=tuple(served),
        # Each request holds a slot from admission to its end.
        busy=sum(o.done - o.admitted for o in done) / slots if slots else 0.0)


def run_policy(label: str, pick: Picker, requests: Sequence[Request], rate: float,
               config: PoolConfig) -> Result:
    """Simulate one policy on a workload and summarize it."""
    return summarize(label, rate, requests, simulate(requests, config, pick), config)


def standard_policies(policy: Policy = SHIPPED) -> dict[str, Callable[[], Picker]]:
    """The three policies compared, as factories: each run needs fresh state."""
    return {"round-robin": round_robin, "least-loaded": lambda: least_loaded(policy),
            "ours (choose)": lambda: prefix_affinity(policy)}


SWEEP = (  # Policy settings tried: tighter and looser slack than the shipped default
    SHIPPED,
    Policy(min_slack=0.0, relative_slack=0.0),  # affinity only between equally loaded workers
    Policy(min_slack=2.0, relative_slack=0.0),
    Policy(min_slack=4.0, relative_slack=0.0),
    Policy(min_slack=8.0, relative_slack=0.0),
    Policy(min_slack=4.0, relative_slack=0.25),
    Policy(min_slack=16.0, relative_slack=1.0),
)


@dataclass(frozen=True, slots=True)
class Report:
    """Everything a run of the script measured."""

    pool: PoolConfig
    workload: WorkloadConfig
    bounds: dict[float, float]  # rate -> hit rate of one infinite cache
    tables: dict[float, list[Result]]  # rate -> the three policies
    sweep: dict[float, list[tuple[Policy, Result]]]  # rate -> ours under each setting
    seeds: dict[int, list[Result]]  # other seeds at the main rate -> least-loaded and ours
    seconds: float


def study(pool: PoolConfig, workload: WorkloadConfig, sweep_rates: Sequence[float] = (),
          other_seeds: Sequence[int] = ()) -> Report:
    """The policies at the lighter, main and heavier rates, the Policy sweep, other seeds."""
    began = time.perf_counter()
    main = workload.rate
    rates = [round(main * LIGHT, 3), main, round(main * HEAVY, 3)]
    bounds: dict[float, float] = {}
    tables: dict[float, list[Result]] = {}
    sweep: dict[float, list[tuple[Policy, Result]]] = {}
    for rate in rates:
        requests = make_workload(replace(workload, rate=rate))
        bounds[rate] = reuse_bound(requests)
        tables[rate] = [run_policy(label, factory(), requests, rate, pool)
                        for label, factory in standard_policies().items()]
        if rate in sweep_rates:
            sweep[rate] = [(setting, run_policy("ours", prefix_affinity(setting), requests,
                                                rate, pool)) for setting in SWEEP]
    seeds = {seed: compare_seed(pool, replace(workload, seed=seed)) for seed in other_seeds}
    return Report(pool, workload, bounds, tables, sweep, seeds, time.perf_counter() - began)


def compare_seed(pool: PoolConfig, workload: WorkloadConfig) -> list[Result]:
    """Least-loaded and ours on another draw of the workload: is the difference noise?"""
    requests = make_workload(workload)
    policies = standard_policies()
    return [run_policy(label, policies[label](), requests, workload.rate, pool)
            for label in ("least-loaded", "ours (choose)")]


# --- Markdown ---------------------------------------------------------------------------------


def policy_table(results: Sequence[Result]) -> str:
    """The per-policy table for one rate."""
    lines = ["| policy | hit rate | TTFT p50 | TTFT p99 | mean queue wait | max/min served "
             "| busy slots |", "|---|--:|--:|--:|--:|--:|--:|"]
    lines += [f"| {r.policy} | {r.hit_rate:.1%} | {ms(r.ttft_p50)} | {ms(r.ttft_p99)} "
              f"| {ms(r.mean_wait)} | {r.imbalance:.2f} | {r.busy:.0%} |" for r in results]
    return "\n".join(lines)


def sweep_table(rows: Sequence[tuple[Policy, Result]], baseline: Result) -> str:
    """Ours under each Policy setting, against least-loaded."""
    lines = ["| min_slack | relative_slack | hit rate | TTFT p50 | TTFT p99 | p99 vs least-loaded "
             "| mean queue wait | max/min served |", "|--:|--:|--:|--:|--:|--:|--:|--:|"]
    lines.append(f"| least-loaded | | {baseline.hit_rate:.1%} | {ms(baseline.ttft_p50)} "
                 f"| {ms(baseline.ttft_p99)} | | {ms(baseline.mean_wait)} "
                 f"| {baseline.imbalance:.2f} |")
    for setting, r in rows:
        shipped = " (shipped)" if setting == SHIPPED else ""
        lines.append(f"| {setting.min_slack:g}{shipped} | {setting.relative_slack:g} "
                     f"| {r.hit_rate:.1%} "
                     f"| {ms(r.ttft_p50)} | {ms(r.ttft_p99)} "
                     f"| {r.ttft_p99 / baseline.ttft_p99 - 1:+.0%} | {ms(r.mean_wait)} "
                     f"| {r.imbalance:.2f} |")
    return "\n".join(lines)


def ms(seconds: float) -> str:
    """Seconds as whole milliseconds."""
    return f"{seconds * 1000:,.0f} ms"


def verdict(results: Sequence[Result]) -> str:
    """Plainly: does ours beat least-loaded on hits while keeping p99 TTFT within budget?"""
    least, ours = by_name(results, "least-loaded"), by_name(results, "ours (choose)")
    ratio = ours.ttft_p99 / least.ttft_p99 - 1
    hits = "beats" if ours.hit_rate > least.hit_rate else "does **not** beat"
    within = "within" if ratio <= SLO_SLACK else "**outside**"
    return (f"ours {hits} least-loaded on cache hits ({ours.hit_rate:.1%} vs "
            f"{least.hit_rate:.1%}); its p99 TTFT is {abs(ratio):.0%} "
            f"{'lower' if ratio < 0 else 'higher'} ({ms(ours.ttft_p99)} vs "
            f"{ms(least.ttft_p99)}), {within} the {SLO_SLACK:.0%} budget.")


def by_name(results: Sequence[Result], label: str) -> Result:
    """The result of the named policy."""
    return next(r for r in results if r.policy == label)


def tables_markdown(report: Report) -> Iterator[str]:
    """The results sections: per rate, other seeds, then the sweep."""
    main = report.workload.rate
    for rate, results in report.tables.items():
        name = "main" if rate == main else "lighter" if rate < main else "heavier"
        yield (f"### {rate:g} requests/s ({name})\n\nOne infinite shared cache would hit "
               f"{report.bounds[rate]:.1%} of prompt blocks.\n\n{policy_table(results)}\n\n"
               f"Verdict: {verdict(results)}\n")
    if report.seeds:
        yield (f"### Other workload seeds at {main:g} requests/s\n\nThe same comparison on "
               f"other draws of the workload, to tell a difference from noise.\n\n"
               f"{seeds_table(report)}\n")
    for rate, rows in report.sweep.items():
        baseline = by_name(report.tables[rate], "least-loaded")
        yield (f"### Policy sweep at {rate:g} requests/s\n\nOurs under other `Policy` slack "
               "settings (kv_weight as shipped). min_slack=0, relative_slack=0 follows "
               "affinity only between equally loaded workers, i.e. nearly least-loaded.\n\n"
               f"{sweep_table(rows, baseline)}\n\n"
               f"{best_setting(rows, baseline)}\n")


def seeds_table(report: Report) -> str:
    """Least-loaded against ours at the main rate on other workload seeds."""
    lines = ["| seed | hit rate least-loaded | hit rate ours | TTFT p99 least-loaded "
             "| TTFT p99 ours | p99 change |", "|--:|--:|--:|--:|--:|--:|"]
    rows = {report.workload.seed: report.tables[report.workload.rate], **report.seeds}
    for seed, results in rows.items():
        least, ours = by_name(results, "least-loaded"), by_name(results, "ours (choose)")
        lines.append(f"| {seed} | {least.hit_rate:.1%} | {ours.hit_rate:.1%} "
                     f"| {ms(least.ttft_p99)} | {ms(ours.ttft_p99)} "
                     f"| {ours.ttft_p99 / least.ttft_p99 - 1:+.0%} |")
    return "\n".join(lines)


def best_setting(rows: Sequence[tuple[Policy, Result]], baseline: Result) -> str:
    """The setting with the lowest p99 TTFT, and the one with the most hits within budget."""
    fastest = min(rows, key=lambda row: row[1].ttft_p99)[0]
    fits = [(r.hit_rate, -r.ttft_p99, s) for s, r in rows
            if r.ttft_p99 <= baseline.ttft_p99 * (1 + SLO_SLACK)]
    text = f"Lowest p99 TTFT: {describe(fastest)}. "
    if not fits:
        return text + "No setting keeps p99 TTFT within the budget at this rate."
    _, _, setting = max(fits, key=lambda row: row[:2])
    return text + f"Most hits within the {SLO_SLACK:.0%} p99 budget: {describe(setting)}."


def describe(setting: Policy) -> str:
    """A Policy's slack settings, marked when they are the shipped defaults."""
    shipped = " (shipped)" if setting == SHIPPED else ""
    return f"min_slack={setting.min_slack:g}, relative_slack={setting.relative_slack:g}{shipped}"


def document(report: Report, command: str) -> str:
    """The Markdown report: method, parameters, results."""
    pool, load = report.pool, report.workload
    return "\n".join([
        "# Worker pool simulation: prefix affinity against load balancing",
        "",
        "Generated by `bench/pool_sim.py`; do not edit the numbers by hand. Reproduce with:",
        "",
        f"```sh\n{command}\n```",
        "",
        "## Method",
        "",
        "A seeded discrete-event simulation of the gateway in front of a pool of vLLM workers. "
        "The identical request stream goes through three pickers: **round-robin**, "
        "**least-loaded** (lowest `pressure()` of each worker's `Load`, no affinity) and "
        "**ours**, `providers.kinds.pool.picking.choose()` with a `PrefixTable` and the default "
        "`Policy()`. All three read the same `Load` per worker: `inflight` is exact (the "
        "gateway counts its own requests), `running`, `waiting` and `kv_cache` come from a "
        f"metrics scrape every {pool.scrape_interval:g} s (staggered across workers) and are "
        "stale in between.",
        "",
        f"**Workers** ({pool.workers}): each has an LRU prefix cache of {pool.cache_blocks:,} "
        f"blocks of {BLOCK_CHARS} characters (~{BLOCK_TOKENS} tokens), keyed by the cumulative "
        "hashes of `prefix_hashes()`, and continuous batching with "
        f"{pool.max_num_seqs} running slots and a FIFO waiting queue. At admission a request "
        "reuses the longest prefix of its blocks found in that worker's cache; its prefill "
        f"costs {pool.prefill_s_per_block * 1000:g} ms per uncached block (plus its partial last "
        f"block), then decoding {pool.decode_s_per_token * 1000:g} ms per output token, all "
        f"stretched by (1 + {pool.batch_slowdown:g} x running) as the batch fills and shrinks. "
        "TTFT = queue wait + prefill. The prompt's blocks enter the cache at admission, and "
        "the reply's blocks when it ends (deepest blocks evicted first, as vLLM frees them).",
        "",
        f"**Workload** ({load.requests:,} requests, seed {load.seed}; one-off requests and "
        "conversation starts arrive as Poisson processes; rates "
        f"{LIGHT:g}x, 1x and {HEAVY:g}x the main rate, the pool saturating near 1.1x): "
        f"{load.chat_share:.0%} turns of "
        f"multi-turn chats (2-{load.max_turns} turns, each prompt the whole conversation so "
        f"far plus a new message; the next turn comes once the user has read the reply as it "
        f"streamed ({load.read_s_per_token * 1000:g} ms per token) and thought for Exp(mean "
        f"{load.think_s:g} s); dozens of conversations open at once), "
        f"{load.system_share:.0%} one-off questions under one of {load.system_prompts} shared "
        "system prompts of 2-6 blocks (Zipf popularity), and the rest unique prompts of 1-"
        f"{load.max_prompt_blocks} blocks. Prompts are at most {load.max_prompt_blocks} "
        f"blocks; outputs are log-uniform {load.min_output}-{load.max_output} tokens. Text is "
        "random words from the seed.",
        "",
        "**Figures**: hit rate = cached prompt blocks / all prompt blocks; TTFT p50 and p99; "
        "mean queue wait (arrival to admission); max/min requests served per worker; busy "
        "slots = mean share of batch slots in use until the last request ends.",
        "",
        "**Not modelled**: the network and the gateway's own latency; chunked prefill slowing "
        "other requests' decoding more than a decode step does; admission limited by free KV "
        "blocks (the running batch uses a fraction of the cache here); blocks of running "
        "requests pinned against eviction; preemption; worker failures; clients abandoning "
        "slow requests; a late reply delaying the next turn (turn times are drawn in advance, "
        "so the workload is the same for every policy).",
        "",
        "## Results",
        "",
        *tables_markdown(report),
    ])


def main(argv: Sequence[str] | None = None) -> None:
    """Parse arguments, run the study, print the tables, write the report if asked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rate", type=float, help="main rate in requests/s "
                        f"(default {RATE_PER_WORKER:g} per worker, ~80%% of slots busy)")
    parser.add_argument("--out", type=Path, help="write the Markdown report here")
    args = parser.parse_args(argv)
    rate = args.rate or RATE_PER_WORKER * args.workers
    pool = PoolConfig(workers=args.workers)
    load = WorkloadConfig(requests=args.requests, rate=rate, seed=args.seed)
    report = study(pool, load, sweep_rates=(rate, round(rate * HEAVY, 3)),
                   other_seeds=(args.seed + 1, args.seed + 2))
    print("\n".join(tables_markdown(report)))
    print(f"simulated in {report.seconds:.1f} s")
    if args.out:
        command = (f".venv/bin/python bench/pool_sim.py --workers {args.workers} --requests "
                   f"{args.requests} --seed {args.seed} --rate {rate:g} --out {args.out}")
        args.out.write_text(document(report, command))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
