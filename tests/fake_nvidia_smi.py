"""A stand-in for `nvidia-smi`: the queries a GPU discoverer makes, about FAKE_GPU_COUNT H100s.

Answers `--query-gpu=FIELDS --format=csv[,noheader][,nounits]` (optionally `-i 0,2`), `-L`, and a
bare call. FAKE_GPU_COUNT (default 4) sets the number of GPUs; 0 prints "No devices were found"
and exits 6, as the real tool does. FAKE_GPU_NAME and FAKE_GPU_MEMORY_MIB change the model.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

EXIT_NO_DEVICES = 6
EXIT_BAD_ARGS = 2
DRIVER = "550.54.15"
MEMORY_MIB = 81559  # what an H100 80GB HBM3 reports as memory.total


def gpu_name() -> str:
    return os.environ.get("FAKE_GPU_NAME") or "NVIDIA H100 80GB HBM3"


def memory_mib() -> int:
    return int(os.environ.get("FAKE_GPU_MEMORY_MIB") or MEMORY_MIB)


def uuid(index: int) -> str:
    """A stable, real-looking GPU UUID per index."""
    return f"GPU-{index:08x}-fa6e-4000-8000-{index:012x}"


# field -> (header unit, value as text without unit); aliases as nvidia-smi accepts them
FIELDS: dict[str, tuple[str, Callable[[int, int], str]]] = {
    "index": ("", lambda i, n: str(i)),
    "uuid": ("", lambda i, n: uuid(i)),
    "name": ("", lambda i, n: gpu_name()),
    "memory.total": ("MiB", lambda i, n: str(memory_mib())),
    "memory.used": ("MiB", lambda i, n: "0"),
    "memory.free": ("MiB", lambda i, n: str(memory_mib())),
    "utilization.gpu": ("%", lambda i, n: "0"),
    "pci.bus_id": ("", lambda i, n: f"00000000:{0x18 + 0x10 * i:02X}:00.0"),
    "driver_version": ("", lambda i, n: DRIVER),
    "count": ("", lambda i, n: str(n)),
}
ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id"}


def fail(message: str, code: int) -> int:
    """Print to stdout (where nvidia-smi prints its errors) and return the exit code."""
    print(message)
    return code


def option(argv: list[str], *names: str) -> str | None:
    """The value of `--name=value` or `--name value` / `-n value`, or None."""
    for at, arg in enumerate(argv):
        for name in names:
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
            if arg == name and at + 1 < len(argv):
                return argv[at + 1]
    return None


def selected(argv: list[str], count: int) -> list[int] | None:
    """The GPU indexes `-i`/`--id` picks (all by default); None if one does not exist."""
    chosen = option(argv, "-i", "--id")
    if chosen is None:
        return list(range(count))
    indexes = [int(part) for part in chosen.split(",") if part.strip().isdigit()]
    return indexes if indexes and all(i < count for i in indexes) else None


def query(argv: list[str], fields_text: str, count: int) -> int:
    """The CSV answer to --query-gpu."""
    fmt = option(argv, "--format")
    if fmt is None or "csv" not in fmt.split(","):
        return fail('"--format" must be specified as csv with --query-gpu.', EXIT_BAD_ARGS)
    fields = [ALIASES.get(f.strip(), f.strip()) for f in fields_text.split(",") if f.strip()]
    for field in fields:
        if field not in FIELDS:
            return fail(f'Field "{field}" is not a valid field to query.', EXIT_BAD_ARGS)
    indexes = selected(argv, count)
    if indexes is None:
        return fail("No devices were found", EXIT_NO_DEVICES)
    options = set(fmt.split(","))
    if "noheader" not in options:
        # The header keeps the units even with nounits, as the real tool prints it.
        print(", ".join(f"{f} [{FIELDS[f][0]}]" if FIELDS[f][0] else f for f in fields))
    for index in indexes:
        values = []
        for field in fields:
            unit, value = FIELDS[field]
            text = value(index, count)
            values.append(f"{text} {unit}" if unit and "nounits" not in options else text)
        print(", ".join(values))
    return 0


def listing(count: int) -> int:
    """`nvidia-smi -L`: one line per GPU."""
    for index in range(count):
        print(f"GPU {index}: {gpu_name()} (UUID: {uuid(index)})")
    return 0


def summary(count: int) -> int:
    """A bare `nvidia-smi`: a short table, enough to show the tool works."""
    print(f"| NVIDIA-SMI {DRIVER}    Driver Version: {DRIVER}    CUDA Version: 12.4 |")
    for index in range(count):
        print(f"| {index}  {gpu_name()}  0MiB / {memory_mib()}MiB  0% |")
    return 0


def main(argv: list[str]) -> int:
    """Dispatch on the arguments; the exit code."""
    count = int(os.environ.get("FAKE_GPU_COUNT") or 4)
    if count <= 0:
        return fail("No devices were found", EXIT_NO_DEVICES)
    fields = option(argv, "--query-gpu")
    if fields is not None:
        return query(argv, fields, count)
    if argv in (["-L"], ["--list-gpus"]):
        return listing(count)
    if not argv:
        return summary(count)
    return fail("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.",
                EXIT_BAD_ARGS)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
