"""The origin check: a web page the user happens to visit must not drive the gateway.

A browser lets any page send a "simple" request to any address (a `text/plain` POST needs no
preflight) and answers a page at `evil.example` whose name was re-pointed at 127.0.0.1 (DNS
rebinding) as if it were that page's own server. Either would let a page spend credits or
disable providers through a gateway on this machine, which needs no key. So, before any route
reads the request:

- a request carrying `Origin` (browsers send it on every cross-site request, and on every
  POST) is refused unless that origin is in `server.cors_origins` (`"*"`: any), or is the
  gateway's own origin under a name below;
- on a loopback bind, a request whose `Host` is not a loopback name (`localhost`,
  `127.0.0.1`, `[::1]`, with or without a port) nor the configured or bound host is refused:
  only a rebound name reaches a loopback socket under another one.

A non-loopback bind is reached under names the gateway cannot know (DNS names, proxies,
addresses), so its `Host` is not checked; such a bind needs `server.api_keys` (or an explicit
`--allow-unauthenticated`), which no page holds. Clients that are not browsers (curl, the SDKs)
send no `Origin` and are unaffected. A refusal is 403 `permission_denied` in the envelope,
naming the header as its `param`.
"""

from __future__ import annotations

from gateway.config.snapshots import is_loopback
from gateway.core.errors import PermissionDenied
from gateway.core.settings import ServerConfig

# Addresses a server binds to mean "every interface"; as a name they are no gateway's own.
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})
PASSED_HOSTS = 64


def host_name(host: str) -> str:
    """The name in a `Host` header (or a bind address), without its port, lower-cased; an IPv6
    address in brackets, as a `Host` header writes it."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    if host.count(":") > 1:  # a bare IPv6 address, as `--host ::1` gives it
        return f"[{host}]"
    return host.partition(":")[0]


class Origins:
    """Which origins and `Host` names this gateway answers (`refusal`): checked by `Front`
    before any route reads a request, from the head it reads once (`gateway.edge.guard.Head`)."""

    __slots__ = ("any_origin", "loopback", "names", "origins", "passed")

    def __init__(self, *, origins: tuple[str, ...], bind_host: str, configured_host: str
                 ) -> None:
        self.any_origin = "*" in origins
        self.origins = frozenset(origins)
        self.loopback = is_loopback(bind_host)
        self.names = frozenset({host_name(bind_host), host_name(configured_host)}) - _WILDCARDS
        # `Host` values already let through, as sent: a request with one and no `Origin` needs
        # no parsing. Bounded: any address of 127.0.0.0/8 is a loopback name.
        self.passed: set[bytes] = set()

    @classmethod
    def of(cls, server: ServerConfig, bind_host: str) -> Origins:
        """The origins of llms.json's `server` section, served on `bind_host`."""
        return cls(origins=server.cors_origins, bind_host=bind_host,
                   configured_host=server.host)

    def known(self, name: str) -> bool:
        """Whether `name` (a `Host`'s, without port) is a name this gateway answers as itself."""
        return name in self.names or is_loopback(name)

    def refusal(self, sent: bytes | None, origins: list[str] | None) -> PermissionDenied | None:
        """Why a request with `Host` `sent` and these `Origin` values is refused, or None."""
        if not origins and (sent is None or sent in self.passed):
            return None
        host = None if sent is None else sent.decode("latin-1")
        named = None if host is None else host_name(host)
        if self.loopback and named is not None and not self.known(named):
            return PermissionDenied("This gateway listens on a loopback address and answers "
                                    "only its loopback names (localhost, 127.0.0.1, [::1]) or "
                                    "server.host", param="Host")
        for origin in origins or ():
            if not self._allowed(origin, host, named):
                return PermissionDenied("Requests from web pages need their origin listed in "
                                        "server.cors_origins", param="Origin")
        if sent is not None and len(self.passed) < PASSED_HOSTS:
            self.passed.add(sent)
        return None

    def _allowed(self, origin: str, host: str | None, named: str | None) -> bool:
        if self.any_origin or origin in self.origins:
            return True
        # The gateway's own pages (the status page) under a name it knows as its own.
        return (host is not None and named is not None and self.known(named)
                and origin.lower() in (f"http://{host.lower()}", f"https://{host.lower()}"))
