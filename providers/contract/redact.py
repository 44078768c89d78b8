"""What must never leave the process: the configured secrets, and anything shaped like a key.

Two tools, for two kinds of text:
- `mask_credentials` masks what looks like a credential (`Bearer …`, `Basic …`, `sk-…`,
  `x-api-key: …`, `key=…`, AWS's key ids and `X-Amz-Security-Token: …`, a URL's
  `user:pass@`). Upstream text (error bodies, stream error events) passes it where it
  enters, since an upstream may echo any header it was sent.
- `Redactor` removes every configured secret (provider keys, header values, proxy and URL
  credentials, the gateway's own keys). Every string that leaves passes one: error envelopes,
  in-band stream errors, log lines, the status and admin JSON, the CLI's output.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlsplit

MASK = "***"
# Shorter values are not removed: "on", "1" or a region name in a header is no credential, and
# removing it everywhere would garble every message. Credentials are longer.
MIN_SECRET = 6

_CREDENTIAL = re.compile(
    r"(?i)((?:bearer|basic)\s+)[\w.\-~+/=]{8,}"
    r"|\b(?:sk|pk|rk|gsk|xai|key)-[\w\-]{8,}"
    r"|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"  # an AWS access key id, in a SigV4 `Credential=`
    r"|((?:x-api-key|x-goog-api-key|api-key|authorization|x-amz-security-token)"
    r"[\"']?\s*[:=]\s*[\"']?)"
    r"(?!bearer\s)[\w.\-~+/=]{6,}"
    r"|([?&](?:api_)?key=)[^&\s\"']+"
    r"|(://)[^/@\s:]+:[^/@\s]+@"
)


def mask_credentials(text: str) -> str:
    """`text` with everything shaped like a credential masked (its label kept)."""
    return _CREDENTIAL.sub(_mask, text)


def _mask(match: re.Match[str]) -> str:
    prefix = match.group(1) or match.group(2) or match.group(3)
    if match.group(4):
        return f"://{MASK}@"
    return f"{prefix}{MASK}" if prefix else MASK


def url_secrets(url: str) -> list[str]:
    """The credentials a URL carries: its user and password, and key-like query values."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [unquote(v) for v in (parts.username, parts.password) if v]
    if parts.password:  # as a client sends them: `Authorization: Basic base64(user:pass)`
        pair = f"{unquote(parts.username or '')}:{unquote(parts.password)}"
        found.append(base64.b64encode(pair.encode()).decode())
    found += [value for name, value in parse_qsl(parts.query)
              if "key" in name.lower() or "token" in name.lower()]
    return found


# Up to this many secrets, each is looked for alone (a memchr-fast scan) before the pattern
# runs: a regex of alternated literals tries every one at every position of the text.
LOOKED_FOR_ALONE = 32


@dataclass(frozen=True, slots=True)
class Redactor:
    """Removes a fixed set of secrets from text: one regex, built once per config, run only on
    text that holds one of them."""

    pattern: re.Pattern[str] | None = None
    secrets: tuple[str, ...] = ()  # empty: too many to look for alone, the pattern decides
    encoded_secrets: tuple[bytes, ...] = ()

    @classmethod
    def of(cls, secrets: Iterable[str]) -> Redactor:
        """A redactor for `secrets` (blank and short values are ignored)."""
        kept = sorted({s for s in secrets if s and len(s.strip()) >= MIN_SECRET},
                      key=len, reverse=True)  # longest first: a key containing another
        if not kept:
            return cls()
        alone = tuple(kept) if len(kept) <= LOOKED_FOR_ALONE else ()
        return cls(re.compile("|".join(re.escape(s) for s in kept)), alone,
                   tuple(s.encode() for s in alone))

    def text(self, text: str) -> str:
        """`text` with every secret replaced by `***`."""
        if self.pattern is None or (self.secrets and not _holds(text, self.secrets)):
            return text
        return self.pattern.sub(MASK, text)

    def encoded(self, data: bytes) -> bytes:
        """The same for encoded text (JSON, SSE); bytes that are not UTF-8 are replaced."""
        if self.pattern is None:
            return data
        if self.encoded_secrets:  # a loop, not any(): no generator made on every log line
            for secret in self.encoded_secrets:
                if data.find(secret) != -1:  # `in` on bytes makes and drops a TypeError first
                    break
            else:
                return data
        return self.pattern.sub(MASK, data.decode("utf-8", "replace")).encode()


def _holds(text: str, secrets: tuple[str, ...]) -> bool:
    return any(secret in text for secret in secrets)

