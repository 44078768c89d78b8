"""Self-tests of the fake `vllm serve` and `nvidia-smi`, through real processes and sockets."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fake_gpu import FAKE_VLLM, install_fakes, read_record, wait_for_event
from tests.upstream import free_port
from tests.waiting import wait_until

GAUGE_LINE = re.compile(r'^(vllm:\w+)\{engine="0",model_name="([^"]*)"\} (\S+)$', re.MULTILINE)
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
          "vllm:gpu_cache_usage_perc")
CHAT = {"messages": [{"role": "user", "content": "Hello"}]}


@dataclass
class Worker:
    """A fake vLLM process the test spawned, on its own port."""

    proc: subprocess.Popen[bytes]
    port: int
    argv: list[str]
    log: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def post(self, body: dict[str, Any], path: str = "/v1/chat/completions") -> httpx.Response:
        return httpx.post(self.url(path), json={**CHAT, **body}, timeout=15)

    def gauges(self) -> dict[str, float]:
        """The vllm:* gauges of /metrics, by name (checking the model_name label on the way)."""
        text = httpx.get(self.url("/metrics"), timeout=5).text
        return {name: float(value) for name, model, value in GAUGE_LINE.findall(text)
                if model == "m" and name in GAUGES}

    def stats(self) -> dict[str, Any]:
        return dict(httpx.get(self.url("/fake/stats"), timeout=5).json())


def child_env(devices: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with CUDA_VISIBLE_DEVICES set (or removed) and `extra` on top."""
    env = {k: v for k, v in os.environ.items()
           if k != "CUDA_VISIBLE_DEVICES" and not k.startswith("FAKE_")}
    if devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = devices
    return {**env, **(extra or {})}


def healthy(worker: Worker) -> bool:
    if worker.proc.poll() is not None:
        raise AssertionError(f"fake vllm exited {worker.proc.returncode}: "
                             f"{worker.log.read_text()}")
    try:
        return httpx.get(worker.url("/health"), timeout=1).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Start fake workers (`serve /models/x --host 127.0.0.1 --port P *options`); killed after."""
    started: list[Worker] = []

    def start(*options: str, devices: str | None = "0", env: dict[str, str] | None = None,
              command: list[str] | None = None, wait: bool = True) -> Worker:
        port = free_port()
        argv = ["serve", "/models/x", "--host", "127.0.0.1", "--port", str(port), *options]
        log = tmp_path / f"vllm-{port}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen([*(command or [sys.executable, str(FAKE_VLLM)]), *argv],
                                    stdout=out, stderr=subprocess.STDOUT,
                                    env=child_env(devices, env))
        worker = Worker(proc, port, argv, log)
        started.append(worker)
        if wait:
            wait_until(lambda: healthy(worker), within=30)
        return worker

    yield start
    for worker in started:
        if worker.proc.poll() is None:
            worker.proc.kill()
        worker.proc.wait(5)


def run_fake(argv: list[str], devices: str | None = "0",
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the fake to completion (for command lines that must fail at start)."""
    return subprocess.run([sys.executable, str(FAKE_VLLM), *argv], capture_output=True,
                          text=True, timeout=10, env=child_env(devices, env), check=False)


def sse_events(response: httpx.Response) -> list[str]:
    """The `data:` payloads of an SSE body, in order."""
    return [line[len("data: "):] for line in response.text.split("\n") if line.startswith("data: ")]


# -- the command line and startup ----------------------------------------------------------


def test_realistic_command_line_serves_chat_stream_and_metrics(
        tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    env = install_fakes(tmp_path / "bin")
    vllm = shutil.which("vllm", path=env["PATH"])
    assert vllm == str(tmp_path / "bin" / "vllm")
    record = tmp_path / "record.jsonl"
    worker = spawn("--served-model-name", "m", "--tensor-parallel-size", "2",
                   "--max-model-len", "4096", "--gpu-memory-utilization", "0.9",
                   "--enable-prefix-caching", "--reasoning-parser", "deepseek_r1",
                   "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                   "--shutdown-timeout", "5", devices="0,1", command=[vllm],
                   env={**env, "FAKE_VLLM_RECORD": str(record)})
    prefix = f"fake-vllm port={worker.port} devices=0,1 model=m "

    models = httpx.get(worker.url("/v1/models")).json()
    assert [(m["id"], m["owned_by"], m["max_model_len"]) for m in models["data"]] == [
        ("m", "vllm", 4096)]

    client = openai.OpenAI(base_url=worker.url("/v1"), api_key="unused", max_retries=0)
    extras = {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1,
              "chat_template_kwargs": {"enable_thinking": False}}
    chat = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                          extra_body=extras)
    assert (chat.choices[0].message.content or "").startswith(prefix)
    assert httpx.get(worker.url("/fake/last_request")).json()["top_k"] == 5

    stream = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "Hi"}],
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith(prefix) and len(chunks) > 5
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    raw = worker.post({"model": "m", "prompt": "Hi", "stream": True}, "/v1/completions")
    assert sse_events(raw)[-1] == "[DONE]"
    assert json.loads(sse_events(raw)[1])["choices"][0]["text"] == "fake-vllm"

    assert worker.gauges() == {"vllm:num_requests_running": 0.0, "vllm:num_requests_waiting": 0.0,
                               "vllm:kv_cache_usage_perc": 0.0, "vllm:gpu_cache_usage_perc": 0.0}
    assert worker.stats()["served"] == 3

    start, ready = wait_for_event(record, "start")[0], wait_for_event(record, "ready")[0]
    assert start["argv"] == worker.argv and start["served"] == ["m"]
    assert start["cuda_visible_devices"] == "0,1" and start["port"] == worker.port
    # The wrapper `exec`s: the pid a supervisor spawned is the fake's own, for kill -9 tests.
    assert start["pid"] == ready["pid"] == worker.proc.pid == worker.stats()["pid"]


def test_error_shapes_old_and_new(spawn: Callable[..., Worker]) -> None:
    worker = spawn("--served-model-name", "m", "m-alias")
    missing = worker.post({"model": "nope"})
    assert missing.status_code == 404
    assert missing.json() == {"error": {"message": "The model `nope` does not exist.",
                                        "type": "NotFoundError", "param": None, "code": 404}}
    old = worker.post({"model": "m", "fake_error": "old"})
    assert old.status_code == 400
    assert old.json() | {"message": ""} == {"object": "error", "message": "",
                                            "type": "BadRequestError", "param": None, "code": 400}
    assert worker.post({"model": "m-alias"}).status_code == 200
    assert worker.post({}).json()["model"] == "m"  # no model: the first served name


def test_a_final_assistant_message_is_continued_when_told_and_a_cut_drops_the_stream(
        spawn: Callable[..., Worker]) -> None:
    worker = spawn("--served-model-name", "m", env={"FAKE_VLLM_ANSWER": "one two three four"})
    partial = {"messages": [*CHAT["messages"], {"role": "assistant", "content": "one two"}]}

    continued = worker.post({**partial, "continue_final_message": True,
                             "add_generation_prompt": False})
    assert continued.json()["choices"][0]["message"]["content"] == " three four"
    assert worker.post(partial).json()["choices"][0]["message"]["content"] == \
        "one two three four", "without it, a new turn: the answer from its start"
    both = worker.post({**partial, "continue_final_message": True, "add_generation_prompt": True})
    assert both.status_code == 400 and "Cannot set both" in both.json()["error"]["message"]

    httpx.post(worker.url("/fake/fault"), json={"cut_after": 2}).raise_for_status()
    with pytest.raises(httpx.RemoteProtocolError):
        worker.post({"stream": True})
    assert worker.post({"stream": True}).text.rstrip().endswith("data: [DONE]"), "one cut only"


@pytest.mark.parametrize(("argv", "devices", "env", "code", "says"), [
    (["serve", "m", "--bogus-flag"], "0", {}, 2, "unrecognized arguments: --bogus-flag"),
    (["serve", "m", "--tensor-parallel-size", "2"], "0", {}, 1,
     "tensor_parallel_size (2) x pipeline_parallel_size (1)) is larger than the number of "
     "available GPUs (1)"),
    (["serve", "m"], None, {}, 1, "No CUDA GPUs are available"),
    (["serve", "m"], "0", {"FAKE_VLLM_EXIT_AT_START": "3"}, 3, "FAKE_VLLM_EXIT_AT_START=3"),
], ids=["unknown-flag", "tp-too-large", "no-devices", "exit-at-start"])
def test_bad_starts_exit_like_vllm(tmp_path: Path, argv: list[str], devices: str | None,
                                   env: dict[str, str], code: int, says: str) -> None:
    record = tmp_path / "record.jsonl"
    done = run_fake(argv, devices, {**env, "FAKE_VLLM_RECORD": str(record)})
    assert done.returncode == code
    assert says in done.stderr
    if code != 2:  # parsed: the start and the failure are recorded
        assert [e["event"] for e in read_record(record)] == ["start", "fail"]


def test_loading_refuses_connections_then_the_port_is_taken(tmp_path: Path,
                                                        spawn: Callable[..., Worker]) -> None:
    record = tmp_path / "record.jsonl"
    worker = spawn(env={"FAKE_VLLM_LOAD_SECONDS": "0.6", "FAKE_VLLM_RECORD": str(record)},
                   wait=False)
    wait_for_event(record, "start")
    with pytest.raises(httpx.ConnectError):
        httpx.get(worker.url("/health"))
    wait_until(lambda: healthy(worker), within=30)
    assert "Loading model weights" in worker.log.read_text()
    taken = run_fake(["serve", "m", "--host", "127.0.0.1", "--port", str(worker.port)])
    assert taken.returncode == 1 and "Address already in use" in taken.stderr
    wait_for_event(record, "ready", port=worker.port)


# -- batching and metrics ----------------------------------------------------------------


def test_metrics_follow_held_requests_and_overrides(spawn: Callable[..., Worker]) -> None:
    worker = spawn("--max-num-seqs", "1", "--served-model-name", "m")
    with ThreadPoolExecutor(2) as pool:
        held = [pool.submit(worker.post, {"fake_delay": 1.5}) for _ in range(2)]
        wait_until(lambda: worker.gauges()["vllm:num_requests_waiting"] == 1, within=30)
        assert worker.gauges() == {
            "vllm:num_requests_running": 1.0, "vllm:num_requests_waiting": 1.0,
            "vllm:kv_cache_usage_perc": 1.0, "vllm:gpu_cache_usage_perc": 1.0}
        assert worker.stats()["inflight"] == 2
        assert [future.result().status_code for future in held] == [200, 200]
    assert worker.stats() | {"pid": 0} == {"served": 2, "inflight": 0, "running": 0,
                                           "waiting": 0, "pid": 0, "port": worker.port}

    busy = httpx.post(worker.url("/fake/metrics"), json={"running": 7, "kv_cache": 0.5})
    assert busy.status_code == 200
    assert worker.gauges() == {"vllm:num_requests_running": 7.0,
                               "vllm:num_requests_waiting": 0.0,
                               "vllm:kv_cache_usage_perc": 0.5, "vllm:gpu_cache_usage_perc": 0.5}
    httpx.post(worker.url("/fake/metrics"), json={})
    assert set(worker.gauges().values()) == {0.0}
    assert httpx.post(worker.url("/fake/metrics"), json={"bogus": 1}).status_code == 400


# -- shutdown ------------------------------------------------------------------------------


def test_sigterm_drains_in_flight_request_then_exits_zero(tmp_path: Path,
                                                         spawn: Callable[..., Worker]) -> None:
    record = tmp_path / "record.jsonl"
    worker = spawn("--shutdown-timeout", "5", env={"FAKE_VLLM_RECORD": str(record)})
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(worker.post, {"fake_delay": 0.8, "stream": True})
        wait_until(lambda: worker.stats()["inflight"] == 1, within=30)
        worker.proc.send_signal(signal.SIGTERM)
        wait_for_event(record, "sigterm")
        late = worker.post({})
        assert late.status_code == 503
        assert late.json()["error"]["type"] == "ServiceUnavailableError"
        assert httpx.get(worker.url("/health")).status_code == 503
        answer = held.result()
    assert answer.status_code == 200 and sse_events(answer)[-1] == "[DONE]"
    assert worker.proc.wait(5) == 0
    events = read_record(record)
    assert [e["event"] for e in events] == ["start", "ready", "sigterm", "exit"]
    assert events[2]["inflight"] == 1
    assert "Shutting down" in worker.log.read_text()


def test_requests_past_shutdown_timeout_are_aborted(spawn: Callable[..., Worker]) -> None:
    worker = spawn("--shutdown-timeout", "0.3")
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(worker.post, {"fake_delay": 30})
        wait_until(lambda: worker.stats()["inflight"] == 1, within=30)
        began = time.monotonic()
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.proc.wait(5) == 0
        assert time.monotonic() - began < 3
        with pytest.raises(httpx.TransportError):
            held.result()


def test_ignore_sigterm_knob_leaves_sigkill(tmp_path: Path, spawn: Callable[..., Worker]) -> None:
    record = tmp_path / "record.jsonl"
    worker = spawn(env={"FAKE_VLLM_IGNORE_SIGTERM": "1", "FAKE_VLLM_RECORD": str(record)})
    worker.proc.send_signal(signal.SIGTERM)
    assert wait_for_event(record, "sigterm")[0]["ignored"] is True
    assert healthy(worker)
    worker.proc.kill()
    assert worker.proc.wait(5) == -signal.SIGKILL


# -- nvidia-smi and the helpers ----------------------------------------------------------------


def smi(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run `nvidia-smi` as a discoverer would: found on PATH."""
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=10,
                          env={**os.environ, **env}, check=False)


def test_fake_nvidia_smi_with_four_gpus(tmp_path: Path) -> None:
    env = install_fakes(tmp_path / "bin", gpus=4)
    done = smi(env, "--query-gpu=index,uuid,name,memory.total",
               "--format=csv,noheader,nounits")
    assert done.returncode == 0
    rows = [line.split(", ") for line in done.stdout.splitlines()]
    assert [row[0] for row in rows] == ["0", "1", "2", "3"]
    assert all(row[2:] == ["NVIDIA H100 80GB HBM3", "81559"] for row in rows)
    assert len({row[1] for row in rows}) == 4 and rows[0][1].startswith("GPU-")

    with_units = smi(env, "--query-gpu=memory.total,index", "--format=csv").stdout.splitlines()
    assert with_units[:2] == ["memory.total [MiB], index", "81559 MiB, 0"]
    listing = smi(env, "-L").stdout.splitlines()
    assert len(listing) == 4
    assert re.fullmatch(r"GPU 0: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]+\)", listing[0])
    assert f"(UUID: {rows[2][1]})" in listing[2]
    assert smi(env, "--query-gpu=bogus", "--format=csv").returncode == 2


def test_fake_nvidia_smi_without_gpus_and_without_vllm(tmp_path: Path) -> None:
    env = install_fakes(tmp_path / "bin", gpus=0, vllm=False)
    for args in (["-L"], ["--query-gpu=index", "--format=csv,noheader"]):
        done = smi(env, *args)
        assert (done.returncode, done.stdout.strip()) == (6, "No devices were found")
    assert not (tmp_path / "bin" / "vllm").exists()


def test_wait_for_event_times_out_naming_what_it_saw(tmp_path: Path) -> None:
    record = tmp_path / "record.jsonl"
    assert read_record(record) == []
    record.write_text('{"event": "start", "pid": 1}\n{"event": "ready", "pi')  # half a line
    assert read_record(record) == [{"event": "start", "pid": 1}]
    assert wait_for_event(record, "start", pid=1) == [{"event": "start", "pid": 1}]
    with pytest.raises(TimeoutError, match="'ready'"):
        wait_for_event(record, "ready", timeout=0.1)
