"""An OpenAI client reaches Azure OpenAI deployments through the gateway without knowing it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest
import trustme
from azure.core.credentials import AccessToken
from azure.core.exceptions import ClientAuthenticationError

from providers.contract.errors import ProviderRejected
from providers.kinds.azure import SCOPE, EntraTokens
from tests.fake_azure import (
    FakeAzure,
    FakeEntra,
    answer_filtered,
    prompt_filtered,
    throttled,
    tls_context,
)
from tests.gateway_process import ROOT, GatewayProcess, config, provider
from tests.kinds import fresh_client, started
from tests.openapi import validate
from tests.upstream import FakeUpstream, ok, status, tool_call

KEY = "azure-test-key-0123456789abcdef"
WRONG_KEY = "azure-wrong-key-fedcba9876543210"
AD_TOKEN = "eyJ0eXAiOiJKV1Qi.static-entra-token.0123456789"
ENTRA_SECRET, WRONG_SECRET = "entra-client-secret-abcdef0123", "entra-wrong-secret-9876543210"
ENV = {"AZURE_OPENAI_API_KEY": KEY, "AZURE_WRONG_KEY": WRONG_KEY, "AZURE_AD_TOKEN": AD_TOKEN,
       "ENTRA_SECRET": ENTRA_SECRET, "ENTRA_WRONG_SECRET": WRONG_SECRET}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
PIXEL = "data:image/png;base64,iVBORw0KGgo="
SAID = [{"role": "user", "content": "Hi"}]


def azure_entry(base_url: str, models: dict[str, str], **extra: object) -> dict[str, object]:
    return {"type": "azure", "base_url": base_url, "api_version": "2024-10-21",
            "api_key": "$AZURE_OPENAI_API_KEY", "models": models, **extra}


@pytest.fixture(scope="module")
def azure() -> Iterator[FakeAzure]:
    with FakeAzure(name="azure", key=KEY, tokens={AD_TOKEN}) as fake:
        yield fake


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def entra(azure: FakeAzure, ca: trustme.CA) -> Iterator[FakeEntra]:
    with FakeEntra(name="entra", tls=tls_context(ca), azure=azure,
                   client_secret=ENTRA_SECRET) as fake:
        yield fake


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, azure: FakeAzure, entra: FakeEntra,
            ca: trustme.CA, backup: FakeUpstream) -> Iterator[GatewayProcess]:
    # Entra ID is reached over TLS only: the test CA is trusted the way a private one is.
    workdir = tmp_path_factory.mktemp("azure")
    ca.cert_pem.write_to_path(str(workdir / "ca.pem"))
    # Candidates follow the providers' order: `gpt` is Azure then the backup, `to-azure` the
    # backup then Azure; `wrong-key` and `locked-out` reach Azure with a key it refuses.
    yield from started(workdir, {
        "first": provider(backup.base_url, {"to-azure": "backup-model"}),
        "azure": azure_entry(azure.base_url, {"gpt": "gpt-4o-deploy", "to-azure": "gpt-4o-deploy",
                                              "azure-only": "gpt-4o-deploy",
                                              "embed": "embed-deploy"}),
        "azure-token": {"type": "azure", "base_url": azure.base_url,
                        "api_version": "2024-10-21", "azure_ad_token": "$AZURE_AD_TOKEN",
                        "models": {"by-token": "gpt-4o-deploy"}},
        "azure-wrong": azure_entry(azure.base_url, {"wrong-key": "gpt-4o-deploy",
                                                    "locked-out": "gpt-4o-deploy"},
                                   api_key="$AZURE_WRONG_KEY"),
        "azure-entra": entra_entry(azure.base_url, entra, "$ENTRA_SECRET", "by-entra"),
        "azure-entra-wrong": entra_entry(azure.base_url, entra, "$ENTRA_WRONG_SECRET",
                                         "entra-refused"),
        "backup": provider(backup.base_url, {"gpt": "backup-model", "wrong-key": "backup-model",
                                             "entra-refused": "backup-model"}),
    }, {**ENV, "SSL_CERT_FILE": str(workdir / "ca.pem")})


def entra_entry(base_url: str, entra: FakeEntra, secret: str, alias: str) -> dict[str, object]:
    return {"type": "azure", "base_url": base_url, "api_version": "2024-10-21",
            "entra": {"tenant_id": entra.tenant_id, "client_id": entra.client_id,
                      "client_secret": secret, "authority": entra.authority},
            "models": {alias: "gpt-4o-deploy"}}


@pytest.fixture
def client(gateway: GatewayProcess, azure: FakeAzure, entra: FakeEntra,
           backup: FakeUpstream) -> openai.OpenAI:
    return fresh_client(gateway, azure, entra, backup)


def test_chat_goes_to_the_deployment_with_the_api_version_and_key(
        client: openai.OpenAI, azure: FakeAzure) -> None:
    raw = client.chat.completions.with_raw_response.create(model="gpt", messages=SAID)
    answer = raw.parse()

    assert answer.choices[0].message.content == "Hello from azure"
    assert (answer.id, answer.model) == ("chatcmpl-fake", "gpt-4o-deploy")
    validate(raw.http_response.json(), "CreateChatCompletionResponse")
    sent = azure.requests[-1]
    assert sent.path == "/openai/deployments/gpt-4o-deploy/chat/completions"
    assert sent.headers["api-key"] == KEY
    assert "authorization" not in sent.headers
    assert sent.json["messages"] == SAID


def test_a_stream_with_azures_prompt_filter_chunk_reaches_the_sdk(client: openai.OpenAI) -> None:
    chunks = list(client.chat.completions.create(model="gpt", messages=SAID, stream=True,
                                                 stream_options={"include_usage": True}))

    assert chunks[0].choices == []  # Azure's first chunk: the prompt's filter results
    assert chunks[0].model_extra and "prompt_filter_results" in chunks[0].model_extra
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "Hello from azure"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_tools_and_images_round_trip(client: openai.OpenAI, azure: FakeAzure) -> None:
    azure.set_mode(tool_call("get_weather", '{"city": "Oslo"}'))
    first = client.chat.completions.create(model="gpt", tools=[WEATHER], messages=[
        {"role": "user", "content": [{"type": "text", "text": "Weather where this is?"},
                                     {"type": "image_url", "image_url": {"url": PIXEL}}]}])
    call = first.choices[0].message.tool_calls[0]  # type: ignore[index]

    assert first.choices[0].finish_reason == "tool_calls"
    assert (call.function.name, json.loads(call.function.arguments)) == \
        ("get_weather", {"city": "Oslo"})
    sent = azure.last_json
    assert sent["tools"] == [WEATHER]
    assert sent["messages"][0]["content"][1] == {"type": "image_url", "image_url": {"url": PIXEL}}

    azure.set_mode(tool_call("get_weather", '{"city": "Bergen"}'))
    with client.chat.completions.stream(model="gpt", tools=[WEATHER], messages=SAID) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert json.loads(streamed.function.arguments) == {"city": "Bergen"}


def test_embeddings(client: openai.OpenAI, azure: FakeAzure) -> None:
    answer = client.embeddings.create(model="embed", input=["red apple", "green pear"])

    assert [len(item.embedding) for item in answer.data] == [8, 8]
    sent = azure.requests[-1]
    assert sent.path == "/openai/deployments/embed-deploy/embeddings"
    assert sent.json["input"] == ["red apple", "green pear"]


def test_a_static_entra_token_is_sent_as_a_bearer(client: openai.OpenAI,
                                                  azure: FakeAzure) -> None:
    answer = client.chat.completions.create(model="by-token", messages=SAID)

    assert answer.choices[0].message.content == "Hello from azure"
    assert azure.requests[-1].headers["authorization"] == f"Bearer {AD_TOKEN}"
    assert "api-key" not in azure.requests[-1].headers


def test_a_token_minted_by_entra_id_is_sent_and_kept(client: openai.OpenAI, azure: FakeAzure,
                                                     entra: FakeEntra) -> None:
    said = [client.chat.completions.create(model="by-entra", messages=SAID)
            .choices[0].message.content for _ in range(3)]

    assert said == ["Hello from azure"] * 3
    minted = [r for r in entra.requests if r.json is None]  # form-encoded, not JSON
    assert len(minted) == 1, "one token, kept until it is due for renewal"
    assert b"grant_type=client_credentials" in minted[0].body
    assert entra.requests[0].path == f"/{entra.tenant_id}/oauth2/v2.0/token"
    assert {r.headers["authorization"] for r in azure.requests} == \
        {f"Bearer {entra.issued[-1]}"}


def test_client_credentials_entra_refuses_fail_over_and_never_leak(
        client: openai.OpenAI, gateway: GatewayProcess, azure: FakeAzure,
        entra: FakeEntra) -> None:
    answer = client.chat.completions.with_raw_response.create(model="entra-refused",
                                                              messages=SAID)

    assert answer.parse().choices[0].message.content == "Hello from backup"
    assert answer.headers["x-llms-attempts"] == "2"
    assert f"client_secret={WRONG_SECRET}".encode() in entra.requests[-1].body  # and refused
    assert not azure.requests  # no token, no request to the resource
    assert WRONG_SECRET not in gateway.logs() and ENTRA_SECRET not in gateway.logs()


def test_failover_from_azure_and_to_it(client: openai.OpenAI, azure: FakeAzure,
                                       backup: FakeUpstream) -> None:
    azure.set_mode(status(503, "The service is temporarily unable to process your request."))
    served = client.chat.completions.with_raw_response.create(model="gpt", messages=SAID)
    assert served.parse().choices[0].message.content == "Hello from backup"
    assert served.headers["x-llms-provider"] == "backup"

    azure.set_mode(ok())
    backup.set_mode(status(503))
    stream = client.chat.completions.create(model="to-azure", messages=SAID, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == \
        "Hello from azure"


def test_a_refused_key_fails_over_and_never_leaks(client: openai.OpenAI, gateway: GatewayProcess,
                                                  azure: FakeAzure) -> None:
    answer = client.chat.completions.create(model="wrong-key", messages=SAID)
    assert answer.choices[0].message.content == "Hello from backup"
    assert azure.requests[-1].headers["api-key"] == WRONG_KEY  # Azure did refuse it

    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="locked-out", messages=SAID)
    error = caught.value
    assert error.status_code == 502
    assert isinstance(error.body, dict) and error.body["code"] == "provider_error"
    assert [a["status"] for a in error.body["attempts"]] == [401]
    assert "Access denied due to invalid subscription key" in error.body["attempts"][0]["message"]
    for text in (str(error.body), gateway.logs()):
        assert WRONG_KEY not in text and KEY not in text


def test_a_prompt_refused_by_the_content_filter_goes_to_the_next_candidate(
        client: openai.OpenAI, azure: FakeAzure) -> None:
    azure.set_mode(prompt_filtered())
    served = client.chat.completions.with_raw_response.create(model="gpt", messages=SAID)
    assert served.parse().choices[0].message.content == "Hello from backup"

    azure.set_mode(prompt_filtered())  # nothing else serves it: Azure's refusal itself
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="azure-only", messages=SAID)
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "content_filter"


@pytest.mark.parametrize("stream", [True, False])
def test_an_answer_the_filter_emptied_goes_to_the_next_candidate(
        client: openai.OpenAI, azure: FakeAzure, stream: bool) -> None:
    azure.set_mode(answer_filtered())
    if stream:
        chunks = list(client.chat.completions.create(model="gpt", messages=SAID, stream=True))
        said = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        said = client.chat.completions.create(model="gpt", messages=SAID) \
            .choices[0].message.content or ""

    assert said == "Hello from backup"
    assert len(azure.requests) == 1


def test_an_answer_filtered_after_it_began_is_an_answer(client: openai.OpenAI,
                                                        azure: FakeAzure) -> None:
    azure.set_mode(ok(content="Part of it", finish_reason="content_filter"))
    chunks = list(client.chat.completions.create(model="gpt", messages=SAID, stream=True))

    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Part of it"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "content_filter"


def test_a_throttled_deployment_is_waited_for_to_the_millisecond(
        client: openai.OpenAI, gateway: GatewayProcess, azure: FakeAzure) -> None:
    azure.set_mode(throttled(2.5))  # retry-after: 2, retry-after-ms: 2500
    answer = httpx.post(f"{gateway.base_url}/chat/completions", timeout=30,
                        json={"model": "azure-only", "messages": SAID})

    assert answer.status_code == 429
    assert answer.headers["retry-after"] == "3"  # 2.5 s, rounded up: the finer hint was read


def test_what_azure_refuses_before_any_model_sees_it(azure: FakeAzure) -> None:
    """The fake checks what Azure checks: the API version, the key, the deployment."""
    url = f"{azure.base_url}/openai/deployments/gpt-4o-deploy/chat/completions"
    body = {"messages": SAID}
    key = {"api-key": KEY}
    answers = [httpx.post(url, json=body, headers=key),
               httpx.post(url, params={"api-version": "2019-01-01"}, json=body, headers=key),
               httpx.post(url, params={"api-version": "2024-10-21"}, json=body,
                          headers={"api-key": "nope"}),
               httpx.post(url.replace("gpt-4o-deploy", "absent"),
                          params={"api-version": "2024-10-21"}, json=body, headers=key)]

    assert [(a.status_code, a.json()["error"]["code"]) for a in answers] == [
        (404, "404"), (400, "BadRequest"), (401, "401"), (404, "DeploymentNotFound")]


def test_an_unset_token_variable_takes_the_provider_out_with_its_reason(
        start_gateway: Callable[..., GatewayProcess], azure: FakeAzure,
        backup: FakeUpstream) -> None:
    backup.reset()
    gateway = start_gateway(config({
        "azure": {"type": "azure", "base_url": azure.base_url, "api_version": "2024-10-21",
                  "azure_ad_token": "$AZURE_TOKEN_NEVER_SET", "models": {"gpt": "gpt-4o-deploy"}},
        "backup": provider(backup.base_url, {"gpt": "backup-model"}),
    }))
    answer = openai.OpenAI(base_url=gateway.base_url, api_key="unused").chat.completions.create(
        model="gpt", messages=SAID)

    assert answer.choices[0].message.content == "Hello from backup"
    assert "AZURE_TOKEN_NEVER_SET is not set" in gateway.logs()


def test_a_missing_api_version_is_a_config_error(tmp_path: Path) -> None:
    entry = azure_entry("https://res.openai.azure.com", {"gpt": "gpt-4o-deploy"})
    del entry["api_version"]
    path = tmp_path / "llms.json"
    path.write_text(json.dumps(config({"azure": entry})))

    checked = subprocess.run([sys.executable, "-m", "gateway", "check", "--config", str(path)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60,
                             env={**os.environ, **ENV})

    assert checked.returncode != 0
    assert "providers.azure: api_version: required for type azure" in checked.stdout + \
        checked.stderr


class ScriptedCredential:
    """azure-identity's async credential interface, minting when the test opens `gate`."""

    def __init__(self, lifetime: int, refuse: str | None = None) -> None:
        self.lifetime, self.refuse = lifetime, refuse
        self.asked = 0
        self.gate = asyncio.Event()

    async def get_token(self, *scopes: str, **_: object) -> AccessToken:
        assert scopes == (SCOPE,)
        self.asked += 1
        await self.gate.wait()
        if self.refuse:
            raise ClientAuthenticationError(self.refuse)
        return AccessToken(f"token-{self.asked}", int(time.time()) + self.lifetime)

    async def close(self) -> None:
        pass


async def _turns(count: int = 20) -> None:
    """Let other tasks run (a renewal), without waiting for any time to pass."""
    for _ in range(count):
        await asyncio.sleep(0)


def test_a_token_due_for_renewal_is_renewed_beside_requests_not_before_them() -> None:
    async def story() -> None:
        credential = ScriptedCredential(lifetime=120)  # within the renewal margin: due at once
        tokens = EntraTokens(credential, SCOPE, "azure", "secret")  # type: ignore[arg-type]
        credential.gate.set()
        assert await tokens.token() == "token-1"  # none yet: waited for
        credential.gate.clear()
        assert [await tokens.token(), await tokens.token()] == ["token-1", "token-1"]
        await _turns()  # the renewal starts, and waits on the gate
        assert credential.asked == 2, "one renewal under way, the good token used meanwhile"
        credential.gate.set()
        await _turns()
        assert await tokens.token() == "token-2"
        await tokens.close()

    asyncio.run(story())


def test_an_expired_token_is_waited_for_and_a_refusal_is_a_rejection() -> None:
    async def story() -> None:
        credential = ScriptedCredential(lifetime=-1)  # expired as it comes
        tokens = EntraTokens(credential, SCOPE, "azure", "secret")  # type: ignore[arg-type]
        credential.gate.set()
        assert [await tokens.token(), await tokens.token()] == ["token-1", "token-2"]

        refused = ScriptedCredential(lifetime=3600, refuse="AADSTS7000215: bad secret s3cr3t-v4lue")
        refused.gate.set()
        tokens = EntraTokens(refused, SCOPE, "azure", "s3cr3t-v4lue")  # type: ignore[arg-type]
        with pytest.raises(ProviderRejected) as caught:
            await tokens.token()
        assert "AADSTS7000215" in str(caught.value) and "s3cr3t-v4lue" not in str(caught.value)

    asyncio.run(story())
