"""Which of a request's candidates call the tools it offers: an engine that would ignore
`tools` (llama.cpp with a plain chat format) answers in text as if none were given, which no
client can tell from a model that chose not to call one."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.core.settings import Route
from providers.contract.errors import InvalidRequest
from providers.contract.provider import Provider


def tool_routes(model: str, routes: tuple[Route, ...],
                providers: Mapping[str, Provider]) -> tuple[Route, ...]:
    """The candidates that call tools; a 400 naming `tools` when none does."""
    able = tuple(r for r in routes if (p := providers.get(r.provider)) is None
                 or p.calls_tools(r.upstream_model))
    if not able:
        names = ", ".join(sorted({r.provider for r in routes}))
        raise InvalidRequest(f"Model '{model}' cannot call tools: its providers ({names}) run "
                             "it on an engine that would ignore them", param="tools")
    return able
