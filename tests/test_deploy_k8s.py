"""deploy/k8s/ under the policies a cluster admin runs before letting manifests in.

The schema check is `kubernetes-validate` (tests/test_deploy.py). These are the rules of
kube-linter's and Pod Security's defaults that matter for this deploy, written out because
kube-linter is a Go binary that no package registry here ships: pinned images that a node does not
pull on every start, resources and probes on every container, no root, a disruption budget for
every replicated workload, the workers, Redis and PostgreSQL reachable from the gateway alone,
and every secret from a Secret. Each rule is also run against a manifest that breaks it, so a
rule that can never fail is caught.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.accounts.database import engine_url
from gateway.config.loader import parse
from gateway.core.settings import ConfigError
from tests.fake_gpu import FAKE_VLLM
from tests.gateway_process import GatewayProcess, config, dies_with_us, free_port
from tests.pool_helpers import wait_for_workers
from tests.test_deploy import ENV, SECRET_NAME, URL_PASSWORD, manifests

Manifest = dict[str, Any]
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")
GATEWAY = {"app.kubernetes.io/name": "llms-gateway"}  # the one workload clients reach


def workloads(docs: list[Manifest]) -> list[Manifest]:
    return [m for m in docs if m["kind"] in WORKLOADS]


def containers(workload: Manifest) -> Iterator[tuple[Manifest, Manifest]]:
    pod = workload["spec"]["template"]["spec"]
    for container in pod["containers"]:
        yield pod, container


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = selector.get("matchLabels", {})
    return bool(wanted) and all(labels.get(k) == v for k, v in wanted.items())


def pinned_images(docs: list[Manifest]) -> list[str]:
    problems = []
    for workload in workloads(docs):
        for _, container in containers(workload):
            image, policy = container["image"], container.get("imagePullPolicy")
            tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else ""
            if "@sha256:" not in image and tag in ("", "latest"):
                problems.append(f"{container['name']}: {image} is not pinned")
            if policy != "IfNotPresent":
                problems.append(f"{container['name']}: imagePullPolicy {policy}, not IfNotPresent")
    return problems


def resources_and_probes(docs: list[Manifest]) -> list[str]:
    problems = []
    for workload in workloads(docs):
        for _, container in containers(workload):
            resources = container.get("resources", {})
            if "memory" not in resources.get("limits", {}):
                problems.append(f"{container['name']}: no memory limit")
            if not {"cpu", "memory"} <= set(resources.get("requests", {})):
                problems.append(f"{container['name']}: no cpu and memory requests")
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in container:
                    problems.append(f"{container['name']}: no {probe}")
    return problems


def non_root(docs: list[Manifest]) -> list[str]:
    problems = []
    for workload in workloads(docs):
        for pod, container in containers(workload):
            context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
            if not context.get("runAsNonRoot") or context.get("runAsUser") == 0:
                problems.append(f"{container['name']}: may run as root")
            if context.get("allowPrivilegeEscalation", True):
                problems.append(f"{container['name']}: privilege escalation allowed")
            if "ALL" not in context.get("capabilities", {}).get("drop", []):
                problems.append(f"{container['name']}: capabilities not dropped")
    return problems


def disruption_budgets(docs: list[Manifest]) -> list[str]:
    """A workload of several replicas has a budget; one of one has none (a budget on a single
    pod would block every node drain)."""
    budgets = [m["spec"]["selector"] for m in docs if m["kind"] == "PodDisruptionBudget"]
    problems = []
    for workload in workloads(docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        covered = any(selects(budget, labels) for budget in budgets)
        if workload["spec"].get("replicas", 1) > 1 and not covered:
            problems.append(f"{workload['metadata']['name']}: no PodDisruptionBudget")
    return problems


def network_policies(docs: list[Manifest]) -> list[str]:
    """Everything but the gateway takes traffic from the gateway's pods only."""
    policies = [m["spec"] for m in docs if m["kind"] == "NetworkPolicy"]
    problems = []
    for workload in workloads(docs):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if selects({"matchLabels": GATEWAY}, labels):
            continue
        mine = [p for p in policies if selects(p["podSelector"], labels)]
        sources = [peer for p in mine for rule in p.get("ingress", []) for peer in
                   rule.get("from", [{}])]
        if not mine or "Ingress" not in mine[0].get("policyTypes", []):
            problems.append(f"{workload['metadata']['name']}: no NetworkPolicy")
        elif any(peer.get("podSelector", {}).get("matchLabels") != GATEWAY for peer in sources):
            problems.append(f"{workload['metadata']['name']}: reachable from beyond the gateway")
    return problems


def secrets_from_secrets(docs: list[Manifest]) -> list[str]:
    """A variable that holds a secret is read from a Secret; a URL with a password takes it
    from such a variable, `$(NAME)`, defined above it (the kubelet fills only those in)."""
    problems = []
    for workload in workloads(docs):
        for _, container in containers(workload):
            secret: set[str] = set()
            for variable in container.get("env", []):
                name = variable["name"]
                if "secretKeyRef" in variable.get("valueFrom", {}):
                    secret.add(name)
                elif SECRET_NAME.search(name):
                    problems.append(f"{container['name']}: {name} is not from a Secret")
                for password in URL_PASSWORD.findall(variable.get("value", "")):
                    named = re.fullmatch(r"\$\((\w+)\)", password)
                    if not named or named.group(1) not in secret:
                        problems.append(f"{container['name']}: {name} holds a password that is "
                                        f"not a Secret's")
    return problems


POLICIES: dict[str, Callable[[list[Manifest]], list[str]]] = {
    "pinned images": pinned_images,
    "resources and probes": resources_and_probes,
    "non-root": non_root,
    "disruption budgets": disruption_budgets,
    "network policies": network_policies,
    "secrets from a Secret": secrets_from_secrets,
}


@pytest.mark.parametrize("policy", POLICIES)
def test_the_manifests_pass_the_cluster_s_policy(policy: str) -> None:
    assert POLICIES[policy](manifests()) == []


def _broken(change: Callable[[list[Manifest]], None]) -> list[Manifest]:
    docs = copy.deepcopy(manifests())
    change(docs)
    return docs


def _workload(docs: list[Manifest], name: str) -> Manifest:
    return next(m for m in workloads(docs) if m["metadata"]["name"] == name)


def _first_container(docs: list[Manifest], name: str) -> Manifest:
    container: Manifest = _workload(docs, name)["spec"]["template"]["spec"]["containers"][0]
    return container


BREAKS: dict[str, Callable[[list[Manifest]], None]] = {
    "pinned images": lambda docs: _first_container(docs, "llms-gateway").update(
        image="llms-gateway:latest", imagePullPolicy="Always"),
    "resources and probes": lambda docs: _first_container(docs, "llms-redis").pop("livenessProbe"),
    "non-root": lambda docs: _workload(docs, "llms-vllm")["spec"]["template"]["spec"].pop(
        "securityContext"),
    "disruption budgets": lambda docs: docs.remove(next(
        m for m in docs if m["kind"] == "PodDisruptionBudget")),
    "network policies": lambda docs: docs.remove(next(
        m for m in docs if m["kind"] == "NetworkPolicy"
        and m["metadata"]["name"] == "llms-vllm")),
    "secrets from a Secret": lambda docs: _first_container(docs, "llms-postgres")["env"].append(
        {"name": "POSTGRES_PASSWORD", "value": "hunter2hunter2"}),
}


@pytest.mark.parametrize("policy", POLICIES)
def test_a_manifest_that_breaks_a_policy_is_caught(policy: str) -> None:
    assert POLICIES[policy](_broken(BREAKS[policy]))


def test_a_password_written_in_a_url_is_caught_too() -> None:
    docs = _broken(lambda docs: _env(_first_container(docs, "llms-gateway"),
                                     "LLMS_DATABASE_URL").update(
        value="postgresql://gateway:hunter2@llms-postgres:5432/gateway"))
    assert secrets_from_secrets(docs) == [
        "gateway: LLMS_DATABASE_URL holds a password that is not a Secret's"]


def _env(container: Manifest, name: str) -> Manifest:
    variable: Manifest = next(e for e in container["env"] if e["name"] == name)
    return variable


def test_the_workers_take_the_key_only_the_gateway_has() -> None:
    """vLLM's /v1 answers only the worker key, from the Secret the gateway reads it from too, and
    the gateway's pool sends it."""
    docs = manifests()

    def key_source(container: Manifest, name: str) -> Any:
        return next(e["valueFrom"]["secretKeyRef"] for e in container["env"] if e["name"] == name)

    vllm, gateway = _first_container(docs, "llms-vllm"), _first_container(docs, "llms-gateway")
    assert "--api-key" in vllm["args"]
    named = vllm["args"][vllm["args"].index("--api-key") + 1]
    variable = re.fullmatch(r"\$\((\w+)\)", named)
    assert variable, "the key is read from the environment, never written in the manifest"
    assert key_source(vllm, variable.group(1)) == key_source(gateway, "VLLM_API_KEY")
    configmap = next(m for m in docs if m["kind"] == "ConfigMap")
    pool = json.loads(configmap["data"]["llms.json"])["providers"]["gpu-pool"]
    assert pool["api_key"] == "$VLLM_API_KEY"


def test_the_model_cache_outlives_a_pod_and_redis_evicts_before_its_limit() -> None:
    docs = manifests()
    vllm = _workload(docs, "llms-vllm")
    mounts = {m["name"]: m["mountPath"] for m in _first_container(docs, "llms-vllm")[
        "volumeMounts"]}
    claims = {c["metadata"]["name"] for c in vllm["spec"].get("volumeClaimTemplates", [])}
    assert "cache" in claims and "cache" in mounts, "the model is downloaded once per pod"
    env = {e["name"]: e.get("value") for e in _first_container(docs, "llms-vllm")["env"]}
    assert env["HF_HOME"].startswith(mounts["cache"])

    redis = _first_container(docs, "llms-redis")
    args = redis["args"]
    maxmemory = args[args.index("--maxmemory") + 1]
    limit = redis["resources"]["limits"]["memory"]
    assert _bytes(maxmemory) < 0.9 * _bytes(limit), "room for Redis' own overhead"
    assert args[args.index("--maxmemory-policy") + 1] == "allkeys-lru"


UNITS = {"mb": 10**6, "gb": 10**9, "Mi": 2**20, "Gi": 2**30}


def _bytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)(\w+)", size).groups()  # type: ignore[union-attr]
    return int(number) * UNITS[unit]


def test_the_cluster_s_pool_is_answered_by_a_worker_that_wants_the_key(tmp_path: Path) -> None:
    """The ConfigMap's gpu-pool, its worker a stand-in for vLLM started as vllm.yaml starts it
    (`--api-key` from VLLM_API_KEY), the gateway given the same key as gateway.yaml gives it."""
    key = "worker-key-for-this-test-0001"
    port = free_port()
    configmap = next(m for m in manifests() if m["kind"] == "ConfigMap")
    doc = json.loads(configmap["data"]["llms.json"])
    pool = {**doc["providers"]["gpu-pool"], "workers": [f"http://127.0.0.1:{port}/v1"],
            "check_interval": 0.2}
    (model,) = pool["models"]
    vllm = subprocess.Popen([sys.executable, str(FAKE_VLLM), "serve", pool["models"][model],
                             "--host", "127.0.0.1", "--port", str(port), "--api-key", key],
                            env={**os.environ, "CUDA_VISIBLE_DEVICES": "0"},
                            preexec_fn=dies_with_us)
    gateway = GatewayProcess(tmp_path, config({"gpu-pool": pool}),
                             env={"VLLM_API_KEY": key, "LLMS_GATEWAY_KEY": ""})
    try:
        gateway.start()
        wait_for_workers(gateway, "ready", provider="gpu-pool", timeout=15)
        answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30, json={
            "model": model, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]})
        assert answer.status_code == 200, answer.text
    finally:
        gateway.stop()
        vllm.kill()
        vllm.wait()


# --- the accounts database: one PostgreSQL for both replicas, reached by the gateway alone

# The Secret gateway.yaml's comment has you create, as the kubelet would read it.
SECRET = {"api-key": ENV["LLMS_GATEWAY_KEY"], "worker-key": ENV["VLLM_API_KEY"],
          "database-password": "deploy-db-password-01"}


def environment(container: Manifest) -> dict[str, str]:
    """A container's variables as the kubelet sets them: a Secret's value, or a value whose
    `$(NAME)` names a variable defined above it (any other is left as written)."""
    found: dict[str, str] = {}
    for variable in container.get("env", []):
        if "valueFrom" in variable:
            ref = variable["valueFrom"]["secretKeyRef"]
            assert ref["name"] == "llms-gateway", ref
            found[variable["name"]] = SECRET[ref["key"]]
        else:
            found[variable["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: found.get(m.group(1), m.group(0)), variable["value"])
    return found


def database_problems(docs: list[Manifest]) -> list[str]:
    """Why the gateway pods would not reach the one PostgreSQL with the password it has, or
    it would not keep its data."""
    postgres = _workload(docs, "llms-postgres")
    pod = postgres["spec"]["template"]
    container = pod["spec"]["containers"][0]
    own = environment(container)
    problems = []
    if postgres["kind"] != "StatefulSet" or postgres["spec"].get("replicas", 1) != 1:
        problems.append("postgres: not one StatefulSet pod")
    claims = {c["metadata"]["name"] for c in postgres["spec"].get("volumeClaimTemplates", [])}
    mounted = [m["mountPath"] for m in container.get("volumeMounts", []) if m["name"] in claims]
    if not any(own.get("PGDATA", "").startswith(f"{path}/") for path in mounted):
        problems.append("postgres: its data is not under a volume claim's mount")
    configmap = next(m for m in docs if m["kind"] == "ConfigMap")
    try:
        url = parse(configmap["data"]["llms.json"], Path("llms.json"),
                    environment(_first_container(docs, "llms-gateway"))).database.url
    except ConfigError as exc:
        return [*problems, f"gateway: {exc}"]
    assert url is not None
    engine_url(url)
    parts = urllib.parse.urlsplit(url)
    services = [m for m in docs if m["kind"] == "Service"
                and m["metadata"]["name"] == parts.hostname]
    ports = {p["containerPort"] for p in container["ports"]}
    if not services or not selects({"matchLabels": services[0]["spec"]["selector"]},
                                   pod["metadata"]["labels"]):
        problems.append(f"gateway: database.url's host {parts.hostname} is not postgres' Service")
    elif parts.port not in {p["port"] for p in services[0]["spec"]["ports"]} or 5432 not in ports:
        problems.append(f"gateway: database.url's port {parts.port} is not postgres'")
    if (parts.username, parts.password, parts.path) != (
            own.get("POSTGRES_USER"), own.get("POSTGRES_PASSWORD"), f"/{own.get('POSTGRES_DB')}"):
        problems.append("gateway: database.url's user, password or database is not postgres'")
    return problems


def test_the_gateway_reaches_postgres_with_the_password_postgres_has() -> None:
    assert database_problems(manifests()) == []
    env = environment(_first_container(manifests(), "llms-gateway"))
    assert SECRET["database-password"] in env["LLMS_DATABASE_URL"]


DATABASE_BREAKS: dict[str, Callable[[list[Manifest]], None]] = {
    # The kubelet fills in $(NAME) from variables above it only: the password would be the text.
    "the URL above its password": lambda docs: _first_container(docs, "llms-gateway")[
        "env"].sort(key=lambda e: e["name"] != "LLMS_DATABASE_URL"),
    "no URL": lambda docs: _first_container(docs, "llms-gateway")["env"].remove(
        _env(_first_container(docs, "llms-gateway"), "LLMS_DATABASE_URL")),
    "another host": lambda docs: _env(_first_container(docs, "llms-gateway"),
                                      "LLMS_DATABASE_URL").update(
        value="postgresql://gateway:$(LLMS_DATABASE_PASSWORD)@llms-redis:6379/gateway"),
    "another key": lambda docs: _env(_first_container(docs, "llms-postgres"),
                                     "POSTGRES_PASSWORD")["valueFrom"]["secretKeyRef"].update(
        key="api-key"),
    "data off the volume": lambda docs: _first_container(docs, "llms-postgres").pop(
        "volumeMounts"),
}


@pytest.mark.parametrize("change", DATABASE_BREAKS)
def test_a_gateway_that_could_not_reach_its_database_is_caught(change: str) -> None:
    assert database_problems(_broken(DATABASE_BREAKS[change]))


def test_only_the_gateway_reaches_postgres_and_only_its_port() -> None:
    docs = manifests()
    (policy,) = [m["spec"] for m in docs if m["kind"] == "NetworkPolicy"
                 and selects(m["spec"]["podSelector"], {"app.kubernetes.io/name": "llms-postgres"})]
    assert policy["ingress"] == [{"from": [{"podSelector": {"matchLabels": GATEWAY}}],
                                  "ports": [{"protocol": "TCP", "port": 5432}]}]

    def widened(docs: list[Manifest]) -> None:
        policy = next(m for m in docs if m["kind"] == "NetworkPolicy"
                      and m["metadata"]["name"] == "llms-postgres")
        policy["spec"]["ingress"][0]["from"].append({"namespaceSelector": {}})

    assert network_policies(_broken(widened)) == [
        "llms-postgres: reachable from beyond the gateway"]
    assert network_policies(_broken(lambda docs: docs.remove(next(
        m for m in docs if m["kind"] == "NetworkPolicy"
        and m["metadata"]["name"] == "llms-postgres")))) == ["llms-postgres: no NetworkPolicy"]
