"""Prompts and resources of every configured MCP server (or of one), for one key, named as its
tools are: a prompt or a resource `{server}_{name}` (`names.namespaced`), a resource's URI and a
template's `{server}+{uri}` (`names.namespaced_uri`), so `/mcp` tells which server reads it.

A key sees the prompts and resources of the servers it may use: those its allow-lists let it
call some tool of (`Hub.may_use`; every server without a list). Getting a prompt or reading a
resource of any other server is the same error as an unknown one. Neither is a tool call: they
are not limited, priced nor audited as calls are.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from mcp.shared.exceptions import MCPError

from gateway.core.call import Identity
from gateway.mcp.hub import FIRST_CONNECT, Hub, ToolUnknown
from gateway.mcp.names import namespaced, namespaced_uri, server_of_uri
from gateway.mcp.unavailable import Unavailable, UpstreamError
from gateway.mcp.upstream import Link

# What addresses each item of a listing, beside its `name`, by the field MCP's result names it.
ADDRESSED = {"resources": "uri", "resourceTemplates": "uriTemplate"}
# What a per-key answer must not carry of the upstream's own caching hints.
UPSTREAM_CACHING = ("ttlMs", "cacheScope", "resultType")


@dataclass(slots=True)
class Offered:
    """What a key may see of one kind: the items as clients get them, and the servers that
    could not say."""

    items: list[dict[str, Any]] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)


class NotFound(ToolUnknown):
    """No prompt or resource of that name for this key: unknown, or of a server it may not use
    (the same error, on purpose)."""

    def __init__(self, kind: str, name: str) -> None:
        Exception.__init__(self, f"Unknown {kind}: {name[:256]}")


class Catalog:
    """The servers' prompts and resources, as `hub`'s keys may see them."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    async def listed(self, identity: Identity | None, kind: str, server: str | None = None
                     ) -> Offered:
        """The prompts, resources or resource templates (`kind`, one of `upstream.OFFERED`)
        `identity` may see, of every server (or of `server`), listed now and in parallel;
        the servers that could not answer are named, not waited for."""
        links = await self._usable(identity, server)
        found = await asyncio.gather(*(_offered(link, kind) for link in links))
        offered = Offered()
        for link, items in zip(links, found, strict=True):
            if items is None:
                offered.unavailable.append(link.server.name)
                continue
            offered.items += [self._shown(link.server.name, kind, item) for item in items]
        return offered

    async def prompt(self, identity: Identity | None, name: str,
                     arguments: dict[str, str] | None, server: str | None = None
                     ) -> dict[str, Any]:
        """The prompt `name` got for `identity` (`GetPromptResult` as JSON); NotFound,
        Unavailable, UpstreamError."""
        separator = self.hub.separator
        for link in await self._usable(identity, server,
                                       lambda s: name.startswith(f"{s}{separator}")):
            for prompt in await link.offered("prompts"):
                if namespaced(link.server.name, prompt.name, separator) == name:
                    return await _got(link, partial(_get_prompt, name=prompt.name,
                                                    arguments=arguments))
        raise NotFound("prompt", name)

    async def read(self, identity: Identity | None, uri: str, server: str | None = None
                   ) -> dict[str, Any]:
        """The resource at `uri` read for `identity` (`ReadResourceResult` as JSON, each
        content's URI as the client named it); NotFound, Unavailable, UpstreamError."""
        owner, address = server_of_uri(uri)
        for link in await self._usable(identity, server, lambda s: s == owner):
            result = await _got(link, partial(_read_resource, uri=address))
            for content in result.get("contents") or ():
                if isinstance(content.get("uri"), str):
                    content["uri"] = namespaced_uri(link.server.name, content["uri"])
            return result
        raise NotFound("resource", uri)

    async def _usable(self, identity: Identity | None, server: str | None,
                      named: Callable[[str], bool] = lambda _: True) -> list[Link]:
        """The links of the servers `identity` may use (of `server` alone, when given) that
        `named` picks, their first connection awaited."""
        await self.hub.started()
        links = [link for name, link in self.hub.links.items()
                 if server in (None, name) and named(name)]
        await asyncio.gather(*(link.ready(FIRST_CONNECT) for link in links
                               if link.state == "starting"))
        return [link for link in links if self.hub.may_use(identity, link.server.name)]

    def _shown(self, server: str, kind: str, item: Any) -> dict[str, Any]:
        shown: dict[str, Any] = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        shown["name"] = namespaced(server, shown["name"], self.hub.separator)
        if (field := ADDRESSED.get(kind)) is not None:
            shown[field] = namespaced_uri(server, shown[field])
        return shown


async def _offered(link: Link, kind: str) -> list[Any] | None:
    with contextlib.suppress(Unavailable, MCPError):
        return await link.offered(kind)
    return None


async def _got(link: Link, ask: Callable[[Any], Any]) -> dict[str, Any]:
    """A prompt got or a resource read through `link`, as JSON."""
    try:
        result = await link.asked(ask)
    except MCPError as exc:
        raise UpstreamError(exc.code, exc.error.message) from exc
    shown: dict[str, Any] = result.model_dump(mode="json", by_alias=True, exclude_none=True)
    for hint in UPSTREAM_CACHING:
        shown.pop(hint, None)
    return shown


async def _get_prompt(client: Any, name: str, arguments: dict[str, str] | None) -> Any:
    return await client.get_prompt(name, arguments)


async def _read_resource(client: Any, uri: str) -> Any:
    return await client.read_resource(uri)
