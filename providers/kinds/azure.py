"""`"type": "azure"`: Azure OpenAI, OpenAI's API under Azure's URL scheme and credentials.

Bodies and answers are the `openai` kind's (`providers.kinds.openai`). What differs is where a
request goes, `{base_url}/openai/deployments/{deployment}/{endpoint}?api-version=V`, how it is
authenticated (an `api-key` header, or an Entra ID bearer token: a static one, or one minted
from a client secret by azure-identity and renewed before it expires), and one kind of answer:
a chat answer that Azure's content filter stopped before any of it was written is this model's
limit (`ContentRefused`), so that another candidate may answer, as for Azure's 400
`content_filter` (`providers.contract.refusals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncGenerator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

import msgspec

from providers.contract.errors import (
    ContentRefused,
    ProviderRejected,
    ProviderUnavailable,
    UpstreamClientError,
)
from providers.contract.lasting import Lasting
from providers.contract.provider import Outgoing, ProviderDisabled, Reply
from providers.contract.refusals import filtered, filtered_first
from providers.contract.spec import ProviderSpec
from providers.contract.translate import Translator, translated
from providers.contract.transport import Transport, UpstreamSocket
from providers.kinds.openai import OpenAIProvider
from providers.wire import sse
from providers.wire.deadline import DATA
from providers.wire.http import HttpUpstream
from providers.wire.upstream_errors import scrub

if TYPE_CHECKING:
    from azure.core.credentials_async import AsyncTokenCredential

# The scope of a token for Azure OpenAI (Cognitive Services), as Azure's SDKs ask for it.
SCOPE = "https://cognitiveservices.azure.com/.default"
# A minted token is renewed this long before it expires (azure-identity's own margin), in the
# background while it is still good, so no request waits for a renewal.
RENEW_BEFORE = 300.0
# Events held back while a chat stream has written nothing (Azure's prompt filter results, the
# role): enough for what comes before the first token, few enough to hold no stream for long.
MAX_HELD_EVENTS = 16
FILTERED = ("The answer was filtered by Azure OpenAI's content management policy before any "
            "of it was written")


class EntraEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """`"entra"`: a client-credentials token source (an app registration's secret)."""

    tenant_id: str
    client_id: str
    client_secret: str
    # The Entra ID host (login.microsoftonline.com by default; a sovereign cloud's, a fake's).
    authority: str | None = None
    scope: str = SCOPE


class AzureEntry(msgspec.Struct, frozen=True):
    """The `azure` kind's own fields in llms.json."""

    api_version: str
    azure_ad_token: str | None = None
    entra: EntraEntry | None = None


AZURE_FIELDS = frozenset(AzureEntry.__struct_fields__)


def read_entry(raw: Mapping[str, Any]) -> AzureEntry:
    """The kind's fields from a provider's config entry; ValueError names a missing or bad one."""
    if not raw.get("api_version"):
        raise ValueError('api_version: required for type azure (the Azure OpenAI API version, '
                         'such as "2024-10-21")')
    try:
        return msgspec.convert({k: v for k, v in raw.items() if k in AZURE_FIELDS}, AzureEntry)
    except msgspec.ValidationError as exc:
        problem, _, at = str(exc).partition(" - at `$.")
        raise ValueError(f"{at.rstrip('`')}: {problem}" if at else problem) from None


def expand(value: str) -> str | None:
    """`"$NAME"` or `"${NAME}"` read from the environment (None when unset), as llms.json's
    `api_key` is; other text is literal."""
    if value.startswith("${") and value.endswith("}"):
        return os.environ.get(value[2:-1]) or None
    if value.startswith("$") and value[1:].replace("_", "").isalnum():
        return os.environ.get(value[1:]) or None
    return value


def deployment_url(base_url: str, deployment: str, endpoint: str, api_version: str) -> str:
    """Where Azure serves `endpoint` for one deployment."""
    return (f"{base_url}/openai/deployments/{quote(deployment, safe='')}/{endpoint}?"
            f"{urlencode({'api-version': api_version})}")


def build_headers(spec: ProviderSpec, token: str | None) -> dict[str, str]:
    """Headers sent with every request: Azure's `api-key`, or a static Entra ID token."""
    headers = {"Content-Type": "application/json", **spec.headers}
    if spec.api_key is not None:
        headers["api-key"] = spec.api_key.reveal()
    elif token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


def filter_refusal(provider: str) -> ContentRefused:
    """The model limit for an answer the content filter emptied: Azure's own 400 shape, which
    reaches the client when no other candidate answers."""
    return ContentRefused(UpstreamClientError(provider, 400, FILTERED, error_type=None,
                                              code="content_filter", param=None))


class EntraTokens:
    """Bearer tokens from an azure-identity credential: one mint at a time, renewed in the
    background once within `RENEW_BEFORE` of expiry; a request waits only when there is no
    good token at all (the first, or after a failed renewal)."""

    def __init__(self, credential: AsyncTokenCredential, scope: str, provider: str,
                 secret: str) -> None:
        self._credential = credential
        self._scope = scope
        self._provider = provider
        self._secret = secret  # the client secret, masked from any error azure-identity gives
        self._token: str | None = None
        self._expires_on = 0.0
        self._minting: asyncio.Task[str] | None = None

    async def token(self) -> str:
        """A token good for now; ProviderRejected (a failover) when none can be minted."""
        left = self._expires_on - time.time()
        if self._token is not None and left > RENEW_BEFORE:
            return self._token
        minting = self._minting
        if minting is None or minting.done():
            minting = self._minting = asyncio.create_task(self._mint())
            # A renewal nobody waits for may fail: the next request tries again.
            minting.add_done_callback(lambda task: task.cancelled() or task.exception())
        if self._token is not None and left > 0:
            return self._token  # still good: the renewal goes on beside this request
        return await asyncio.shield(minting)

    async def _mint(self) -> str:
        from azure.core.exceptions import AzureError, ClientAuthenticationError

        try:
            minted = await self._credential.get_token(self._scope)
        except ClientAuthenticationError as exc:
            raise ProviderRejected("Entra ID refused the client credentials: "
                                   + scrub(str(exc), self._secret)) from None
        except AzureError as exc:
            raise ProviderUnavailable("Entra ID could not be reached for a token: "
                                      + scrub(str(exc), self._secret)) from None
        self._token, self._expires_on = minted.token, float(minted.expires_on)
        return minted.token

    async def close(self) -> None:
        """Stop a renewal under way and close the credential's connections."""
        if self._minting is not None and not self._minting.done():
            self._minting.cancel()
            with contextlib.suppress(BaseException):
                await self._minting
        await self._credential.close()


def entra_tokens(entry: EntraEntry, provider: str) -> EntraTokens | None:
    """The token source for `"entra"`, None when one of its `$NAME`s is unset."""
    # Imported here: only a config with an Entra source pays for loading azure-identity.
    from azure.identity.aio import ClientSecretCredential

    tenant, client, secret = (expand(entry.tenant_id), expand(entry.client_id),
                              expand(entry.client_secret))
    if not (tenant and client and secret):
        return None
    options: dict[str, Any] = {"authority": entry.authority} if entry.authority else {}
    return EntraTokens(ClientSecretCredential(tenant, client, secret, **options), entry.scope,
                       provider, secret)


class BearerUpstream(HttpUpstream):
    """An `HttpUpstream` whose requests carry a token from `EntraTokens`, fetched per request
    (a cached one, but for the first request and after an expiry)."""

    def __init__(self, tokens: EntraTokens, *args: Any) -> None:
        super().__init__(*args)
        self.tokens = tokens

    async def _bearer(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        token = await self.tokens.token()
        self.secret = token  # masked from the upstream's error bodies, like a key
        return {**(extra or {}), "Authorization": f"Bearer {token}"}

    async def post(self, url: str, body: bytes, extra: Mapping[str, str] | None = None
                   ) -> tuple[bytes, Mapping[str, str]]:
        return await super().post(url, body, await self._bearer(extra))

    async def stream(self, url: str, body: bytes, extra: Mapping[str, str] | None = None,
                     progress: bytes = DATA, translator: Translator | None = None
                     ) -> AsyncGenerator[bytes, None]:
        chunks = super().stream(url, body, await self._bearer(extra), progress, translator)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            await chunks.aclose()


class WrittenFirst:
    """A chat stream held back until it has written something; `ContentRefused` when the
    content filter stopped it first (nothing was sent, so it is still a failover). Once it
    has written, the rest passes as it comes."""

    def __init__(self, provider: str) -> None:
        self._provider = provider
        self._reader: sse.Reader | None = sse.Reader()  # None once decided
        self._held: list[bytes] = []
        self._events = 0

    def feed(self, chunk: bytes) -> bytes:
        """What is held, once `chunk` decides; the chunk itself after that."""
        if self._reader is None:
            return chunk
        self._held.append(chunk)
        for event in self._reader.feed(chunk):
            self._events += 1
            settled = False if event.done else filtered_first(event.data)
            if settled:
                raise filter_refusal(self._provider)
            if settled is False or self._events >= MAX_HELD_EVENTS:
                return self._released()
        return b""

    def close(self) -> bytes:
        """A stream that ended having written nothing: what came, for the watch to judge."""
        return self._released() if self._reader is not None else b""

    def _released(self) -> bytes:
        self._reader = None
        held, self._held = b"".join(self._held), []
        return held


class AzureProvider(OpenAIProvider):
    """An Azure OpenAI resource: its deployments named as `models`."""

    kind = "azure"
    fields = OpenAIProvider.fields | AZURE_FIELDS

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        self.azure = read_entry(spec.raw)
        written = [name for name, given in (("api_key", spec.raw.get("api_key")),
                                            ("azure_ad_token", self.azure.azure_ad_token),
                                            ("entra", self.azure.entra)) if given]
        if len(written) != 1:
            raise ValueError("give one credential of api_key, azure_ad_token and entra "
                             f"(found {', '.join(written) or 'none'})")
        written_token = self.azure.azure_ad_token
        self._static_token = expand(written_token) if written_token else None
        self.tokens = entra_tokens(self.azure.entra, spec.name) if self.azure.entra else None
        super().__init__(spec, transport)

    def upstream(self, spec: ProviderSpec, transport: Transport) -> HttpUpstream:
        link = spec.link_for(spec.base_url)
        if self.tokens is not None:
            return BearerUpstream(self.tokens, spec.name, spec.timeouts,
                                  build_headers(spec, None), None, transport, link)
        secret = spec.api_key.reveal() if spec.api_key else self._static_token
        return HttpUpstream(spec.name, spec.timeouts, build_headers(spec, self._static_token),
                            secret, transport, link)

    def url(self, endpoint: str, upstream_model: str) -> str:
        return deployment_url(self._base_url, upstream_model, endpoint,
                              self.azure.api_version)

    async def realtime(self, upstream_model: str, beta: bool, max_frame_bytes: int
                       ) -> UpstreamSocket:
        """`{base_url}/openai/realtime?api-version=V&deployment=D`, Azure's Realtime path."""
        query = urlencode({"api-version": self.azure.api_version, "deployment": upstream_model})
        headers = await self.realtime_headers(beta)
        if self.tokens is not None:
            headers["Authorization"] = f"Bearer {await self.tokens.token()}"
        return await self.dial(f"{self._base_url}/openai/realtime?{query}", headers,
                               max_frame_bytes)

    async def start(self, lasting: Lasting) -> None:
        written = self.azure.azure_ad_token
        if written and self._static_token is None:
            raise ProviderDisabled(f"{written.lstrip('$').strip('{}')} is not set")
        if self.azure.entra and self.tokens is None:
            raise ProviderDisabled("entra: a variable it reads is not set")

    async def close(self) -> None:
        if self.tokens is not None:
            await self.tokens.close()

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        reply = await super().send(request, upstream_model)
        if request.endpoint == "chat/completions" and b'"content_filter"' in reply.body \
                and filtered([reply.body]):
            raise filter_refusal(self.name)
        return reply

    def stream(self, request: Outgoing, upstream_model: str) -> AsyncGenerator[bytes, None]:
        chunks = super().stream(request, upstream_model)
        if request.endpoint != "chat/completions":
            return chunks
        return translated(chunks, WrittenFirst(self.name))

    async def list_models(self) -> list[str]:
        raise NotImplementedError("an Azure OpenAI resource's deployments are named in models: "
                                  "it has no listing of them")
