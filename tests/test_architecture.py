"""The architecture a newcomer is promised: provider kinds depend on the contract only, the app
finds them through entry points, and nothing reaches into a server's private internals."""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# What the app may import of the provider side: the contract, the wire formats, the kinds'
# registry (`providers.load_kinds`) and the shipped transport it builds once per process.
APP_MAY_IMPORT = ("providers", "providers.contract", "providers.wire", "providers.transport")


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def _allowed(name: str) -> bool:
    return name == "providers" or any(name == allowed or name.startswith(allowed + ".")
                                      for allowed in APP_MAY_IMPORT[1:])


def _modules(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_provider_kinds_import_nothing_of_the_app() -> None:
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path in _modules("providers")
                 for name in _imports(path) if name == "gateway" or name.startswith("gateway.")]

    assert offenders == []


def test_the_contract_imports_no_provider_kind() -> None:
    offenders = [f"{path.relative_to(ROOT)}: {name}"
                 for path in sorted((ROOT / "providers" / "contract").glob("*.py"))
                 for name in _imports(path)
                 if name.startswith("providers.")
                 and not name.startswith(("providers.contract", "providers.wire"))]

    assert offenders == []


def test_the_app_names_no_provider_kind_and_finds_them_through_entry_points() -> None:
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path in _modules("gateway")
                 for name in _imports(path)
                 if name.split(".")[0] == "providers" and not _allowed(name)]
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]

    assert offenders == []
    assert set(declared["llms_gateway.providers"]) >= {"openai", "anthropic", "google",
                                                       "ollama", "pool"}


def test_no_code_touches_a_server_s_private_internals() -> None:
    for path in _modules("gateway") + _modules("providers"):
        text = path.read_text()
        assert "uvicorn.protocols" not in text, path
        assert "__self__" not in text, path


def test_the_hand_written_http_client_and_dns_cache_are_gone() -> None:
    assert not (ROOT / "providers" / "wire.py").exists()
    assert not (ROOT / "providers" / "resolver.py").exists()


def test_the_request_path_has_one_sse_reader_one_failover_loop_and_no_routing_context_var(
) -> None:
    sources = {path: path.read_text() for path in _modules("gateway") + _modules("providers")}
    reader = ROOT / "providers" / "wire" / "sse.py"
    splitting = [str(p.relative_to(ROOT)) for p, text in sources.items()
                 if p != reader and ('split(b"\\n\\n")' in text or "split(b'\\n\\n')" in text)]
    context_vars = [str(p.relative_to(ROOT)) for p, text in sources.items()
                    if "ContextVar" in text]
    loops = [str(p.relative_to(ROOT)) for p, text in sources.items()
             if "while (worker := pool.pick(" in text or "while at < len(candidates)" in text]

    assert splitting == [] and context_vars == [] and loops == []


def test_the_pipeline_reads_top_to_bottom_in_under_200_lines() -> None:
    assert len((ROOT / "gateway" / "pipeline" / "relay.py").read_text().splitlines()) < 200


# The top-level folders of gateway/, bottom up: a folder imports only folders on lower layers,
# so none imports another that imports it (docs/architecture.md draws the same picture).
LAYERS = {
    "core": 0,
    "config": 1, "stores": 1,
    "routing": 2,
    "observe": 3,
    "adapters": 4,
    "accounts": 5, "queue": 5, "idempotency": 5, "cache": 5, "guardrails": 5,
    "state": 6, "requestlog": 6,
    "pipeline": 7, "mcp": 7,
    "batches": 8, "realtime": 8,
    "edge": 9,
    "console": 10,
}
TOP = 11  # app.py, cli*.py, __main__.py: the composition


def _layer(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    if parts[0] != "gateway" or len(parts) < 2:
        return None
    return parts[1], LAYERS.get(parts[1], TOP)


def test_the_gateway_s_folders_import_only_downwards() -> None:
    upward = []
    for path in _modules("gateway"):
        owner = path.relative_to(ROOT / "gateway").parts[0].removesuffix(".py")
        if owner not in LAYERS and path.parent != ROOT / "gateway":
            upward.append(f"{path.relative_to(ROOT)}: a folder with no layer")
            continue
        rank = LAYERS.get(owner, TOP)
        for name in _imports(path):
            found = _layer(name)
            if found is not None and found[0] != owner and found[1] >= rank < TOP:
                upward.append(f"{path.relative_to(ROOT)}: {name}")

    assert upward == []


def test_no_module_is_over_400_lines() -> None:
    long = [f"{path.relative_to(ROOT)}: {n}"
            for path in _modules("gateway") + _modules("providers")
            if (n := len(path.read_text().splitlines())) > 400]

    assert long == []


def test_nothing_below_the_edge_sees_asgi() -> None:
    below = [path for path in _modules("gateway")
             if LAYERS.get(path.relative_to(ROOT / "gateway").parts[0], TOP) < LAYERS["batches"]]
    offenders = [f"{path.relative_to(ROOT)}: {name}" for path in below
                 for name in _imports(path) if name.startswith(("litestar", "starlette"))]

    assert offenders == []
