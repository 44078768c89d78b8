"""deploy/: the compose file and the Kubernetes manifests, checked as a deploy would check them.

No container engine runs here, so the files are validated statically: the manifests against the
Kubernetes JSON schemas (`kubernetes-validate` ships them; strict, so an unknown field fails),
the compose file against the compose specification's schema (tests/data/compose-spec.json, as
github.com/compose-spec/compose-spec has it at 170098ba07d9f53c383a41bfd4c5166b0a4529a6,
schema/compose-spec.json, Apache-2.0: no maintained package on PyPI ships it), the Dockerfile's
stages through `dockerfile-parse`,
and every config they carry is loaded by the gateway's own loader. Cross-checks catch what only a
deploy would otherwise find: a service a config names that does not exist, a port that does not
match, a volume mounted where the image's user cannot write, replicas that would each keep their
own accounts database, a password written into a file. The cluster admin's policies on the
manifests are in tests/test_deploy_k8s.py. One story runs for real: two replicas configured as
compose configures them, on a PostgreSQL that wants its password, share the keys made on either.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tomllib
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import pytest
import yaml
from dockerfile_parse import DockerfileParser

from gateway.accounts.database import engine_url
from gateway.config.loader import parse
from gateway.core.settings import ConfigError
from providers.kinds.pool.settings import read_settings
from tests.dockerfile_stages import ROOT_USER, Stage, stages
from tests.gateway_process import ROOT, GatewayProcess, wait_until
from tests.postgres_server import PostgresServer
from tests.test_teams import Admin, chat, priced
from tests.upstream import FakeUpstream

DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30.0"
ENV = {"LLMS_GATEWAY_KEY": "deploy-test-key-0001", "VLLM_API_KEY": "deploy-worker-key-01",
       "LLMS_DATABASE_URL": "postgresql://gateway:deploy-db-password-01@postgres:5432/gateway"}
# What the operator exports before `docker compose up` (compose.yaml's header).
OPERATOR = {"LLMS_GATEWAY_KEY": "deploy-test-key-0001",
            "LLMS_DATABASE_PASSWORD": "deploy-db-password-01"}
POSTGRES_PORT = 5432


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
    jsonschema.Draft7Validator(schema).validate(compose())
    broken = {**compose(), "services": {"gateway": {"imagee": "x"}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(schema).validate(broken)


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
    workloads = {m["metadata"]["name"]: m for m in manifests()
                 if m["kind"] in ("Deployment", "StatefulSet")}
    gateway = workloads["llms-gateway"]["spec"]["template"]["spec"]["containers"][0]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    vllm = workloads["llms-vllm"]["spec"]["template"]["spec"]["containers"][0]
    assert vllm["readinessProbe"]["httpGet"]["path"] == "/health"
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_the_dockerfile_checks_health_and_pins_vllm() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\S+)", dockerfile, re.MULTILINE)
    assert {name for _, name in stages} == {"gpu", "cpu-worker", "gateway"}
    assert stages[-1][1] == "gateway", "the default target is the gateway alone"
    assert dockerfile.count("HEALTHCHECK") == len(stages)
    assert not any(image.endswith(":latest") for image, _ in stages)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored


def _installed(stage: str, extras: str | None) -> str:
    """What `pip install` is given in `stage` of the Dockerfile, as its shell expands it with
    the build argument EXTRAS set (or not)."""
    parser = DockerfileParser(fileobj=io.BytesIO((ROOT / "Dockerfile").read_bytes()))
    current, words = None, []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            current = instruction["value"].split(" AS ")[-1].strip()
        elif current == stage and instruction["instruction"] == "RUN":
            words += re.findall(r"pip install --no-cache-dir (\S+)", instruction["value"])
    assert len(words) == 1, f"one pip install in the {stage} image"
    env = {"PATH": "/usr/bin:/bin", **({"EXTRAS": extras} if extras is not None else {})}
    return subprocess.run(["sh", "-c", f"printf %s {words[0]}"], env=env, check=True,
                          capture_output=True, text=True).stdout


@pytest.mark.parametrize("stage", ["gateway", "gpu"])
def test_an_image_built_with_the_ner_extra_installs_it(stage: str) -> None:
    """Guardrails' names and places need the `ner` extra, which the images leave out unless the
    build asks: `docker build --build-arg EXTRAS=ner`."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert "ner" in extras
    assert _installed(stage, None) == "."
    assert _installed(stage, "") == "."
    assert _installed(stage, "ner") == ".[ner]"
    assert _installed(stage, "ner,local") == ".[ner,local]"


# --- the images: what compose mounts and what COPY puts there, for the user the image runs as

def _service_stage(service: dict[str, Any], built: dict[str, str]) -> str | None:
    """The Dockerfile target a compose service runs: its own build's, or its image's."""
    if "build" in service:
        target: str = service["build"]["target"]
        return target
    return built.get(service.get("image", ""))


def mount_problems(stage: Stage, mounts: list[str]) -> list[str]:
    """Why a mount (`source:target[:mode]`) would not work in `stage`, for its user.

    A named volume or a writable bind is written by the image's user: the image must make the
    mount point and give it to that user, or Docker makes it root's. A read-only bind of a
    config file needs neither."""
    problems = []
    for mount in mounts:
        source, target, *mode = mount.split(":")
        read_only = mode == ["ro"]
        if read_only and source.startswith("."):
            continue
        if not stage.made(target):
            problems.append(f"{target}: the {stage.name} image never creates it")
        elif stage.owner(target) != stage.user:
            problems.append(f"{target}: owned by {stage.owner(target)}, the image runs as "
                            f"{stage.user}")
    return problems


def test_every_compose_volume_is_a_path_the_image_s_user_owns() -> None:
    images = stages(ROOT / "Dockerfile")
    services = compose()["services"]
    built = {s["image"]: s["build"]["target"] for s in services.values() if "build" in s}
    checked = 0
    for name, service in services.items():
        target = _service_stage(service, built)
        if target is None:  # nginx, redis: someone else's image
            continue
        stage = images[target]
        assert stage.user != ROOT_USER, f"{name} runs as root"
        assert mount_problems(stage, service.get("volumes", [])) == [], name
        checked += len(service.get("volumes", []))
    assert checked >= 3, "the gateways' config and the worker's config and model cache"


def test_a_volume_the_image_never_created_fails_the_check() -> None:
    """The compose worker's model cache before the Dockerfile made it: root's, unwritable."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    line = next(line for line in _section(dockerfile, "cpu-worker").splitlines()
                if "/home/gateway/.cache" in line)
    stage = stages(_without(dockerfile, "cpu-worker", line))["cpu-worker"]
    worker = compose()["services"]["worker"]
    assert mount_problems(stage, worker["volumes"]) == [
        "/home/gateway/.cache: the cpu-worker image never creates it"]
    chowned_to_root = _without(dockerfile, "cpu-worker", line,
                               "RUN mkdir -p /home/gateway/.cache")
    assert mount_problems(stages(chowned_to_root)["cpu-worker"], worker["volumes"]) == [
        "/home/gateway/.cache: owned by root, the image runs as gateway"]


def test_what_copy_puts_in_an_image_its_user_cannot_rewrite() -> None:
    """The code and the config an image runs are root's: a compromised process running as the
    image's user cannot change them for the next start."""
    for stage in stages(ROOT / "Dockerfile").values():
        assert stage.user != ROOT_USER, f"the {stage.name} image runs as root"
        for path in ("/app/gateway", "/app/providers", "/app/pyproject.toml"):
            assert stage.owner(path) == ROOT_USER, (stage.name, path)
        for path, owner in stage.owners.items():
            writable = owner == stage.user
            assert not writable or path.startswith(f"/home/{stage.user}"), (stage.name, path)


def test_each_image_is_built_once_and_the_cluster_runs_the_image_s_user() -> None:
    services = compose()["services"]
    builds = [(s["build"]["target"], s.get("image")) for s in services.values() if "build" in s]
    assert len(builds) == len(set(builds)), f"an image is built twice: {builds}"
    built = {image for _, image in builds}
    for name, service in services.items():
        if service.get("image") in built:  # else compose asks Docker Hub for it first
            assert service.get("pull_policy") == "never", f"{name} would pull a local image"
    gateway = stages(ROOT / "Dockerfile")["gateway"]
    pod = next(m for m in manifests() if m["metadata"]["name"] == "llms-gateway"
               and m["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == gateway.uids[gateway.user]


def test_every_supervisor_waits_for_the_drain_before_it_kills() -> None:
    """SIGTERM gives streams `server.drain_timeout`, then the server kills its workers
    KILL_MARGIN later: compose and Kubernetes must not SIGKILL the gateway before that."""
    from gateway.core.settings import ServerConfig
    from gateway.edge.serving import KILL_MARGIN

    needed = ServerConfig().drain_timeout + KILL_MARGIN
    for name, service in compose()["services"].items():
        if "gateway" in name:
            grace = service["stop_grace_period"]
            assert grace.endswith("s") and float(grace[:-1]) >= needed, name
    for manifest in manifests():
        if manifest["kind"] == "Deployment" and manifest["metadata"]["name"] == "llms-gateway":
            assert manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= needed
    comment = (DEPLOY / "k8s" / "gateway.yaml").read_text()
    assert f"server.drain_timeout ({ServerConfig().drain_timeout:g} s)" in comment


def test_the_gateway_image_keeps_its_state_where_its_user_can_write(tmp_path: Path) -> None:
    """One process with no database.url keeps its keys in SQLite in the state directory: the
    image points it at a directory its user owns, a volume so it outlives the container."""
    def where(dockerfile: str) -> tuple[str, Stage]:
        stage = stages(dockerfile)["gateway"]
        return stage.env["LLMS_STATE_DIR"], stage

    dockerfile = (ROOT / "Dockerfile").read_text()
    directory, stage = where(dockerfile)
    assert stage.owner(directory) == stage.user != ROOT_USER
    assert directory in stage.volumes
    alone = json.loads((DEPLOY / "llms.json").read_text())
    del alone["database"]
    snapshot = parse(json.dumps(alone), tmp_path / "llms.json", {**ENV, **stage.env})
    assert snapshot.database.url == f"sqlite:///{directory}/gateway.db"

    line = next(line for line in _section(dockerfile, "gateway").splitlines()
                if line.startswith("RUN install -d") and directory in line)
    directory, stage = where(_without(dockerfile, "gateway", line))
    assert stage.owner(directory) is None, "never made: the first start could not write it"


def test_the_migrations_ship_in_the_installed_package() -> None:
    """Every image installs the gateway with `pip install .`, which copies what setuptools is
    told to: Alembic's env.py and each version must be package data, or the image's start
    cannot migrate the database. (A wheel built from the tree lists them.)"""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["gateway"]
    package = ROOT / "gateway"
    scripts = [PurePosixPath(path.relative_to(package).as_posix())
               for path in (package / "accounts" / "migrations").rglob("*.py")]
    assert PurePosixPath("accounts/migrations/env.py") in scripts
    assert any(path.parent.name == "versions" for path in scripts)
    # match() anchors at the right: a glob must name as many parts as the path it covers.
    left_out = [str(path) for path in scripts if not any(
        path.match(glob) and len(PurePosixPath(glob).parts) == len(path.parts)
        for glob in globs)]
    assert left_out == []
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert not any(PurePosixPath("gateway", str(path)).match(rule) for path in scripts
                   for rule in ignored if not rule.startswith("#"))


# --- the accounts database: one PostgreSQL that every replica uses, ready before they start

def interpolate(value: str, environ: Mapping[str, str]) -> str:
    """`${NAME}`, `${NAME:?message}` and `${NAME:-default}` read from `environ`, as compose
    does (an unset NAME with `:?` is a KeyError here, a refusal to start there)."""
    def one(match: re.Match[str]) -> str:
        name, how, default = match.group(1), match.group(2), match.group(3)
        if how == ":-":
            return environ.get(name) or default
        return environ[name]

    return re.sub(r"\$\{(\w+)(?:(:[-?])([^}]*))?\}", one, value)


def service_env(service: dict[str, Any]) -> dict[str, str]:
    return {name: interpolate(str(value), OPERATOR)
            for name, value in service.get("environment", {}).items()}


def gateways(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services running the gateway with deploy/llms.json."""
    return {name: s for name, s in doc["services"].items()
            if "./llms.json:/etc/llms/llms.json:ro" in s.get("volumes", [])}


def database_problems(doc: dict[str, Any]) -> list[str]:
    """Why the compose replicas would not all use one PostgreSQL, ready before they start."""
    services = doc["services"]
    postgres = services.get("postgres")
    if postgres is None:
        return ["no postgres service"]
    problems = []
    if postgres.get("ports"):
        problems.append("postgres is published")
    probe = postgres.get("healthcheck", {}).get("test", [])
    if "pg_isready" not in probe or "-h" not in probe:
        problems.append("postgres: no pg_isready over TCP (the socket answers during its init)")
    data = [v.split(":")[0] for v in postgres.get("volumes", [])
            if v.split(":")[1] == "/var/lib/postgresql/data"]
    if not data or data[0] not in doc.get("volumes", {}):
        problems.append("postgres: its data is not on a named volume")
    own = service_env(postgres)
    wanted = ("gateway", own.get("POSTGRES_PASSWORD"), "postgres", POSTGRES_PORT, "/gateway")
    text = (DEPLOY / "llms.json").read_text()
    for name, service in gateways(doc).items():
        if service.get("depends_on", {}).get("postgres") != {"condition": "service_healthy"}:
            problems.append(f"{name} may start before postgres is ready")
        try:
            url = parse(text, DEPLOY / "llms.json", service_env(service)).database.url
        except ConfigError as exc:
            problems.append(f"{name}: {exc}")
            continue
        assert url is not None
        engine_url(url)
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "postgresql" or (parts.username, parts.password, parts.hostname,
                                            parts.port, parts.path) != wanted:
            problems.append(f"{name}: database.url is not postgres' "
                            f"({parts.scheme}://{parts.hostname}:{parts.port}{parts.path})")
        if (own.get("POSTGRES_USER"), own.get("POSTGRES_DB")) != ("gateway", "gateway"):
            problems.append("postgres: not the user and database the gateways name")
    return problems


def test_the_replicas_share_one_postgres_that_is_healthy_before_they_start() -> None:
    assert len(gateways(compose())) == 2
    assert compose()["services"]["postgres"]["image"] == "postgres:16-alpine"
    assert database_problems(compose()) == []


def _gateway_2(doc: dict[str, Any]) -> dict[str, Any]:
    service: dict[str, Any] = doc["services"]["gateway-2"]
    return service


COMPOSE_BREAKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "started, not healthy": lambda doc: _gateway_2(doc)["depends_on"].update(
        postgres={"condition": "service_started"}),
    "no depends_on": lambda doc: _gateway_2(doc)["depends_on"].pop("postgres"),
    "no database url": lambda doc: _gateway_2(doc)["environment"].pop("LLMS_DATABASE_URL"),
    "another host": lambda doc: _gateway_2(doc)["environment"].update(
        LLMS_DATABASE_URL="postgresql://gateway:x@db:5432/gateway"),
    "sqlite": lambda doc: _gateway_2(doc)["environment"].update(
        LLMS_DATABASE_URL="sqlite:////tmp/gateway.db"),
    "another password": lambda doc: doc["services"]["postgres"]["environment"].update(
        POSTGRES_PASSWORD="${LLMS_GATEWAY_KEY}"),
    "socket probe": lambda doc: doc["services"]["postgres"]["healthcheck"].update(
        test=["CMD", "pg_isready", "-U", "gateway"]),
    "published": lambda doc: doc["services"]["postgres"].update(ports=["5432:5432"]),
    "anonymous data": lambda doc: doc["volumes"].pop("postgres-data"),
}


@pytest.mark.parametrize("change", COMPOSE_BREAKS)
def test_a_compose_file_whose_replicas_could_not_share_the_database_is_caught(
        change: str) -> None:
    doc = json.loads(json.dumps(compose()))  # the replicas' shared anchor made two copies
    COMPOSE_BREAKS[change](doc)
    assert database_problems(doc)


@pytest.mark.skipif(not PostgresServer.available(), reason="PostgreSQL's binaries are missing")
def test_a_key_made_on_one_compose_replica_is_known_to_the_other(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    """The replicas' `database` section and `LLMS_DATABASE_URL` as compose gives them, the
    host `postgres` standing for a local server that, as the image's, wants the password."""
    postgres = PostgresServer(password=OPERATOR["LLMS_DATABASE_PASSWORD"]).start()
    try:
        env = service_env(compose()["services"]["gateway-1"])
        env["LLMS_DATABASE_URL"] = env["LLMS_DATABASE_URL"].replace(
            f"@postgres:{POSTGRES_PORT}/", f"@127.0.0.1:{postgres.port}/")
        assert env["LLMS_DATABASE_URL"] == postgres.url
        database = json.loads((DEPLOY / "llms.json").read_text())["database"]
        doc = priced(upstream_factory("billing"), "m", database=database)
        env["LLMS_GATEWAY_KEY"] = ""  # the static key: not this story's
        first, second = (start_gateway(doc, env=env) for _ in range(2))
        made = Admin(first).key(name="ci-bot", models=["m"])
        wait_until(lambda: chat(second, made["key"]).status_code == 200, within=2)
        assert chat(first, made["key"]).status_code == 200
    finally:
        postgres.close()


# A password in a URL, or a variable standing for one (`${NAME…}` compose's, `$(NAME)` the
# kubelet's).
URL_PASSWORD = re.compile(r"\w+://[^:/@\s\"']+:(\$\{[^}]*\}|\$\([^)]*\)|[^@\s\"']+)@")
# What stands for a value, never one: compose's `${NAME…}`, the gateway's `$NAME`, the kubelet's
# `$(NAME)` and a shell's `$(command)`.
VARIABLE = re.compile(r"\$\{\w+(:[-?][^}]*)?\}|\$\([^)]*\)|\$\w+")
SECRET_NAME = re.compile(r"password|secret|token|_key$", re.IGNORECASE)


def plain_secrets(text: str) -> list[str]:
    """Passwords written in a deploy file's text: in a URL, or given to a variable that holds
    one (`NAME: value` or `NAME=value`)."""
    found = [password for password in URL_PASSWORD.findall(text)
             if not VARIABLE.fullmatch(password)]
    for name, value in re.findall(r"\b(\w+)\"?[:=] *\"?(\$\{[^}]*\}|\$\([^)]*\)|[^\s\",]*)",
                                  text):
        if SECRET_NAME.search(name) and value[:1] not in ("", "{", "[") \
                and not VARIABLE.fullmatch(value):
            found.append(f"{name}: {value}")
    return found


def deploy_files() -> list[Path]:
    return [ROOT / "Dockerfile", *sorted(p for p in DEPLOY.rglob("*") if p.is_file())]


def test_no_deploy_file_holds_a_password() -> None:
    """Every secret reaches the processes from the environment or a Secret."""
    assert len(deploy_files()) >= 9
    for path in deploy_files():
        assert plain_secrets(path.read_text()) == [], path
    assert service_env(compose()["services"]["postgres"])["POSTGRES_PASSWORD"] == \
        OPERATOR["LLMS_DATABASE_PASSWORD"]


@pytest.mark.parametrize("written", [
    'LLMS_DATABASE_URL: "postgresql://gateway:hunter2hunter2@postgres:5432/gateway"',
    "POSTGRES_PASSWORD: hunter2hunter2",
    '"url": "postgresql://gateway:hunter2@db.internal:5432/gateway"',
    "ENV LLMS_GATEWAY_KEY=sk-written-in-the-image"])
def test_a_password_written_in_a_deploy_file_is_caught(written: str) -> None:
    assert plain_secrets(written)


def _section(dockerfile: str, stage: str) -> str:
    """The Dockerfile from `stage`'s FROM line on."""
    return dockerfile[dockerfile.index(f" AS {stage}\n"):]


def _without(dockerfile: str, stage: str, line: str, instead: str = "") -> str:
    """The Dockerfile with `line` of `stage` (and of no other stage) replaced by `instead`."""
    at = dockerfile.index(f" AS {stage}\n")
    return dockerfile[:at] + dockerfile[at:].replace(line + "\n", instead + "\n", 1)
