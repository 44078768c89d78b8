"""JSON-RPC for MCP clients of both revisions in use, framework-free: one message in, its answer
out (`answer`), the hub behind it. The SDK's wire types and version tables are the reference:
methods, error codes and result shapes are theirs.

2025-11-25 clients `initialize` (the edge opens their session) and send the version in a
header; 2026-07-28 clients send version and capabilities in each request's `_meta`, ask
`server/discover`, and read `resultType`, `ttlMs` and `cacheScope` on results (a listing is
`private`: what a key may see is its own).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

import mcp_types as types
from mcp_types.version import (
    HANDSHAKE_PROTOCOL_VERSIONS,
    LATEST_HANDSHAKE_VERSION,
    MODERN_PROTOCOL_VERSIONS,
)

from gateway.core.call import Identity
from gateway.guardrails.screening import GuardrailViolation
from gateway.mcp.catalog import Catalog
from gateway.mcp.hub import UNAVAILABLE_META, Hub, ToolUnknown
from gateway.mcp.unavailable import TimedOut, Unavailable, UpstreamError
from gateway.mcp.upstream import Progress

# The JSON-RPC code a refused call (a key's limit or budget) carries beside its HTTP 429.
REFUSED = -32029
# ... and the one a call a guardrail blocked carries (its arguments, or its result).
BLOCKED = -32030
Notify = Callable[[dict[str, Any]], Awaitable[None]]


def _version() -> str:
    try:
        return metadata.version("llms-gateway")
    except metadata.PackageNotFoundError:
        return "0"


SERVER_INFO = {"name": "llms-gateway", "version": _version()}
CAPABILITIES: dict[str, Any] = {"tools": {"listChanged": False},
                                 "prompts": {"listChanged": False},
                                 "resources": {"subscribe": False, "listChanged": False}}
# The listings of prompts and resources, by method: what the result names its items.
LISTS = {"prompts/list": "prompts", "resources/list": "resources",
         "resources/templates/list": "resourceTemplates"}


@dataclass(frozen=True, slots=True)
class Asking:
    """Who asks, through which path, on which revision."""

    identity: Identity | None
    server: str | None  # `/mcp/{server}`; None: every server
    version: str
    notify: Notify | None = None  # where a call's progress goes (an SSE answer), if anywhere

    @property
    def modern(self) -> bool:
        return self.version in MODERN_PROTOCOL_VERSIONS


def agreed(requested: object) -> str:
    """The revision `initialize` agrees on: the client's when it is one we speak, else ours."""
    if isinstance(requested, str) and requested in HANDSHAKE_PROTOCOL_VERSIONS:
        return requested
    return LATEST_HANDSHAKE_VERSION


def initialized(version: str) -> dict[str, Any]:
    """The `initialize` result."""
    return {"protocolVersion": version, "capabilities": CAPABILITIES, "serverInfo": SERVER_INFO,
            "instructions": "Tools, prompts and resources of every MCP server this gateway "
                            "key may use, named {server}_{name} (a resource {server}+{uri})."}


def error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error answer."""
    body: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        body["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": body}


async def answer(hub: Hub, asking: Asking, message: dict[str, Any]) -> dict[str, Any]:
    """The JSON-RPC answer to the request `message`; a GatewayError (a refusal the HTTP answer
    carries: 429) is raised for the edge to shape."""
    request_id = message.get("id")
    method = message.get("method")
    params = message.get("params")
    if params is not None and not isinstance(params, dict):
        return error(request_id, types.INVALID_PARAMS, "params must be an object")
    params = params or {}
    try:
        result = await _dispatch(hub, asking, str(method), params)
    except ToolUnknown as exc:
        return error(request_id, types.INVALID_PARAMS, str(exc))
    except Unavailable as exc:
        code = types.REQUEST_TIMEOUT if isinstance(exc, TimedOut) else types.INTERNAL_ERROR
        return error(request_id, code, str(exc))
    except UpstreamError as exc:
        return error(request_id, exc.code, str(exc))
    except GuardrailViolation as exc:  # names the guardrail and category, never the text
        return error(request_id, BLOCKED, f"{exc.code}: {exc}",
                     {"code": exc.code, "guardrail": exc.guardrail, "category": exc.category})
    except _NoMethod:
        return error(request_id, types.METHOD_NOT_FOUND, f"Method not found: {str(method)[:64]}")
    except _BadParams as exc:
        return error(request_id, types.INVALID_PARAMS, str(exc))
    if asking.modern:
        result.setdefault("resultType", "complete")
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


class _NoMethod(Exception):
    pass


class _BadParams(Exception):
    pass


async def _dispatch(hub: Hub, asking: Asking, method: str, params: dict[str, Any]
                    ) -> dict[str, Any]:
    if method == "tools/list":
        listing = await hub.list_tools(asking.identity, asking.server)
        result: dict[str, Any] = {"tools": listing.tools}
        if listing.unavailable:
            result["_meta"] = {UNAVAILABLE_META: listing.unavailable}
        if asking.modern:  # what a key may see is its own: never cached for another
            result.update(ttlMs=0, cacheScope="private")
        return result
    if method == "tools/call":
        return await _call(hub, asking, params)
    if method == "ping" or method == "logging/setLevel":
        return {}
    if method == "server/discover":
        result = {"supportedVersions": [*MODERN_PROTOCOL_VERSIONS, *HANDSHAKE_PROTOCOL_VERSIONS],
                  "capabilities": CAPABILITIES, "serverInfo": SERVER_INFO,
                  "ttlMs": 0, "cacheScope": "private"}
        return result
    if method in LISTS or method in ("prompts/get", "resources/read"):
        return await _catalogued(Catalog(hub), asking, method, params)
    raise _NoMethod


async def _catalogued(catalog: Catalog, asking: Asking, method: str, params: dict[str, Any]
                      ) -> dict[str, Any]:
    """A method of prompts or resources answered."""
    if method in LISTS:
        return await _listed(catalog, asking, LISTS[method])
    if method == "prompts/get":
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str):
            raise _BadParams("params.name must be the prompt's name")
        if arguments is not None and not (isinstance(arguments, dict) and all(
                isinstance(value, str) for value in arguments.values())):
            raise _BadParams("params.arguments must map names to strings")
        return await catalog.prompt(asking.identity, name, arguments, asking.server)
    uri = params.get("uri")
    if not isinstance(uri, str):
        raise _BadParams("params.uri must be the resource's URI")
    return await catalog.read(asking.identity, uri, asking.server)


async def _listed(catalog: Catalog, asking: Asking, kind: str) -> dict[str, Any]:
    """A listing of prompts or resources: every page at once, the servers that could not
    answer named in `_meta`, never cached for another key."""
    offered = await catalog.listed(asking.identity, kind, asking.server)
    result: dict[str, Any] = {kind: offered.items}
    if offered.unavailable:
        result["_meta"] = {UNAVAILABLE_META: offered.unavailable}
    if asking.modern:
        result.update(ttlMs=0, cacheScope="private")
    return result


async def _call(hub: Hub, asking: Asking, params: dict[str, Any]) -> dict[str, Any]:
    name, arguments = params.get("name"), params.get("arguments")
    if not isinstance(name, str):
        raise _BadParams("params.name must be the tool's name")
    if arguments is not None and not isinstance(arguments, dict):
        raise _BadParams("params.arguments must be an object")
    meta = params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    relay: Progress | None = None
    if token is not None and asking.notify is not None:
        notify = asking.notify

        async def relayed(progress: float, total: float | None, message: str | None) -> None:
            sent: dict[str, Any] = {"progressToken": token, "progress": progress}
            if total is not None:
                sent["total"] = total
            if message is not None:
                sent["message"] = message
            await notify({"jsonrpc": "2.0", "method": "notifications/progress",
                          "params": sent})

        relay = relayed
    return await hub.call_tool(asking.identity, name, arguments, progress=relay,
                               server=asking.server)
