"""Guardrails' cost. In-process: the regex tier on an 8 KB prompt (p50/p99 µs), a request body
screened with a pseudonymize policy, and a stream's screening per event. Served (`served_cost`,
one gateway through granian on core 0, the fake upstream and the load on core 1): req/s of an
alias with a pseudonymize policy against one without, in turn, with the same prompt holding an
address and a phone number; and time to first token of streams with restoration on against
off (`make bench` part `guardrails`; `python -m bench.guardrails` for the in-process part).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from gateway.core.settings.guardrails import GuardrailPolicy
from gateway.guardrails.policies import compiled
from gateway.guardrails.screening import Screening
from gateway.guardrails.streams import StreamScreen

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "please",
         "summarise", "this", "report", "about", "quarterly", "revenue", "growth", "in", "2024",
         "and", "15", "regions", "we", "serve"]


def prompt(size: int = 8192, seed: int = 1) -> str:
    """`size` characters of prose, with an e-mail address and a phone number at its end."""
    rng = random.Random(seed)
    tail = " Write to alice@example.com or call +1 415 555 2671."
    text = " ".join(rng.choice(WORDS) for _ in range(size // 4))
    return text[:size - len(tail)] + tail


def _quantiles(times: list[float]) -> dict[str, float]:
    times.sort()
    return {"p50_us": round(times[len(times) // 2] * 1e6, 1),
            "p99_us": round(times[int(len(times) * 0.99)] * 1e6, 1)}


def regex_tier(rounds: int = 500) -> dict[str, Any]:
    """One policy detecting everything built in, on an 8 KB prompt; and the whole body of a
    chat request screened with a pseudonymize policy (decode, screen, encode)."""
    every = compiled("all", GuardrailPolicy(
        detect=("email", "phone", "card", "iban", "ip", "secrets"), action="pseudonymize"))
    pii = compiled("pii", GuardrailPolicy(detect=("email", "phone"), action="pseudonymize"))
    text = prompt()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": text}]}).encode()
    detect, screen = [], []
    every.detector.find(text)  # libphonenumber loads its metadata on first use
    for _ in range(rounds):
        began = time.perf_counter()
        every.detector.find(text)
        detect.append(time.perf_counter() - began)
        began = time.perf_counter()
        msgspec.json.encode(Screening().request(msgspec.json.decode(body), [pii]))
        screen.append(time.perf_counter() - began)
    return {"every_detector_8kb": _quantiles(detect), "pseudonymize_body_8kb": _quantiles(screen)}


def stream_events(rounds: int = 2000) -> dict[str, Any]:
    """A chat stream's event passed with restoration on (a placeholder in one event in ten),
    per event."""
    pii = compiled("pii", GuardrailPolicy(detect=("email",), action="pseudonymize"))
    screening = Screening()
    screening.request({"content": "alice@example.com"}, [pii])
    events = [b'data: {"choices":[{"index":0,"delta":{"content":"' +
              (b"[EMAIL_1]" if n % 10 == 0 else b"word ") + b'"},"finish_reason":null}]}\n\n'
              for n in range(rounds)]
    screen = StreamScreen(screening, ())
    times = []
    for event in events:
        began = time.perf_counter()
        screen.feed(event)
        times.append(time.perf_counter() - began)
    return {"restoring_per_event": _quantiles(times)}


def guardrails_cost() -> dict[str, Any]:
    return {**regex_tier(), **stream_events()}


CLIENTS = 50
PROMPT = ("Please draft a short reply to the customer below and keep it polite. " * 3 +
          "They wrote from alice@example.com and asked to be called on +1 415 555 2671.")
STREAMS = 20  # concurrent streams of the TTFT runs


def body(model: str, stream: bool = False) -> dict[str, Any]:
    """The request both sides send: the same prompt, to an alias with or without guardrails."""
    return {"model": model, "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": 16, **({"stream": True} if stream else {})}


def served_cost(work: Path, duration: float, rounds: int,
                measure: Callable[[str, dict[str, Any], float], float]) -> dict[str, Any]:
    """`rounds` of the two aliases in turn, req/s (`measure(url, body, seconds)`), then
    streams' time to first token with restoration on and off, in turn."""
    sys.path.insert(0, str(Path(__file__).parent))
    from harness import BENCH, PY, ROOT, free_port, provider, spawn, stop, wait_for_port

    upstream_port, port = free_port(), free_port()
    config = work / "llms-guardrails.json"
    config.write_text(json.dumps({
        "server": {"host": "127.0.0.1"},
        "providers": {"fake": provider(upstream_port, models={
            "bench-model": "bench-upstream-model", "bench-guarded": "bench-upstream-model"})},
        "guardrails": {"pii": {"detect": ["email", "phone"], "action": "pseudonymize"}},
        "models": {"bench-guarded": {"guardrails": ["pii"]}}}))
    processes = [spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(upstream_port),
                        "--chunks", "20", "--chunk-delay", "0.01"], 1,
                       work / "upstream-guardrails.log")]
    sides = {"none": "bench-model", "pseudonymize": "bench-guarded"}
    try:
        wait_for_port(upstream_port, processes[0])
        processes.append(spawn([PY, "-m", "gateway", "serve", "--config", str(config),
                                "--port", str(port)], 0, work / "gateway-guardrails.log",
                               cwd=ROOT))
        wait_for_port(port, processes[-1])
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        rows, ttft = [], []
        for turn in range(rounds):
            order = list(sides) if turn % 2 == 0 else list(reversed(sides))
            row = {side: measure(url, body(sides[side]), duration) for side in order}
            rows.append({**row, "ratio": row["pseudonymize"] / row["none"]})
            print(f"  guardrails: none {row['none']:,.0f}  pseudonymize "
                  f"{row['pseudonymize']:,.0f} req/s", flush=True)
            ttft.append({side: _ttft_on_core1(url, sides[side], duration, ROOT)
                         for side in order})
    finally:
        for process in processes:
            stop(process)
    return {"clients": CLIENTS, "rounds": rows,
            "ratio_median": statistics.median(r["ratio"] for r in rows),
            "ttft_streams": STREAMS, "ttft_ms": ttft}


def _ttft_on_core1(url: str, model: str, seconds: float, root: Path) -> dict[str, float]:
    output = subprocess.run(["taskset", "-c", "1", sys.executable, __file__, "ttft", url, model,
                             str(seconds)], capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONPATH": str(root)}).stdout
    return dict(json.loads(output))


async def _ttfts(url: str, model: str, seconds: float) -> dict[str, float]:
    """`STREAMS` clients streaming for `seconds`: time to the first event with content."""
    import aiohttp

    times: list[float] = []
    sent = json.dumps(body(model, stream=True))
    end = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < end:
            began = time.monotonic()
            first = None
            async with session.post(url, data=sent,
                                    headers={"Content-Type": "application/json"}) as answer:
                async for line in answer.content:
                    if first is None and b'"content":"' in line:
                        first = time.monotonic() - began
            if first is not None:
                times.append(first)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(STREAMS)))
    times.sort()
    return {"streams": len(times), "p50": round(times[len(times) // 2] * 1000, 2),
            "p99": round(times[int(len(times) * 0.99)] * 1000, 2)}


if __name__ == "__main__":
    if sys.argv[1:2] == ["ttft"]:
        print(json.dumps(asyncio.run(_ttfts(sys.argv[2], sys.argv[3], float(sys.argv[4])))))
    else:
        print(json.dumps(guardrails_cost(), indent=2))
