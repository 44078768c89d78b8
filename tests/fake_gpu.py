"""Put the fake `vllm` and `nvidia-smi` on PATH for a test, and read what the fake workers did.

    env = install_fakes(tmp_path / "bin", gpus=4)   # {"PATH": "<tmp>/bin:<old PATH>"}
    monkeypatch.setenv("PATH", env["PATH"])          # or pass {**os.environ, **env} to a child
    ... start the gateway with FAKE_VLLM_RECORD=<file>, then wait_for_event(file, "ready", 2)
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FAKE_VLLM = HERE / "fake_vllm.py"
FAKE_NVIDIA_SMI = HERE / "fake_nvidia_smi.py"


def _write_wrapper(path: Path, script: Path, env: dict[str, str] | None = None) -> None:
    """An executable sh script that `exec`s the fake, so the spawned pid is the fake's own."""
    exports = "".join(f"export {key}={shlex.quote(value)}\n" for key, value in (env or {}).items())
    path.write_text(f"#!/bin/sh\n{exports}exec {shlex.quote(sys.executable)} "
                    f'{shlex.quote(str(script))} "$@"\n')
    path.chmod(0o755)


def install_fakes(bin_dir: Path, gpus: int = 4, vllm: bool = True) -> dict[str, str]:
    """Write `bin_dir/nvidia-smi` (seeing `gpus` GPUs) and `bin_dir/vllm`; the env to use them."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    _write_wrapper(bin_dir / "nvidia-smi", FAKE_NVIDIA_SMI, {"FAKE_GPU_COUNT": str(gpus)})
    if vllm:
        _write_wrapper(bin_dir / "vllm", FAKE_VLLM)
    else:
        (bin_dir / "vllm").unlink(missing_ok=True)  # a test of "vLLM is not installed"
    return {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}


def read_record(path: Path | str) -> list[dict[str, Any]]:
    """The events in a FAKE_VLLM_RECORD file, oldest first ([] if none yet)."""
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    # Each event is one write(); a line without its newline is still being written.
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


def wait_for_event(path: Path | str, event: str, count: int = 1, timeout: float = 10,
                   **match: Any) -> list[dict[str, Any]]:
    """The first `count` events named `event` (and with fields equal to `match`), once recorded."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in read_record(path)
                 if e.get("event") == event and all(e.get(k) == v for k, v in match.items())]
        if len(found) >= count:
            return found[:count]
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} {event!r} event(s) matching {match} not recorded in "
                               f"{timeout}s; the record: {read_record(path)}")
        time.sleep(0.02)
