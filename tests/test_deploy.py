"""deploy/: the compose file and the Kubernetes manifests, checked as a deploy would check them.

No container engine runs here, so the files are validated statically: the manifests against the
Kubernetes JSON schemas (`kubernetes-validate` ships them; strict, so an unknown field fails),
the compose file against the compose specification's schema (tests/data/compose-spec.json, from
docker-compose 1.29.2's package, Apache-2.0), and every config they carry is loaded by the
gateway's own loader. Cross-checks catch what only a deploy would otherwise find: a service a
config names that does not exist, a port that does not match.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from gateway.state.config import parse
from providers.kinds.pool.settings import read_settings
from tests.gateway_process import ROOT

DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"
ENV = {"LLMS_GATEWAY_KEY": "deploy-test-key-0001"}


def manifests() -> list[dict[str, Any]]:
    return [doc for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


@pytest.mark.parametrize("manifest", manifests(), ids=lambda m: f"{m['kind']}/"
                         f"{m['metadata']['name']}")
def test_each_manifest_is_valid_kubernetes_strictly(manifest: dict[str, Any]) -> None:
    import kubernetes_validate

    kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)


def test_a_manifest_with_a_misspelt_field_fails_the_same_check() -> None:
    import kubernetes_validate

    deployment = next(m for m in manifests() if m["kind"] == "Deployment")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def test_the_compose_file_follows_the_compose_specification() -> None:
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
    jsonschema.Draft201909Validator(schema).validate(compose())
    broken = {**compose(), "services": {"gateway": {"imagee": "x"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft201909Validator(schema).validate(broken)


def test_every_config_deployed_loads_in_the_gateway(tmp_path: Path) -> None:
    configmap = next(m for m in manifests() if m["kind"] == "ConfigMap")
    texts = {"deploy/llms.json": (DEPLOY / "llms.json").read_text(),
             "deploy/worker.json": (DEPLOY / "worker.json").read_text(),
             "configmap llms.json": configmap["data"]["llms.json"]}
    for name, text in texts.items():
        snapshot = parse(text, tmp_path / "llms.json", ENV)
        assert snapshot.providers, name
        for spec in snapshot.providers:
            if spec.kind == "pool":
                read_settings(spec.raw)


def _host_ports(urls: list[str]) -> set[tuple[str, int]]:
    found = set()
    for url in urls:
        match = re.match(r"\w+://([^:/]+):(\d+)", url)
        assert match, url
        found.add((match.group(1), int(match.group(2))))
    return found


def test_what_the_compose_configs_name_exists_in_the_compose_file() -> None:
    services = compose()["services"]
    gateway = json.loads((DEPLOY / "llms.json").read_text())
    worker = json.loads((DEPLOY / "worker.json").read_text())
    for host, port in _host_ports([gateway["state"]["url"],
                                   *gateway["providers"]["local"]["workers"]]):
        assert host in services, f"{host} is not a compose service"
        if host == "worker":
            assert port == worker["server"]["port"]
            assert f"{port}" in " ".join(services["worker"]["command"])
    nginx = (DEPLOY / "nginx.conf").read_text()
    for server in re.findall(r"server ([\w-]+):(\d+);", nginx):
        assert server[0] in services and int(server[1]) == gateway["server"]["port"]
    assert gateway["server"]["api_keys"], "a gateway bound beyond loopback needs keys"
    for name, service in services.items():
        assert "healthcheck" in service, f"{name} has no health check"
    published = [name for name, s in services.items() if s.get("ports")]
    assert published == ["lb"], "only the load balancer is reachable from outside"


def test_what_the_cluster_config_names_exists_in_the_manifests() -> None:
    services = {m["metadata"]["name"]: m for m in manifests() if m["kind"] == "Service"}
    configmap = next(m for m in manifests() if m["kind"] == "ConfigMap")
    doc = json.loads(configmap["data"]["llms.json"])
    for host, port in _host_ports([doc["state"]["url"],
                                   *doc["providers"]["gpu-pool"]["workers"]]):
        assert host in services and port in [p["port"] for p in services[host]["spec"]["ports"]]
    deployments = {m["metadata"]["name"]: m for m in manifests() if m["kind"] == "Deployment"}
    gateway = deployments["llms-gateway"]["spec"]["template"]["spec"]["containers"][0]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    vllm = deployments["llms-vllm"]["spec"]["template"]["spec"]["containers"][0]
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert ":latest" not in vllm["image"]


def test_the_dockerfile_checks_health_and_pins_vllm() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\S+)", dockerfile, re.MULTILINE)
    assert {name for _, name in stages} == {"gpu", "cpu-worker", "gateway"}
    assert stages[-1][1] == "gateway", "the default target is the gateway alone"
    assert dockerfile.count("HEALTHCHECK") == len(stages)
    assert not any(image.endswith(":latest") for image, _ in stages)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
