"""Which CUDA GPUs this machine has (NVML, else `nvidia-smi`), and how workers split them.

Discovery is the only I/O here and runs once per pool start; grouping is pure.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    name: str


async def discover() -> tuple[Gpu, ...]:
    """The machine's GPUs: NVML when `nvidia-ml-py` is installed, else `nvidia-smi`, else none."""
    found = _from_nvml()
    if found is not None:
        return found
    return await _from_nvidia_smi()


def _from_nvml() -> tuple[Gpu, ...] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None  # a driver-less machine with the package installed
    try:
        count = pynvml.nvmlDeviceGetCount()
        return tuple(Gpu(i, str(pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))))
                     for i in range(count))
    finally:
        pynvml.nvmlShutdown()


async def _from_nvidia_smi() -> tuple[Gpu, ...]:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return ()
    try:
        process = await asyncio.create_subprocess_exec(
            tool, "--query-gpu=index,name", "--format=csv,noheader",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        async with asyncio.timeout(10):
            out, _ = await process.communicate()
    except (OSError, TimeoutError):
        return ()
    return parse_query(out.decode("utf-8", "replace")) if process.returncode == 0 else ()


def parse_query(text: str) -> tuple[Gpu, ...]:
    """Rows of `index, name` as `nvidia-smi --query-gpu=index,name --format=csv,noheader` prints."""
    gpus = []
    for line in text.splitlines():
        index, _, name = line.partition(",")
        if index.strip().isdigit():
            gpus.append(Gpu(int(index), name.strip()))
    return tuple(gpus)


def select(available: Sequence[Gpu], wanted: Literal["all"] | Sequence[int]) -> tuple[int, ...]:
    """The GPU indices to use; ValueError when `wanted` names one the machine lacks."""
    have = [gpu.index for gpu in available]
    if wanted == "all":
        return tuple(have)
    missing = sorted(set(wanted) - set(have))
    if missing:
        raise ValueError(f"gpus: {missing} not found (this machine has {have or 'none'})")
    return tuple(wanted)


def groups(indices: Sequence[int], tensor_parallel_size: int) -> list[tuple[int, ...]]:
    """Consecutive groups of `tensor_parallel_size` GPUs, one worker each; leftovers unused."""
    size = tensor_parallel_size
    return [tuple(indices[i:i + size]) for i in range(0, len(indices) - size + 1, size)]
