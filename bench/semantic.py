"""The semantic part: a semantic cache hit against an exact cache hit, req/s and p50 latency, on
the same gateway, in alternating rounds.

One gateway on core 0 with two aliases over the same chat upstream: `exact-model` keeps answers
in the exact cache (`cache.ttl`), `semantic-model` in the semantic cache, its questions embedded
by an `embedder` alias served by the tests' fake upstream (`tests/upstream.py`, whose embeddings
place paraphrases close), run as a process of its own on core 1 beside the chat upstream and the
load generator. Each alias is asked once to fill its cache; then the exact alias is sent that
same body, the semantic one a paraphrase of it (similarity 0.82, over the 0.8 threshold): every
measured request is a hit. A semantic hit pays an embedding call upstream and a comparison with
each question of its partition (one here): the ratio is that cost.
"""

from __future__ import annotations

import json
import statistics
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import BENCH, PY, ROOT, free_port, provider, spawn, stop, wait_for_port

CLIENTS = 10
QUESTION = "What is the capital of France?"
PARAPHRASE = "capital city of France"  # no quote: wrk's script holds the body in one


def body(model: str, question: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": question}],
            "max_tokens": 16}


def _config(path: Path, chat_port: int, embed_port: int) -> None:
    models = {"exact-model": "bench-upstream-model", "semantic-model": "bench-upstream-model"}
    semantic = {"embedding_alias": "embedder", "threshold": 0.8, "ttl": 3600}
    path.write_text(json.dumps({
        "server": {"host": "127.0.0.1"},
        "providers": {
            "fake": provider(chat_port, models=models),
            "embed": {"type": "openai", "base_url": f"http://127.0.0.1:{embed_port}/v1",
                      "api_key": "bench-key", "models": {"embedder": "bench-embedder"}}},
        "models": {"exact-model": {"cache": {"ttl": 3600}},
                   "semantic-model": {"cache": {"semantic": semantic}}},
    }))


def _ask(url: str, sent: dict[str, Any]) -> str:
    """One request; its `x-llms-cache` header (empty on a miss)."""
    request = urllib.request.Request(url, data=json.dumps(sent).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()
        return str(answer.headers.get("x-llms-cache", ""))


def semantic_cost(work: Path, duration: float, rounds: int,
                  measure: Callable[[str, dict[str, Any], float], Any]) -> dict[str, Any]:
    """`rounds` of exact and semantic hits in turn; `measure(url, body, seconds)` gives a
    measurement with `rps` and `p50_ms`."""
    chat_port, embed_port, port = free_port(), free_port(), free_port()
    config = work / "llms-semantic.json"
    _config(config, chat_port, embed_port)
    processes = [spawn([PY, str(BENCH / "fake_upstream.py"), "--port", str(chat_port)], 1,
                       work / "upstream-semantic.log"),
                 spawn([PY, str(Path(__file__)), str(embed_port)], 1, work / "embedder.log")]
    try:
        wait_for_port(chat_port, processes[0])
        wait_for_port(embed_port, processes[1])
        processes.append(spawn([PY, "-m", "gateway", "serve", "--config", str(config),
                                "--port", str(port)], 0, work / "gateway-semantic.log",
                               cwd=ROOT))
        wait_for_port(port, processes[-1])
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        sides = {"exact": body("exact-model", QUESTION),
                 "semantic": body("semantic-model", PARAPHRASE)}
        _ask(url, sides["exact"])
        _ask(url, body("semantic-model", QUESTION))
        served = {side: _ask(url, sent) for side, sent in sides.items()}
        if served != {"exact": "hit", "semantic": "semantic"}:
            raise SystemExit(f"bench/semantic.py: the measured requests are not hits: {served}")
        rows = []
        for turn in range(rounds):
            order = list(sides) if turn % 2 == 0 else list(reversed(sides))
            measured = {side: measure(url, sides[side], duration) for side in order}
            row = {**{side: m.rps for side, m in measured.items()},
                   **{f"{side}_p50_ms": m.p50_ms for side, m in measured.items()}}
            rows.append({**row, "ratio": row["semantic"] / row["exact"],
                         "p50_ratio": row["semantic_p50_ms"] / row["exact_p50_ms"]})
            print(f"  semantic: exact hits {row['exact']:,.0f} req/s (p50 "
                  f"{row['exact_p50_ms']:.2f} ms), semantic hits {row['semantic']:,.0f} req/s "
                  f"(p50 {row['semantic_p50_ms']:.2f} ms)", flush=True)
    finally:
        for process in processes:
            stop(process)
    return {"rounds": rows, "clients": CLIENTS,
            "ratio_median": statistics.median(r["ratio"] for r in rows),
            "p50_ratio_median": statistics.median(r["p50_ratio"] for r in rows)}


def rows(data: dict[str, Any] | None) -> list[tuple[str, str, str, bool | None]]:
    """The comparison, as `run.figures` lists them."""
    what = "a semantic cache hit against an exact cache hit"
    if data is None:
        return [(what, "none: the cost, reported", "not measured", None)]
    ratios = sorted(r["ratio"] for r in data["rounds"])
    latency = sorted(r["p50_ratio"] for r in data["rounds"])
    return [(f"{what} (non-streaming, {data['clients']} clients; the embedding is one call to a "
             "local fake)", "none: the cost, reported",
             f"{data['ratio_median']:.2f}x the req/s ({', '.join(f'{r:.2f}' for r in ratios)}); "
             f"p50 latency {data['p50_ratio_median']:.2f}x "
             f"({', '.join(f'{r:.2f}' for r in latency)}); medians of {len(ratios)} rounds",
             None)]


def embedder(port: int) -> None:
    """The tests' fake upstream on `port`, its embeddings placing paraphrases close."""
    sys.path.insert(0, str(ROOT))
    from tests.upstream import FakeUpstream

    FakeUpstream(name="embedder", port=port, paraphrases=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    embedder(int(sys.argv[1]))
