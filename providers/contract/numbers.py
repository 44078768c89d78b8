"""Numbers no upstream can hold, found anywhere in a client's body.

An integer outside 64 bits (msgspec's own range: `int64` below zero, `uint64` above) or a
number past a double is refused as the client's error, naming its place, in fields the gateway
reads and in those it passes through alike: forwarded, it would be read differently by every
upstream (wrapped, rounded, or a 500 there). A bytes scan rules out nearly every body; only a
body with a run of 19 digits or a three-digit exponent (in a string or not) is decoded whole to
find the place.
"""

from __future__ import annotations

import json
from typing import Any

from providers.contract.errors import InvalidRequest

INT_MIN, INT_MAX = -(2**63), 2**64 - 1
# Nineteen digits reach past int64 below zero; an exponent needs three digits to pass a double.
# Found by `bytes` methods on a copy with every digit a `0` and signs dropped: a regular
# expression tries each position in Python's engine, many times slower on digit-rich text.
_DIGITS = bytes.maketrans(b"123456789E", b"000000000e")
_SIGNS = b"+-"
_RUN = b"0" * 19
_EXPONENT = b"0e000"
_LONGEST = len(str(INT_MAX))


class _Out:
    """What a number out of range decodes to, so the walk can find its place."""

    def __init__(self, what: str) -> None:
        self.what = what


class _Object(list[tuple[str, Any]]):
    """An object's pairs in order, duplicates kept: an upstream may read either of two."""


def _integer(text: str) -> Any:
    digits = len(text) - text.startswith("-")
    if digits < _LONGEST - 1 or (digits <= _LONGEST and INT_MIN <= int(text) <= INT_MAX):
        return None
    return _Out("Integer value out of range (past 64 bits)")


def _number(text: str) -> Any:
    if float(text) in (float("inf"), float("-inf")):
        return _Out("Number out of range")
    return None


def _first_out(tree: Any) -> tuple[_Out, str] | None:
    """The first number out of range in document order, and its place (`messages[0].x`)."""
    stack: list[tuple[Any, str]] = [(tree, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _Out):
            return node, path
        if isinstance(node, _Object):
            stack.extend((v, f"{path}.{k}" if path else k) for k, v in reversed(node))
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node))))
    return None


def check_numbers(raw: bytes) -> None:
    """Raise InvalidRequest naming the first number in `raw` that no upstream can hold; a body
    that is not JSON is left for the caller's decoder to report."""
    flat = raw.translate(_DIGITS, _SIGNS)
    if _RUN not in flat and _EXPONENT not in flat:
        return
    try:
        tree = json.loads(raw, parse_int=_integer, parse_float=_number,
                          object_pairs_hook=_Object)
    except (ValueError, RecursionError):
        return
    found = _first_out(tree)
    if found is not None:
        out, path = found
        at = "$" + ("." if path and not path.startswith("[") else "") + path
        raise InvalidRequest(f"Invalid request: {out.what} - at `{at}`", param=path or None)
