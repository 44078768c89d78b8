"""Engines and worker plans: which engine runs here, and the exact command line of each worker.

Pure: given the settings, the GPUs found and the resolved weights, `plan()` returns every worker
to spawn — its argv, environment, port and how to check it — so the command lines the pool
builds are asserted in tests without starting anything.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from providers.kinds.pool import gpus as gpu_groups
from providers.kinds.pool.settings import ModelSettings, PoolSettings, served_name
from providers.kinds.pool.sources import Weights

VLLM = "vllm"
_SECRET_FLAG = re.compile(r"(?i)^--?[\w-]*(key|token|secret|password)")
LLAMACPP = "llamacpp"
SCHEDULING_FLAG = "--scheduling-policy"  # vLLM's; "priority" orders its queue by `priority`


@dataclass(frozen=True, slots=True)
class Host:
    """What this machine offers the pool: GPUs, and which engines are installed."""

    gpus: tuple[int, ...]
    vllm: str | None  # the `vllm` executable, if on PATH
    llamacpp: bool  # llama-cpp-python importable (it runs as `python -m llama_cpp.server`)


def installed_engines(gpus: tuple[int, ...]) -> Host:
    return Host(gpus, shutil.which("vllm"), importlib.util.find_spec("llama_cpp") is not None)


def choose_engine(wanted: str, host: Host) -> str:
    """The engine to run; ValueError with the reason when none can run here."""
    if wanted == VLLM or (wanted == "auto" and host.gpus and host.vllm):
        if not host.vllm:
            raise ValueError("engine vllm: the `vllm` command is not installed")
        if not host.gpus:
            raise ValueError("engine vllm: no CUDA GPU found (NVML / nvidia-smi)")
        return VLLM
    if wanted in (LLAMACPP, "auto") and host.llamacpp:
        return LLAMACPP
    if wanted == LLAMACPP:
        raise ValueError("engine llamacpp: llama-cpp-python is not installed "
                         "(pip install 'llama-cpp-python[server]')")
    found = "no CUDA GPU" if not host.gpus else "GPUs but no `vllm` command"
    raise ValueError(f"engine auto: {found}, and llama-cpp-python is not installed")


@dataclass(frozen=True, slots=True)
class WorkerPlan:
    """One worker to spawn: how to start it and how to reach it."""

    name: str
    alias: str
    model: str  # the id it serves
    engine: str
    argv: tuple[str, ...]
    port: int
    host: str = "127.0.0.1"
    env: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[int, ...] = ()
    downloads: bool = False  # its weights are a hub id the engine fetches at start

    def loggable_argv(self) -> list[str]:
        """The command line for the log, with the value after any key or token flag masked."""
        masked = list(self.argv)
        for index, arg in enumerate(self.argv):
            if not _SECRET_FLAG.search(arg):
                continue
            if "=" in arg:
                masked[index] = arg.split("=", 1)[0] + "=***"
            elif index + 1 < len(masked):
                masked[index + 1] = "***"
        return masked

    def loggable_env(self) -> dict[str, str]:
        """Variables the worker gets: GPU pinning shown, every other value (tokens) masked."""
        return {name: value if name == "CUDA_VISIBLE_DEVICES" else "***"
                for name, value in self.env.items()}

    def failure_hint(self) -> str:
        """What to tell a user whose worker died while loading."""
        if self.downloads:
            return (" (the source is a Hugging Face id, which vLLM downloads at start: that "
                    "needs network access; give a local path to run offline)")
        return ""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def health_path(self) -> str:
        # llama_cpp.server has no /health, and its /v1/models waits for the model lock (behind a
        # whole generation). FastAPI's /docs answers without it; readiness still asks /v1/models.
        return "/health" if self.engine == VLLM else "/docs"

    @property
    def has_metrics(self) -> bool:
        return self.engine == VLLM


def plan(pool: str, settings: PoolSettings, engine: str, host: Host,
         weights: Mapping[str, Weights]) -> list[WorkerPlan]:
    """Every worker to spawn, ports counting up from `settings.port`; ValueError if impossible."""
    plans: list[WorkerPlan] = []
    claimed: dict[int, str] = {}
    for alias, model in settings.models.items():
        if model.source is None:
            continue  # served by remote workers only
        if engine == VLLM:
            devices = gpu_groups.select([gpu_groups.Gpu(i, "") for i in host.gpus],
                                        model.gpus or settings.gpus)
            for gpu in devices:
                if gpu in claimed:
                    raise ValueError(f"models.{alias} and models.{claimed[gpu]} both use GPU "
                                     f"{gpu}: give each model its own `gpus`")
                claimed[gpu] = alias
            groups = gpu_groups.groups(devices, model.tensor_parallel_size)
            if not groups:
                raise ValueError(f"models.{alias}: tensor_parallel_size "
                                 f"{model.tensor_parallel_size} needs that many GPUs, "
                                 f"{len(devices)} available")
            for group in groups:
                port = settings.port + len(plans)
                argv = vllm_argv(host.vllm or VLLM, weights[alias], alias, model, settings,
                                 port)
                env = {**model.env, "CUDA_VISIBLE_DEVICES": ",".join(map(str, group))}
                plans.append(WorkerPlan(f"{pool}-{len(plans)}", alias, served_name(alias, model),
                                        VLLM, argv, port, settings.host, env, group,
                                        downloads=not weights[alias].is_local))
        else:
            for _ in range(model.replicas):
                port = settings.port + len(plans)
                argv = llamacpp_argv(weights[alias], alias, model, settings, port)
                plans.append(WorkerPlan(f"{pool}-{len(plans)}", alias, served_name(alias, model),
                                        LLAMACPP, argv, port, settings.host, dict(model.env)))
    return plans


# Tasks vLLM's pooling runner serves (embeddings; rerank and score for a cross-encoder).
POOLING = frozenset({"embed", "rerank"})


def vllm_argv(vllm: str, weights: Weights, alias: str, model: ModelSettings,
              settings: PoolSettings, port: int) -> tuple[str, ...]:
    """`vllm serve` with the model's options, on its own port."""
    argv = [vllm, "serve", weights.location, "--host", settings.host, "--port", str(port),
            "--served-model-name", served_name(alias, model),
            "--tensor-parallel-size", str(model.tensor_parallel_size)]
    argv += _option("--max-model-len", model.max_model_len)
    argv += _option("--gpu-memory-utilization", model.gpu_memory_utilization)
    if model.enable_prefix_caching is not None:
        argv.append("--enable-prefix-caching" if model.enable_prefix_caching
                    else "--no-enable-prefix-caching")
    argv += _option("--reasoning-parser", model.reasoning_parser)
    argv += _option("--tool-call-parser", model.tool_call_parser)
    if model.enable_auto_tool_choice:
        argv.append("--enable-auto-tool-choice")
    if model.task in POOLING:
        argv += ["--runner", "pooling"]
    if model.task not in POOLING and not any(a.startswith(SCHEDULING_FLAG) for a in model.args):
        # The gateway's priorities (`x-llms-priority`) order the worker's own queue too; with
        # every priority equal, vLLM's priority policy is first come first served.
        argv += [SCHEDULING_FLAG, "priority"]
    argv += ["--shutdown-timeout", f"{settings.shutdown_grace:g}"]
    return (*argv, *model.args)


def schedules_by_priority(argv: Sequence[str]) -> bool:
    """Whether a vLLM worker started with `argv` takes a request's `priority` (any other
    policy refuses a nonzero one)."""
    return any(arg == SCHEDULING_FLAG and value == "priority"
               for arg, value in itertools.pairwise(argv)) \
        or f"{SCHEDULING_FLAG}=priority" in argv


def llamacpp_argv(weights: Weights, alias: str, model: ModelSettings, settings: PoolSettings,
                  port: int) -> tuple[str, ...]:
    """llama-cpp-python's OpenAI server on the CPU, serving the GGUF under the model's name."""
    if model.task == "rerank":
        raise ValueError(f"models.{alias}: llama.cpp serves no /v1/rerank; a rerank model "
                         "needs vLLM workers")
    if not weights.is_local:
        raise ValueError(f"models.{alias}: llama.cpp needs a local GGUF file or a package that "
                         f"ships one, not the hub id {weights.location!r}")
    argv = [sys.executable, "-m", "llama_cpp.server", "--model", weights.location,
            "--host", settings.host, "--port", str(port),
            "--model_alias", served_name(alias, model), "--verbose", "False",
            # Its default ends a running stream with [DONE] when another request arrives: a
            # truncated answer that looks finished. Queue instead.
            "--interrupt_requests", "False"]
    argv += _option("--n_ctx", model.max_model_len)
    if model.task == "embed":
        argv += ["--embedding", "True"]
    else:
        argv += _option("--chat_format", model.chat_format)
    argv += _option("--n_threads", model.threads)
    return (*argv, *model.args)


def _option(flag: str, value: object) -> Sequence[str]:
    return [flag, f"{value:g}" if isinstance(value, float) else str(value)] if value is not None \
        else []
