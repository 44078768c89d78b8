"""The pool on GPUs, without GPUs: a fake `vllm` and `nvidia-smi` on PATH stand in for them.

The pool finds 4 "GPUs", groups them by tensor_parallel_size, starts one `vllm serve` per group
pinned with CUDA_VISIBLE_DEVICES, waits for it, balances requests by load and prefix, restarts
what dies and drains before stopping. Every answer names the worker that produced it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fake_gpu import FAKE_VLLM, install_fakes, read_record, wait_for_event
from tests.gateway_process import ROOT, GatewayProcess, config, free_port, provider, wait_until
from tests.pool_helpers import wait_for_workers, workers
from tests.upstream import FakeUpstream

MODEL = "qwen3-8b"
HUB_ID = "Qwen/Qwen3-8B"


def free_ports(count: int) -> int:
    """The first of `count` consecutive free loopback ports."""
    for _ in range(50):
        base = free_port()
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no run of free ports")


def pool_entry(port: int, **model: Any) -> dict[str, Any]:
    return {"type": "pool", "engine": "auto", "port": port, "check_interval": 0.2,
            "restart_backoff": 0.2, "shutdown_grace": 3,
            "models": {MODEL: {"source": HUB_ID, "tensor_parallel_size": 2,
                               "max_model_len": 4096, "enable_prefix_caching": True,
                               "reasoning_parser": "deepseek_r1", **model}}}


class Env:
    """Fake GPUs and vLLM for one gateway, and the file where each fake worker records itself."""

    def __init__(self, tmp: Path, gpus: int = 4, vllm: bool = True, **knobs: str) -> None:
        self.record = tmp / "vllm-record.jsonl"
        self.vars = {**install_fakes(tmp / "bin", gpus=gpus, vllm=vllm),
                     "FAKE_VLLM_RECORD": str(self.record), **knobs}

    def starts(self) -> list[dict[str, Any]]:
        return [e for e in read_record(self.record) if e["event"] == "start"] \
            if self.record.exists() else []


def ask(gateway: GatewayProcess, content: str = "hello", **extra: Any) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions", timeout=20, json={
        "model": MODEL, "messages": [{"role": "user", "content": content}], **extra})


def served_by(response: httpx.Response) -> str:
    """The port of the fake worker that wrote this answer."""
    text = response.json()["choices"][0]["message"]["content"]
    found = re.search(r"port=(\d+)", text)
    assert found, text
    return found.group(1)


@pytest.fixture(scope="module")
def gpu_pool(tmp_path_factory: pytest.TempPathFactory,
             backup: FakeUpstream) -> Iterator[tuple[GatewayProcess, Env, int]]:
    tmp = tmp_path_factory.mktemp("vllm-pool")
    env = Env(tmp)
    port = free_ports(2)
    doc = config({"local": pool_entry(port, args=["--max-num-seqs", "64"]),
                  "backup": provider(backup.base_url, {MODEL: "backup-qwen"})},
                 defaults={"circuit": {"enabled": False}})
    gateway = GatewayProcess(tmp, doc, env=env.vars).start()
    wait_for_workers(gateway, "ready", count=2)
    yield gateway, env, port
    gateway.stop()


def test_one_vllm_per_gpu_group_with_the_exact_command_line(
        gpu_pool: tuple[GatewayProcess, Env, int]) -> None:
    gateway, env, port = gpu_pool
    starts = sorted(env.starts(), key=lambda e: e["port"])[:2]
    assert [s["cuda_visible_devices"] for s in starts] == ["0,1", "2,3"]
    assert [s["port"] for s in starts] == [port, port + 1]
    assert starts[0]["argv"] == [
        "serve", HUB_ID, "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", MODEL, "--tensor-parallel-size", "2", "--max-model-len", "4096",
        "--enable-prefix-caching", "--reasoning-parser", "deepseek_r1",
        "--scheduling-policy", "priority", "--shutdown-timeout", "3", "--max-num-seqs", "64"]
    local = httpx.get(f"{gateway.url}/ready").json()["providers"][0]
    assert local["state"]["engine"] == "vllm"


def test_answers_come_from_the_pool_and_vllm_extras_reach_the_worker(
        gpu_pool: tuple[GatewayProcess, Env, int]) -> None:
    gateway, _, _ = gpu_pool
    answer = ask(gateway, top_k=20, min_p=0.05, repetition_penalty=1.1,
                 chat_template_kwargs={"enable_thinking": False})
    assert answer.status_code == 200 and answer.headers["x-llms-provider"] == "local"
    worker_port = int(served_by(answer))
    seen = httpx.get(f"http://127.0.0.1:{worker_port}/fake/last_request").json()
    assert seen["top_k"] == 20 and seen["repetition_penalty"] == 1.1
    assert seen["chat_template_kwargs"] == {"enable_thinking": False}

    with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=20, json={
            "model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]
    }) as stream:
        body = b"".join(stream.iter_bytes())
    assert b"port=" in body and body.rstrip().endswith(b"data: [DONE]")


def test_the_gateways_priority_reaches_vllm_its_way_round_and_a_body_cannot_jump_it(
        gpu_pool: tuple[GatewayProcess, Env, int]) -> None:
    gateway, _, _ = gpu_pool

    def seen_priority(answer: httpx.Response) -> Any:
        assert answer.status_code == 200, answer.text
        worker = int(served_by(answer))
        return httpx.get(f"http://127.0.0.1:{worker}/fake/last_request").json().get("priority")

    lowered = seen_priority(httpx.post(
        f"{gateway.base_url}/chat/completions", timeout=20, headers={"x-llms-priority": "-3"},
        json={"model": MODEL, "messages": [{"role": "user", "content": "a"}]}))
    # No keys: nobody may raise a request above priority 0, not in the body either.
    jumping = seen_priority(ask(gateway, "b", priority=-100))
    plain = seen_priority(ask(gateway, "c"))

    assert lowered == 3  # vLLM runs the lowest first
    assert jumping == 0
    assert plain is None  # nothing asked: the body goes as it came


def set_load(port: int, **gauges: float) -> None:
    httpx.post(f"http://127.0.0.1:{port}/fake/metrics", json=gauges).raise_for_status()


def wait_scraped(gateway: GatewayProcess, port: int, **load: float) -> None:
    def scraped() -> bool:
        mine = [w for w in workers(gateway) if w["url"].endswith(f":{port}/v1")]
        return bool(mine) and all(mine[0][k] == v for k, v in load.items())

    wait_until(scraped, within=30, what=f"load {load} scraped from {port}")


def test_a_worker_its_metrics_show_as_busy_gets_no_new_requests(
        gpu_pool: tuple[GatewayProcess, Env, int]) -> None:
    gateway, _, port = gpu_pool
    set_load(port, waiting=30, running=64, kv_cache=0.97)
    try:
        wait_scraped(gateway, port, waiting=30)
        ports = {served_by(ask(gateway, f"unrelated question {n}")) for n in range(8)}
        assert ports == {str(port + 1)}
    finally:
        set_load(port)
        wait_scraped(gateway, port, waiting=0)


def test_a_conversation_stays_on_the_worker_holding_its_prefix_until_it_is_overloaded(
        gpu_pool: tuple[GatewayProcess, Env, int]) -> None:
    gateway, _, port = gpu_pool
    first, second = port, port + 1
    system = "You are a meticulous assistant for a chemistry lab. " * 30  # ~1,500 chars
    turn = [{"role": "system", "content": system}, {"role": "user", "content": "Turn one?"}]

    set_load(first, waiting=1)  # turn one lands on the second worker
    wait_scraped(gateway, first, waiting=1)
    reply = httpx.post(f"{gateway.base_url}/chat/completions", json={
        "model": MODEL, "messages": turn}).json()
    assert served_by_json(reply) == str(second)

    set_load(first)
    set_load(second, waiting=1)  # now a little busier than the first: not enough to move
    wait_scraped(gateway, second, waiting=1)
    wait_scraped(gateway, first, waiting=0)
    turn += [reply["choices"][0]["message"], {"role": "user", "content": "Turn two?"}]
    reply = httpx.post(f"{gateway.base_url}/chat/completions", json={
        "model": MODEL, "messages": turn}).json()
    assert served_by_json(reply) == str(second), "the KV cache of turn one is there"
    assert served_by(ask(gateway, "a new, unrelated prompt " * 20)) == str(first)

    set_load(second, waiting=40)  # overloaded: the prefix is not worth the queue
    wait_scraped(gateway, second, waiting=40)
    turn += [reply["choices"][0]["message"], {"role": "user", "content": "Turn three?"}]
    reply = httpx.post(f"{gateway.base_url}/chat/completions", json={
        "model": MODEL, "messages": turn}).json()
    assert served_by_json(reply) == str(first)
    set_load(second)
    wait_scraped(gateway, second, waiting=0)


def served_by_json(reply: dict[str, Any]) -> str:
    found = re.search(r"port=(\d+)", reply["choices"][0]["message"]["content"])
    assert found
    return found.group(1)


def test_vllm_errors_old_and_new_leave_in_our_envelope(
        gpu_pool: tuple[GatewayProcess, Env, int]) -> None:
    gateway, _, _ = gpu_pool
    for shape in ("old", "new"):
        answer = ask(gateway, fake_error=shape)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["type"] == "invalid_request_error" and "fake_error" in error["message"]
        assert set(error) >= {"message", "type", "code", "param"}


def test_a_prompt_too_long_for_vllm_s_window_goes_to_the_next_candidate_and_benches_no_worker(
        gpu_pool: tuple[GatewayProcess, Env, int], backup: FakeUpstream) -> None:
    gateway, _, port = gpu_pool
    backup.reset()
    before = len(gateway.log_events("request"))

    # 5,000 words, over the 4,096-token window (the pool's window is not given as
    # `context_window`, so only the engine can say): vLLM says so itself.
    long = ask(gateway, "word " * 5000)

    assert long.status_code == 200, long.text
    assert long.headers["x-llms-provider"] == "backup"
    lines = gateway.wait_for_log("request", count=before + 1)
    assert lines[-1]["failed"] == ["local:context_length_exceeded"]  # one worker asked, not two
    assert {w["state"] for w in workers(gateway)} == {"ready"}
    assert served_by(ask(gateway)) in (str(port), str(port + 1))


def test_a_killed_worker_restarts_and_the_other_serves_meanwhile(
        gpu_pool: tuple[GatewayProcess, Env, int], backup: FakeUpstream) -> None:
    gateway, env, port = gpu_pool
    before = len(env.starts())
    victim = next(w for w in workers(gateway) if w["url"].endswith(f":{port}/v1"))
    fake_pid = httpx.get(f"http://127.0.0.1:{port}/fake/stats").json()["pid"]
    backup.reset()
    os.kill(fake_pid, signal.SIGKILL)
    answers = [ask(gateway, f"during the restart {n}") for n in range(6)]
    assert all(a.headers["x-llms-provider"] == "local" for a in answers)
    # The other worker serves at once; the restarted one may be back for the last few.
    assert served_by(answers[0]) == str(port + 1)
    wait_for_workers(gateway, "ready", count=2)
    (restarted,) = [w for w in workers(gateway) if w["url"].endswith(f":{port}/v1")]
    assert restarted["restarts"] == victim["restarts"] + 1
    assert len(env.starts()) == before + 1 and env.starts()[-1]["cuda_visible_devices"] == "0,1"


def test_a_loading_pool_fails_over_at_once_and_serves_when_ready(
        tmp_path: Path, backup: FakeUpstream) -> None:
    env = Env(tmp_path, FAKE_VLLM_LOAD_SECONDS="3")
    doc = config({"local": pool_entry(free_ports(2)),
                  "backup": provider(backup.base_url, {MODEL: "backup-qwen"})})
    gateway = GatewayProcess(tmp_path, doc, env=env.vars).start()
    try:
        started = time.monotonic()
        meanwhile = ask(gateway)
        assert meanwhile.headers["x-llms-provider"] == "backup"
        assert time.monotonic() - started < 1.0, "no waiting on a cold pool"
        loading = workers(gateway)
        assert {w["state"] for w in loading} == {"starting"}
        wait_for_workers(gateway, "ready", count=2, timeout=20)
        assert ask(gateway).headers["x-llms-provider"] == "local", "no breaker held it open"
    finally:
        gateway.stop()


def test_a_loading_model_is_a_503_model_loading_and_not_ready_until_it_answers(
        tmp_path: Path) -> None:
    env = Env(tmp_path, FAKE_VLLM_LOAD_SECONDS="3")
    gateway = GatewayProcess(tmp_path, config({"local": pool_entry(free_ports(2))}),
                             env=env.vars).start()
    try:
        loading = ask(gateway)
        ready = httpx.get(f"{gateway.url}/ready")
        assert loading.status_code == 503, loading.text
        assert loading.json()["error"]["code"] == "model_loading"
        assert int(loading.headers["retry-after"]) > 0
        assert ready.status_code == 503 and ready.json()["loading"] == [MODEL]
        wait_for_workers(gateway, "ready", count=2, timeout=20)
        assert httpx.get(f"{gateway.url}/ready").status_code == 200
        assert ask(gateway).status_code == 200
    finally:
        gateway.stop()


def test_a_full_pool_answers_503_overloaded_rather_than_queue_without_bound(
        tmp_path: Path) -> None:
    env = Env(tmp_path)
    entry = {**pool_entry(free_ports(2)), "max_queue": 1}
    gateway = GatewayProcess(tmp_path, config({"local": entry}), env=env.vars).start()
    try:
        wait_for_workers(gateway, "ready", count=2)
        held: list[httpx.Response] = []
        slow = [threading.Thread(target=lambda: held.append(ask(gateway, fake_delay=2.0)))
                for _ in range(2)]
        for thread in slow:
            thread.start()
        wait_until(lambda: sum(w["inflight"] for w in workers(gateway)) == 2)
        refused = ask(gateway)
        for thread in slow:
            thread.join()
    finally:
        gateway.stop()

    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "overloaded"
    # No request has finished yet: the wait is read from how long the held ones have run.
    assert int(refused.headers["retry-after"]) >= 1
    assert [r.status_code for r in held] == [200, 200], "the two held were answered"


def test_an_embedding_model_runs_vllm_s_pooling_runner_and_answers_embeddings(
        tmp_path: Path) -> None:
    env = Env(tmp_path)
    port = free_ports(2)
    entry = pool_entry(port)
    entry["models"] = {"embedder": {"source": "BAAI/bge-m3", "task": "embed",
                                    "tensor_parallel_size": 1, "gpus": [0]}}
    gateway = GatewayProcess(tmp_path, config({"local": entry}), env=env.vars).start()
    try:
        wait_for_workers(gateway, "ready")
        answer = httpx.post(f"{gateway.base_url}/embeddings", timeout=20, json={
            "model": "embedder", "input": ["one two", "three"], "encoding_format": "float"})
    finally:
        gateway.stop()

    (start,) = env.starts()
    assert start["argv"] == [
        "serve", "BAAI/bge-m3", "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", "embedder", "--tensor-parallel-size", "1",
        "--runner", "pooling", "--shutdown-timeout", "3"]
    assert answer.status_code == 200, answer.text
    assert [len(d["embedding"]) for d in answer.json()["data"]] == [16, 16]
    assert answer.headers["x-llms-provider"] == "local"


def test_a_rerank_model_runs_vllm_s_pooling_runner_and_answers_rerank(tmp_path: Path) -> None:
    env = Env(tmp_path)
    port = free_ports(2)
    entry = pool_entry(port)
    entry["models"] = {"reranker": {"source": "BAAI/bge-reranker-v2-m3", "task": "rerank",
                                    "tensor_parallel_size": 1, "gpus": [0]}}
    gateway = GatewayProcess(tmp_path, config({"local": entry}), env=env.vars).start()
    try:
        wait_for_workers(gateway, "ready")
        answer = httpx.post(f"{gateway.base_url}/rerank", timeout=20, json={
            "model": "reranker", "query": "red apple",
            "documents": ["a green pear", "a red apple", "red wine"], "top_n": 2})
    finally:
        gateway.stop()

    (start,) = env.starts()
    assert start["argv"] == [
        "serve", "BAAI/bge-reranker-v2-m3", "--host", "127.0.0.1", "--port", str(port),
        "--served-model-name", "reranker", "--tensor-parallel-size", "1",
        "--runner", "pooling", "--shutdown-timeout", "3"]
    assert answer.status_code == 200, answer.text
    assert [r["index"] for r in answer.json()["results"]] == [1, 2]
    assert answer.headers["x-llms-provider"] == "local"


def test_check_asks_the_running_gateway_for_its_pool(tmp_path: Path) -> None:
    env = Env(tmp_path)
    doc = config({"local": pool_entry(free_ports(2))})
    gateway = GatewayProcess(tmp_path, doc, env=env.vars)
    doc["server"]["port"] = gateway.port  # `check` reads where the gateway listens from here
    gateway.write_config(doc)
    gateway.start()

    def check() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "gateway", "check", "--config",
                               str(gateway.config_path)], capture_output=True, text=True,
                              timeout=60, env={**os.environ, **env.vars}, cwd=ROOT)

    try:
        wait_for_workers(gateway, "ready", count=2)
        running = check()
    finally:
        gateway.stop()
    stopped = check()

    assert running.returncode == 0, running.stdout + running.stderr
    assert f"local          {MODEL}" in running.stdout and "ok" in running.stdout
    assert stopped.returncode == 1
    assert "no gateway answers" in stopped.stdout


def test_shutdown_drains_in_flight_requests_before_stopping_workers(tmp_path: Path) -> None:
    env = Env(tmp_path)
    gateway = GatewayProcess(tmp_path, config({"local": pool_entry(free_ports(2))}),
                             env=env.vars).start()
    wait_for_workers(gateway, "ready", count=2)
    outcome: dict[str, httpx.Response] = {}
    slow = threading.Thread(target=lambda: outcome.setdefault("r", ask(gateway, fake_delay=1.5)))
    slow.start()
    wait_until(lambda: sum(w["inflight"] for w in workers(gateway)) == 1,
               what="the slow request held by a worker")
    gateway.stop()
    slow.join()
    assert outcome["r"].status_code == 200, "the in-flight answer was finished"
    terms = [e for e in read_record(env.record) if e["event"] == "sigterm"]
    assert len(terms) == 2 and all(t["inflight"] == 0 for t in terms)
    wait_for_event(env.record, "exit", count=2)


def test_remote_workers_are_balanced_and_never_spawned(tmp_path: Path,
                                                       backup: FakeUpstream) -> None:
    env = Env(tmp_path, gpus=0)
    remote_port = free_port()
    remote = subprocess.Popen(
        [sys.executable, str(FAKE_VLLM), "serve", HUB_ID, "--host", "127.0.0.1", "--port",
         str(remote_port), "--served-model-name", MODEL],
        env={**os.environ, **env.vars, "CUDA_VISIBLE_DEVICES": "0"})
    try:
        doc = config({"local": {"type": "pool", "check_interval": 0.2, "models": {MODEL: MODEL},
                                "workers": [f"http://127.0.0.1:{remote_port}"]},
                      "backup": provider(backup.base_url, {MODEL: "backup-qwen"})},
                     defaults={"circuit": {"enabled": False}})
        gateway = GatewayProcess(tmp_path, doc, env=env.vars).start()
        (worker,) = wait_for_workers(gateway, "ready")
        assert worker["spawned"] is False and worker["models"] == [MODEL]
        assert served_by(ask(gateway)) == str(remote_port)
        remote.kill()
        remote.wait()
        assert ask(gateway).headers["x-llms-provider"] == "backup"
        assert len(env.starts()) == 1, "the pool never starts a remote worker"
        gateway.stop()
    finally:
        remote.kill()


def test_with_two_gateway_processes_only_one_spawns_the_workers(tmp_path: Path) -> None:
    env = Env(tmp_path)
    doc = config({"local": pool_entry(free_ports(2))})
    gateway = GatewayProcess(tmp_path, doc, env=env.vars, extra_args=("--workers", "2")).start()
    try:
        wait_for_event(env.record, "ready", count=2)
        gateway.wait_for_log("worker_ready", count=4, timeout=60)  # both workers, seen by both
        assert len(gateway.log_events("pool_following")) == 2, "the second process follows"
        assert len(env.starts()) == 2, "one vllm per GPU group, not per gateway process"
        assert all(ask(gateway, f"q{n}").headers["x-llms-provider"] == "local" for n in range(6))
    finally:
        gateway.stop()


def test_without_an_engine_the_pool_steps_aside_with_one_log_line(
        tmp_path: Path, backup: FakeUpstream) -> None:
    env = Env(tmp_path, gpus=0, vllm=False)
    doc = config({"local": {**pool_entry(free_port()), "engine": "vllm"},
                  "backup": provider(backup.base_url, {MODEL: "backup-qwen"})})
    gateway = GatewayProcess(tmp_path, doc, env=env.vars).start()
    try:
        local = httpx.get(f"{gateway.url}/ready").json()["providers"][0]
        assert local["enabled"] is False and "vllm" in local["reason"]
        assert ask(gateway).headers["x-llms-provider"] == "backup"
        lines = [e for e in gateway.log_events("provider_disabled") if e["provider"] == "local"]
        assert len(lines) == 1
    finally:
        gateway.stop()


def test_ls_shows_every_worker_of_the_running_gateway(
        gpu_pool: tuple[GatewayProcess, Env, int]) -> None:
    gateway, env, port = gpu_pool
    doc = json.loads(gateway.config_path.read_text())
    doc["server"]["port"] = gateway.port  # `ls` finds the gateway where the config says
    mine = gateway.workdir / "ls.json"
    mine.write_text(json.dumps(doc))
    out = subprocess.run([sys.executable, "-m", "gateway", "ls", "--config", str(mine)],
                         capture_output=True, text=True, env={**os.environ, **env.vars},
                         check=True).stdout
    assert re.search(rf"worker local-0 +ready .*127.0.0.1:{port}/v1", out), out
    assert re.search(rf"worker local-1 +ready .*127.0.0.1:{port + 1}/v1", out), out
    # Spawned here, so its load time is known: said apart from its time in state.
    assert re.search(r"worker local-0 +ready for [\d.hms]+, loaded in \d+\.\ds ", out), out


def test_a_worker_that_dies_while_loading_says_why_and_is_retried(tmp_path: Path,
                                                                  backup: FakeUpstream) -> None:
    env = Env(tmp_path, FAKE_VLLM_EXIT_AT_START="1")
    doc = config({"local": pool_entry(free_ports(2)),
                  "backup": provider(backup.base_url, {MODEL: "backup-qwen"})})
    gateway = GatewayProcess(tmp_path, doc, env=env.vars).start()
    try:
        failed = gateway.wait_for_log("worker_failed", count=2, timeout=10)
        assert "exited while loading (code 1)" in failed[0]["reason"]
        assert "Hugging Face id" in failed[0]["reason"], "offline users learn what to change"
        assert ask(gateway).headers["x-llms-provider"] == "backup"
        gateway.wait_for_log("worker_restarting", count=2, timeout=10)
    finally:
        gateway.stop()


def pids(gateway: GatewayProcess) -> dict[str, int]:
    return {w["name"]: w["pid"] for w in workers(gateway)}


def test_an_alias_a_price_and_a_limit_added_to_the_pool_apply_live_without_a_restart(
        tmp_path: Path) -> None:
    """Reloading a vLLM model takes minutes: a one-line edit that changes nothing a worker
    runs keeps every worker, and the new alias is served by the running one at once."""
    env = Env(tmp_path)
    entry = pool_entry(free_ports(2))
    gateway = GatewayProcess(tmp_path, config({"local": entry}), env=env.vars).start()
    try:
        wait_for_workers(gateway, "ready", count=2)
        before = pids(gateway)
        edited = {**entry, "max_queue": 1,
                  "models": {MODEL: {**entry["models"][MODEL],
                                     "price": {"input": 1000.0, "output": 1000.0}},
                             "qwen": MODEL}}
        gateway.write_config(config({"local": edited}))
        gateway.wait_for_log("config_reloaded")

        answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=20, json={
            "model": "qwen", "messages": [{"role": "user", "content": "hi"}]})
        priced = ask(gateway)
        after = pids(gateway)
        stopped = gateway.log_events("pool_stopped")
    finally:
        gateway.stop()

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-llms-provider"] == "local" and "port=" in answer.text
    assert float(priced.headers["x-llms-cost"]) > 0, "the new price is in force"
    assert after == before, "the same worker processes serve on"
    assert len(env.starts()) == 2, "no worker was started again"
    assert stopped == [], "the pool was not closed"


def test_a_change_to_what_a_worker_runs_restarts_it(tmp_path: Path) -> None:
    env = Env(tmp_path)
    entry = pool_entry(free_ports(2))
    gateway = GatewayProcess(tmp_path, config({"local": entry}), env=env.vars).start()
    try:
        wait_for_workers(gateway, "ready", count=2)
        before = pids(gateway)
        edited = {**entry, "models": {MODEL: {**entry["models"][MODEL],
                                              "max_model_len": 8192}}}
        gateway.write_config(config({"local": edited}))
        gateway.wait_for_log("pool_stopped")
        wait_until(lambda: len(env.starts()) == 4, within=20)
        wait_for_workers(gateway, "ready", count=2)
        after = pids(gateway)
        answer = ask(gateway)
    finally:
        gateway.stop()

    assert answer.status_code == 200, answer.text
    assert not set(after.values()) & set(before.values()), "every worker was restarted"
    assert all("8192" in start["argv"] for start in env.starts()[2:]), "with the new length"
