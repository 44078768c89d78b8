"""Reading a vLLM worker's `/metrics` for the figures worker picking uses. Pure."""

from __future__ import annotations

import math
from dataclasses import dataclass

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# Renamed in vLLM V1; older servers only have the second.
KV_CACHE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")


@dataclass(frozen=True, slots=True)
class EngineLoad:
    running: int = 0
    waiting: int = 0
    kv_cache: float = 0.0


def parse_metrics(text: str) -> EngineLoad:
    """Sum running/waiting over label sets; the highest KV usage (one engine per model name)."""
    running = waiting = 0.0
    kv: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else \
            line.partition(" ")
        value = _value(rest)
        if value is None or not math.isfinite(value):
            continue
        if name == RUNNING:
            running += value
        elif name == WAITING:
            waiting += value
        elif name in KV_CACHE:
            kv[name] = max(kv.get(name, 0.0), value)
    usage = kv.get(KV_CACHE[0], kv.get(KV_CACHE[1], 0.0))
    return EngineLoad(int(running), int(waiting), min(1.0, max(0.0, usage)))


def _value(rest: str) -> float | None:
    """The sample value after the labels (`...} 3.0` or ` 3.0`), ignoring a timestamp."""
    after = rest.rpartition("}")[2] if "}" in rest else rest
    parts = after.split()
    try:
        return float(parts[0]) if parts else None
    except ValueError:
        return None
