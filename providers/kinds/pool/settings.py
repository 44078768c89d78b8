"""A pool provider's own fields in llms.json, read into frozen structs.

```json
"local": {"type": "pool", "engine": "auto", "gpus": "all", "port": 8101,
          "workers": ["http://gpu-node-2:8000"],
          "models": {"qwen3-8b": {"source": "Qwen/Qwen3-8B", "tensor_parallel_size": 2,
                                  "max_model_len": 32768, "enable_prefix_caching": true}}}
```

Fields every provider has (`timeouts`, `retries`, `circuit`, ...) are the core's; the rest of the
provider object and each model object is checked here, and an unknown field is an error naming it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from providers.contract.spec import ModelEntry, ProviderEntry
from providers.kinds.compat import OPTION_FIELDS

Engine = Literal["auto", "vllm", "llamacpp"]
S = TypeVar("S", bound=msgspec.Struct)

DEFAULT_PORT = 8101


class ModelSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One model the pool serves: where its weights are and how to run them."""

    # A local path, a Hugging Face id, or a Python package that ships weights; none: the model
    # is served by remote `workers` only.
    source: str | None = None
    served_model_name: str | None = None  # the id workers serve it under (default: the alias)
    gpus: Literal["all"] | tuple[int, ...] | None = None  # default: the pool's
    tensor_parallel_size: int = 1
    replicas: int = 1  # llama.cpp workers (vLLM runs one per GPU group instead)
    max_model_len: int | None = None  # vLLM --max-model-len, llama.cpp --n_ctx
    gpu_memory_utilization: float | None = None
    enable_prefix_caching: bool | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool = False
    chat_format: str | None = None  # llama.cpp: the prompt template (e.g. "gemma")
    # "embed": the workers serve /v1/embeddings (vLLM's pooling runner; llama.cpp in embedding
    # mode, its token vectors mean-pooled by the pool); "rerank": /v1/rerank (vLLM's pooling
    # runner, a cross-encoder or reranker model; llama.cpp has no rerank endpoint).
    task: Literal["generate", "embed", "rerank"] = "generate"
    threads: int | None = None  # llama.cpp: CPU threads per worker
    args: tuple[str, ...] = ()  # anything else, appended to the worker's command line
    env: dict[str, str] = {}
    # The core's model facts, allowed here too; the core reads them.
    id: str | None = None
    context_window: int | None = None
    max_output_tokens: int | None = None
    price: Any = None


class PoolSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The pool as a whole: engine, GPUs, ports, remote workers, supervision timings."""

    models: dict[str, ModelSettings] = {}
    engine: Engine = "auto"
    gpus: Literal["all"] | tuple[int, ...] = "all"
    host: str = "127.0.0.1"  # where spawned workers listen
    port: int = DEFAULT_PORT  # the first spawned worker's port; the next ones count up
    workers: tuple[str, ...] = ()  # vLLM servers started elsewhere: balanced, never spawned
    check_interval: float = 1.0  # health checks and /metrics scrapes
    restart_backoff: float = 1.0  # first restart delay, doubled per crash in a row
    max_restart_backoff: float = 60.0
    drain_timeout: float = 30.0  # on shutdown, how long in-flight requests may finish
    shutdown_grace: float = 30.0  # then SIGTERM, and SIGKILL after this (vLLM --shutdown-timeout)
    cache_dir: str | None = None  # where packaged weights are assembled
    # Requests one worker may hold, sent to it or waiting in the pool's line for it; past it
    # the pool is full for the request (it fails over, or the client gets 503 overloaded with
    # a Retry-After). None: 16 on llama.cpp (2 sent, the rest wait), no bound on vLLM.
    max_queue: Annotated[int, msgspec.Meta(ge=1)] | None = None
    # Seconds a request may wait in line for a worker; None: the provider's first_token timeout.
    queue_timeout: Annotated[float, msgspec.Meta(gt=0)] | None = None


# The core's provider fields and the OpenAI options (workers speak OpenAI): present in the same
# object, not ours to check.
_CORE_FIELDS = (frozenset(ProviderEntry.__struct_fields__) | frozenset(OPTION_FIELDS)) - {"models"}
# What a pool's object and its model objects may hold beyond the core's fields.
POOL_FIELDS = frozenset(OPTION_FIELDS) | (frozenset(PoolSettings.__struct_fields__) - {"models"})
MODEL_FIELDS = frozenset(ModelSettings.__struct_fields__)


def read_settings(raw: Mapping[str, Any]) -> PoolSettings:
    """The pool's settings from its llms.json object; ValueError names a bad field."""
    own = {k: v for k, v in raw.items() if k not in _CORE_FIELDS}
    if isinstance(own.get("models"), dict):  # "alias": "id" is a model remote workers serve
        own["models"] = {alias: {"served_model_name": m} if isinstance(m, str) else m
                         for alias, m in own["models"].items()}
    for alias, model in (own.get("models") or {}).items() if isinstance(own.get("models"),
                                                                         dict) else ():
        _convert(model, ModelSettings, f"models.{alias}")
    settings = _convert(own, PoolSettings, "")
    if not settings.models:
        raise ValueError("models: a pool needs at least one model")
    for alias, model in settings.models.items():
        if model.tensor_parallel_size < 1 or model.replicas < 1:
            raise ValueError(f"models.{alias}: tensor_parallel_size and replicas must be >= 1")
    return settings


def _convert(raw: object, kind: type[S], where: str) -> S:
    """msgspec.convert with a ValueError that names the field, `where` first."""
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as exc:
        problem, _, at = str(exc).partition(" - at `$")
        field = ".".join(p for p in (where, at.rstrip("`").lstrip(".")) if p)
        raise ValueError(f"{field}: {problem}" if field else problem) from exc


def served_name(alias: str, model: ModelSettings) -> str:
    """The model id workers serve and requests name upstream."""
    return model.served_model_name or model.id or alias


# Fields that change nothing a worker runs: a reload applies them to the running pool
# (`Pool.update`) instead of restarting workers that may take minutes to load.
_LIVE_POOL_FIELDS = ("models", "check_interval", "restart_backoff", "max_restart_backoff",
                     "drain_timeout", "max_queue", "queue_timeout")
_LIVE_MODEL_FIELDS = ("served_model_name", "id", "context_window", "max_output_tokens", "price")


def fingerprint(settings: PoolSettings) -> str:
    """Changes when what the pool's workers run changes (a model's source, engine options,
    GPUs, the name it is served under, ports, remote workers), and only then: a new alias for
    a running model, a price, a limit or a timing leaves it as it was, and so does the order
    of models or of providers, or the core's fields (timeouts, circuit)."""
    running = {name: value for name, value in msgspec.structs.asdict(settings).items()
               if name not in _LIVE_POOL_FIELDS}
    # Keyed by the name workers serve, not the alias: a model with no source spawns nothing.
    running["spawned"] = {
        served_name(alias, model): {name: value for name, value
                                    in msgspec.structs.asdict(model).items()
                                    if name not in _LIVE_MODEL_FIELDS}
        for alias, model in settings.models.items() if model.source is not None}
    return hashlib.sha256(msgspec.json.encode(running, order="sorted")).hexdigest()[:16]


def model_entries(settings: PoolSettings) -> dict[str, ModelEntry]:
    """The aliases a pool serves, as the core's model entries (for remote-only pools too)."""
    return {alias: ModelEntry(id=served_name(alias, m)) for alias, m in settings.models.items()}
