"""What a passthrough request names, read as the upstream will read it (pure).

The allow-list is matched on the path exactly as it is sent: the raw path decoded once, its
slashes collapsed, re-encoded. A dot segment is refused however deeply it is encoded (`..`,
`%2e%2e`, `%252e%252e`): a URL library upstream or on the way may decode it once more and
resolve it, turning an allowed path into any path on the provider's host with its key. A path
or body that names a model is read too, so the key's model list and budget can apply.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import quote, unquote

import msgspec

from providers.contract.errors import InvalidRequest

# Kept as they are when the path is encoded again: RFC 3986's sub-delims, ':' and '@' (a
# Gemini path names `models/x:generateContent`).
_SAFE = "/:@!$&'()*+,;="
_SLASHES = re.compile(r"/{2,}")
_DEPTH = 8  # decodings looked through for a dot segment; more is not a path anyone sends
_PATH = "path"


class _Named(msgspec.Struct):
    model: str | None = None


def sent_path(raw: str) -> str:
    """The path as it goes upstream: `raw` (still percent-encoded) decoded once, its repeated
    slashes collapsed, encoded again. InvalidRequest (400) for a dot segment or a backslash at
    any depth of encoding, or a path not starting with '/'."""
    decoded = unquote(raw)
    deepest = decoded
    for _ in range(_DEPTH):
        again = unquote(deepest)
        if again == deepest:
            break
        deepest = again
    if "\\" in deepest or any(part in (".", "..")
                              for part in deepest.split("/")):
        raise InvalidRequest("The passthrough path has a dot segment or a backslash (perhaps "
                             "percent-encoded): send the path as the provider serves it",
                             param=_PATH)
    if not decoded.startswith("/"):
        raise InvalidRequest("The passthrough path must start with '/'", param=_PATH)
    return quote(_SLASHES.sub("/", decoded), safe=_SAFE)


def named_model(path: str, body: bytes, headers: Mapping[str, str]) -> str | None:
    """The model a request names: in its path (`.../models/<id>`, an action after ':' cut
    off), else in its JSON body's `model`."""
    parts = unquote(path).split("/")
    for index, part in enumerate(parts[:-1]):
        if part == "models" and parts[index + 1]:
            return parts[index + 1].split(":", 1)[0]
    if body and "json" in headers.get("content-type", "json"):
        try:
            return msgspec.json.decode(body, type=_Named).model
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
    return None
