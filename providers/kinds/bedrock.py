"""`"type": "bedrock"`: AWS Bedrock's runtime API behind OpenAI's chat completions and embeddings.

Chat goes through Converse / ConverseStream (`bedrock_converse` and `bedrock_stream` translate),
except Anthropic's models (`anthropic.*`, `us.anthropic.*`), which go through InvokeModel with
the Messages body the `anthropic` kind builds, so what Claude can do (thinking, the same tool
shapes) is not lost to a second translation. Embeddings are Titan's: one InvokeModel call per
input, a few at a time.

AWS does the infrastructure through botocore's public API: the credential chain
(`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, profiles, SSO, roles), resolved
and refreshed off the event loop; SigV4 signing of each request (`SigV4Auth` on an `AWSRequest`);
the event-stream framing of streamed answers. The HTTP itself goes through our transport. With
an `api_key` (a Bedrock API key) requests carry it as a bearer token instead, unsigned.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
from collections.abc import AsyncIterator, Mapping
from contextlib import aclosing
from typing import Any
from urllib.parse import quote

import msgspec
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials, ReadOnlyCredentials, RefreshableCredentials
from botocore.exceptions import BotoCoreError, ClientError
from botocore.session import Session

from providers.contract import embeddings
from providers.contract.errors import BadUpstreamResponse, ProviderRejected
from providers.contract.lasting import Lasting
from providers.contract.provider import Outgoing, Provider, ProviderDisabled, Reply
from providers.contract.spec import ProviderSpec
from providers.contract.translate import Translator, translated
from providers.contract.transport import Transport
from providers.contract.usage import Usage
from providers.kinds import anthropic
from providers.kinds.anthropic_request import to_messages
from providers.kinds.bedrock_converse import to_chat_completion, to_converse
from providers.kinds.bedrock_stream import EventReader, StreamTranslator
from providers.wire.http import HttpUpstream
from providers.wire.upstream_errors import scrub

SERVICE = "bedrock"  # the signing name of bedrock-runtime
ANTHROPIC_VERSION = "bedrock-2023-05-31"
EVENT_MARK = b":event-type"  # in every event-stream event: what counts as a stream's progress
# Titan embeds one text per call: this many calls at once for one request.
EMBEDDING_CONCURRENCY = 8
REGION_VARIABLES = ("AWS_REGION", "AWS_DEFAULT_REGION")
REGION = re.compile(r"[a-z]{2}(-[a-z0-9]+)+")


class Options(msgspec.Struct, frozen=True):
    """What a `bedrock` entry adds to the common fields."""

    region: str | None = None
    profile: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None


def read_options(raw: Mapping[str, Any]) -> Options:
    """The entry's own fields; ValueError (a config error) names one of the wrong type."""
    try:
        return msgspec.convert({k: v for k, v in raw.items() if k in Options.__struct_fields__},
                               Options)
    except msgspec.ValidationError as exc:
        raise ValueError(f"bedrock: {exc}") from None


def from_environment(value: str | None, environ: Mapping[str, str]) -> str | None:
    """`"$NAME"` or `"${NAME}"` read from the environment (None when unset); else literal."""
    if value is None:
        return None
    if value.startswith("${") and value.endswith("}"):
        return environ.get(value[2:-1]) or None
    if value.startswith("$"):
        return environ.get(value[1:]) or None
    return value


def is_anthropic(model_id: str) -> bool:
    """Whether a Bedrock model id (or cross-region inference profile) is one of Anthropic's."""
    return model_id.startswith("anthropic.") or ".anthropic." in model_id


def caches_prompts(model_id: str) -> bool:
    """Whether a Bedrock model takes prompt-cache breakpoints: Claude (`cache_control`) and
    Nova (Converse's `cachePoint`); others refuse them."""
    return is_anthropic(model_id) or model_id.startswith("amazon.nova") \
        or ".amazon.nova" in model_id


def anthropic_body(body: Mapping[str, Any], model_id: str) -> dict[str, Any]:
    """The InvokeModel body for Claude: the Messages request, its version in the body, its
    model in the URL, and no `stream` (streaming is another operation)."""
    request = to_messages(body, model_id)
    request.pop("model", None)
    request.pop("stream", None)
    return {"anthropic_version": ANTHROPIC_VERSION, **request}


def sign(method: str, url: str, body: bytes, headers: Mapping[str, str],
         credentials: ReadOnlyCredentials, region: str) -> dict[str, str]:
    """`headers` with SigV4's added: `Authorization`, `X-Amz-Date`, the session token."""
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    SigV4Auth(credentials, SERVICE, region).add_auth(request)
    return dict(request.headers.items())


class _Titan(msgspec.Struct):
    embedding: list[float]
    inputTextTokenCount: int = 0


class BedrockProvider(Provider):
    """AWS Bedrock's runtime API, signed with SigV4."""

    kind = "bedrock"
    endpoints = frozenset({"chat/completions", "embeddings"})
    fields = frozenset(Options.__struct_fields__)

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        super().__init__(spec, transport)
        self.options = read_options(spec.raw)
        region = self.options.region or next(
            (os.environ[name] for name in REGION_VARIABLES if os.environ.get(name)), None)
        if not region or not REGION.fullmatch(region):  # it becomes the endpoint's host name
            raise ValueError(f"provider {spec.name!r} of type bedrock needs a region such as "
                             "us-east-1")
        self.region = region
        self._base_url = (spec.base_url
                          or f"https://bedrock-runtime.{region}.amazonaws.com").rstrip("/")
        # Signed as they are sent: every header here is in the signature.
        self._headers = {"Content-Type": "application/json", **spec.headers}
        # A Bedrock API key replaces SigV4 (and the credential chain) with a bearer token.
        self._api_key = spec.api_key.reveal() if spec.api_key else None
        bearer = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        self.http = HttpUpstream(spec.name, spec.timeouts, {**self._headers, **bearer},
                                 self._api_key, transport, spec.link_for(self._base_url))
        self._credentials: Credentials | None = None
        self._resolving = asyncio.Lock()

    def takes_cache_control(self, upstream_model: str) -> bool:
        return caches_prompts(upstream_model)

    # -- credentials and signing --------------------------------------------------------------

    def _resolve(self) -> Credentials | None:
        """The entry's own keys, else the standard chain (blocking: files, IMDS, SSO)."""
        environ = os.environ
        key_id = from_environment(self.options.aws_access_key_id, environ)
        secret = from_environment(self.options.aws_secret_access_key, environ)
        if self.options.aws_access_key_id or self.options.aws_secret_access_key:
            if not key_id or not secret:
                named = self.options.aws_access_key_id if not key_id \
                    else self.options.aws_secret_access_key
                raise ProviderRejected(f"{str(named).lstrip('$').strip('{}')} is not set")
            token = from_environment(self.options.aws_session_token, environ)
            return Credentials(key_id, secret, token)
        return Session(profile=self.options.profile).get_credentials()

    async def start(self, lasting: Lasting) -> None:
        """Resolve the credentials once, off the event loop; none found disables the
        provider with the reason."""
        if self._api_key:
            return
        try:
            await self._credentials_now()
        except ProviderRejected as exc:
            raise ProviderDisabled(exc.message) from None

    async def _credentials_now(self) -> ReadOnlyCredentials:
        if self._credentials is None:
            async with self._resolving:
                if self._credentials is None:
                    try:
                        self._credentials = await asyncio.to_thread(self._resolve)
                    except (BotoCoreError, ClientError) as exc:
                        raise ProviderRejected(scrub(f"AWS credentials: {exc}")) from None
                if self._credentials is None:
                    raise ProviderRejected("no AWS credentials found (environment, profile, "
                                           "SSO, container or instance role)")
        credentials = self._credentials
        try:
            # Refreshing (an assumed role, SSO) calls AWS with a blocking client.
            if isinstance(credentials, RefreshableCredentials) and credentials.refresh_needed():
                return await asyncio.to_thread(credentials.get_frozen_credentials)
            return credentials.get_frozen_credentials()
        except (BotoCoreError, ClientError) as exc:
            raise ProviderRejected(scrub(f"AWS credentials: {exc}")) from None

    async def _signed(self, url: str, body: bytes) -> dict[str, str] | None:
        if self._api_key:
            return None
        return sign("POST", url, body, self._headers, await self._credentials_now(), self.region)

    def _url(self, model_id: str, operation: str) -> str:
        # AWS signs the path as it arrives. Ids hold ':' ("...-v1:0"), which the HTTP client
        # sends raw even when given "%3A": so it is left raw here too, and what is signed is
        # what is sent. An ARN's '/' stays encoded, as it must.
        return f"{self._base_url}/model/{quote(model_id, safe=':')}/{operation}"

    # -- requests -----------------------------------------------------------------------------

    def _chat_body(self, request: Outgoing, model_id: str) -> bytes:
        body = request.json()
        translated = anthropic_body(body, model_id) if is_anthropic(model_id) \
            else to_converse(body, cache_points=caches_prompts(model_id))
        for name in self.spec.drop_params:
            translated.pop(name, None)
        translated.update(self.spec.params)
        return msgspec.json.encode(translated)

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        if request.endpoint == "embeddings":
            return await self._embed(request, upstream_model)
        claude = is_anthropic(upstream_model)
        url = self._url(upstream_model, "invoke" if claude else "converse")
        body = self._chat_body(request, upstream_model)
        payload, headers = await self.http.post(url, body, await self._signed(url, body))
        try:
            answer = msgspec.json.decode(payload)
        except msgspec.DecodeError as exc:
            raise BadUpstreamResponse(f"response is not JSON: {exc}") from None
        if not isinstance(answer, dict):
            raise BadUpstreamResponse("response is not a JSON object")
        completion = anthropic.to_chat_completion(answer, upstream_model) if claude \
            else to_chat_completion(answer, upstream_model, headers.get("x-amzn-RequestId"))
        usage = msgspec.convert(completion["usage"], Usage)
        return Reply(msgspec.json.encode(completion), usage=usage)

    async def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        claude = is_anthropic(upstream_model)
        url = self._url(upstream_model,
                        "invoke-with-response-stream" if claude else "converse-stream")
        body = self._chat_body(request, upstream_model)
        chunks = self.http.stream(url, body, await self._signed(url, body), progress=EVENT_MARK)
        translator: Translator = ClaudeStreamTranslator(upstream_model) if claude \
            else StreamTranslator(upstream_model)
        async with aclosing(translated(chunks, translator)) as out:
            async for piece in out:
                yield piece

    async def _embed(self, request: Outgoing, model_id: str) -> Reply:
        body = request.json()
        texts = embeddings.texts(body, self.name)
        url = self._url(model_id, "invoke")
        gate = asyncio.Semaphore(EMBEDDING_CONCURRENCY)

        async def one(text: str) -> _Titan:
            titan: dict[str, Any] = {"inputText": text}
            if body.get("dimensions") is not None:
                titan["dimensions"] = body["dimensions"]
            payload = msgspec.json.encode(titan)
            async with gate:
                answer, _ = await self.http.post(url, payload, await self._signed(url, payload))
            try:
                return msgspec.json.decode(answer, type=_Titan)
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
                raise BadUpstreamResponse(f"response is not a Titan embedding: {exc}") from None

        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels the rest
                tasks = [group.create_task(one(text)) for text in texts]
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None
        found = [task.result() for task in tasks]
        listed = embeddings.embedding_list([f.embedding for f in found], request.model,
                                           sum(f.inputTextTokenCount for f in found),
                                           body.get("encoding_format"))
        return Reply(msgspec.json.encode(listed), usage=msgspec.convert(listed["usage"], Usage))


class ClaudeStreamTranslator:
    """InvokeModelWithResponseStream in, OpenAI chat chunks out: each `chunk` event carries one
    Messages stream event, base64 in JSON, translated as the `anthropic` kind translates it."""

    def __init__(self, model_id: str) -> None:
        self._reader = EventReader()
        self._messages = anthropic.StreamTranslator(model_id)

    def feed(self, chunk: bytes) -> bytes:
        """Chunks for every event whole in `chunk`; an exception message raises."""
        return b"".join(self._messages.translate(_chunk_bytes(payload))
                        for kind, payload in self._reader.feed(chunk) if kind == "chunk")

    def close(self) -> bytes:
        """At the upstream's end: the exception it carried raised; nothing is held back."""
        self._reader.close()
        return b""


def _chunk_bytes(payload: bytes) -> bytes:
    try:
        found = msgspec.json.decode(payload, type=dict[str, str])
        return base64.b64decode(found["bytes"], validate=True)
    except (msgspec.DecodeError, msgspec.ValidationError, KeyError, ValueError) as exc:
        raise BadUpstreamResponse(f"stream chunk is not a Messages event: {exc}") from None
