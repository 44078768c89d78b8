"""Will the request fit? Its size estimated before the first try, against each model's window.

The estimate is `count_tokens`'s (`gateway.core.tokens.chat_tokens`: about four
characters a token, a few per message and tool) plus the output the request asks for. A
candidate whose window (or longest answer) is known and too small is skipped untried, listed in
the attempts as `context_too_small`: LiteLLM's context fallbacks try such a model and fail, or
silently fall back to a smaller one. A candidate whose window is unknown is tried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.core.errors import Attempt
from gateway.core.messages import to_chat
from gateway.core.settings import Route
from gateway.core.tokens import chat_tokens

TOO_SMALL = "context_too_small"
# The fields each endpoint's clients ask for an answer's length with.
OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


@dataclass(frozen=True, slots=True)
class Size:
    """What a request needs: its prompt (estimated) and the answer it asks for (0: unsaid)."""

    prompt: int
    output: int

    @property
    def total(self) -> int:
        return self.prompt + self.output

    def fits(self, route: Route) -> bool:
        """Whether `route`'s model can take it, as far as its known numbers say."""
        if route.context_window is not None and self.total > route.context_window:
            return False
        return route.max_output_tokens is None or self.output <= route.max_output_tokens


def size(endpoint: str, body: Mapping[str, Any]) -> Size | None:
    """The request's size, or None for an endpoint that generates nothing (embeddings,
    count_tokens) or a body the estimate cannot read."""
    try:
        if endpoint == "chat/completions":
            prompt = chat_tokens(body)
        elif endpoint == "messages":
            prompt = chat_tokens(to_chat(dict(body)))
        elif endpoint in ("completions", "responses"):
            said = [body.get(name) for name in ("prompt", "input", "instructions")]
            prompt = (len(msgspec.json.encode([s for s in said if s])) + 3) // 4
        else:
            return None
    except (AttributeError, KeyError, TypeError, ValueError):
        return None  # a shape only the upstream can judge: it is not skipped for size
    output = next((v for name in OUTPUT_FIELDS
                   if isinstance(v := body.get(name), int) and v > 0), 0)
    return Size(prompt, output)


def fitting(routes: tuple[Route, ...], need: Size | None
            ) -> tuple[tuple[Route, ...], list[Attempt]]:
    """The routes that can take the request, and an attempt for each one skipped."""
    if need is None:
        return routes, []
    kept = tuple(route for route in routes if need.fits(route))
    skipped = [Attempt(route.provider, None, TOO_SMALL, _why(route, need))
               for route in routes if route not in kept]
    return kept, skipped


def _why(route: Route, need: Size) -> str:
    if route.max_output_tokens is not None and need.output > route.max_output_tokens:
        return (f"skipped: {need.output} output tokens asked, {route.upstream_model} writes "
                f"at most {route.max_output_tokens}")
    return (f"skipped: about {need.total} tokens needed, {route.upstream_model} holds "
            f"{route.context_window}")
