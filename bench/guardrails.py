"""Guardrails' cost, in-process: the regex tier on an 8 KB prompt (p50/p99 µs), a request body
screened with a pseudonymize policy, and a stream's screening per event (`make bench` part
`guardrails`; `python -m bench.guardrails` alone)."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import msgspec

from gateway.core.settings import GuardrailPolicy
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


if __name__ == "__main__":
    print(json.dumps(guardrails_cost(), indent=2))
