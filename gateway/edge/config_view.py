"""The config in force as an admin may read it: every credential hidden (pure).

A field that holds a credential (a provider's `api_key`, the gateway's keys, the console's
`client_secret`, header values, passwords, tokens) shows `***`, unless it names an environment
variable (`"$NAME"`), which is no secret and tells where the value comes from; a URL's
`user:password@` is masked. The admin route passes the result through the live config's
redactor as well, so a secret written anywhere else is removed too.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from providers.contract.redact import MASK, mask_credentials

# Field names whose values are credentials, whatever their place in the file.
SECRET_FIELD = re.compile(r"(?i)(^|_)(api_?key|keys?|secret|password|token|credentials?|"
                          r"authorization)$")
ENV_REFERENCE = re.compile(r"^\$(\{[A-Za-z_][A-Za-z0-9_]*\}|[A-Za-z_][A-Za-z0-9_]*)$")


def hidden(document: Mapping[str, Any]) -> dict[str, Any]:
    """`document` with every credential replaced by `***`."""
    return {name: _value(name, value, False) for name, value in document.items()}


def _value(name: str, value: Any, secret: bool) -> Any:
    secret = secret or bool(SECRET_FIELD.search(name))
    if isinstance(value, Mapping):  # its own fields say what they hold; a header's any value
        return {k: _value(str(k), v, name == "headers") for k, v in value.items()}
    if isinstance(value, list):
        return [_value(name, item, secret) for item in value]
    if isinstance(value, str):
        if secret and not ENV_REFERENCE.match(value):
            return MASK
        return mask_credentials(value)
    return value
