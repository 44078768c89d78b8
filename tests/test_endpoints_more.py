"""OpenAI's endpoints besides chat, and the passthrough, through the same pipeline as chat.

Real clients (the OpenAI SDK; httpx and Cohere's SDK in the Cohere shape for rerank) call a real
gateway process in front of fakes on real sockets (`tests.upstream`, `tests.fake_native`) that
answer as OpenAI does, whole and with its errors: moderations, rerank, images (generated, edited
from an upload), speech (audio bytes streamed through as they come), transcriptions and
translations (multipart uploads with the model field rewritten); failover, the 413 for an upload
over the limit before it is read, answers checked against OpenAI's published schemas, a model
whose providers lack the endpoint refused cleanly. Then `/passthrough/{provider}/{path}`: the
provider's key injected, only allowed paths, behind a client key, redacted, counted.
"""

from __future__ import annotations

import base64
import contextlib
import socket
from collections.abc import Iterator

import cohere
import httpx
import openai
import pytest

from tests import fake_native
from tests.fake_anthropic import FakeAnthropic
from tests.gateway_process import GatewayProcess, config, provider
from tests.minutes import within_one_minute
from tests.openapi import validate
from tests.upstream import FakeUpstream, echo_headers, held_mid, status

KEY = "client-key-0001"
LIMITED = "limited-key-0001"  # one request a minute
PROVIDER_KEY = "sk-test-secret-123456"  # `provider()`'s key: the fakes see it, clients never
MAX_BODY = 256 * 1024
MODELS = {"omni-moderation-latest": "omni-up", "rerank-m": "bge-reranker-up",
          "gpt-image-1": {"id": "gpt-image-1", "price": {"input": 5000.0, "output": 40000.0}},
          "dall-e-2": "dall-e-2", "tts-1": "tts-up", "whisper-1": "whisper-up"}
PASSTHROUGH = ["/v1/fine_tuning/jobs", "/v1/vector_stores/*"]


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream]]:
    with FakeUpstream(name="primary") as primary, FakeUpstream(name="secondary") as secondary, \
            FakeAnthropic(name="claude") as claude:
        yield {"primary": primary, "secondary": secondary, "claude": claude}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    doc = config({
        "primary": provider(fakes["primary"].base_url, MODELS, passthrough=PASSTHROUGH),
        "secondary": provider(fakes["secondary"].base_url, MODELS, max_answer_bytes=10_000),
        "claude": {"type": "anthropic", "base_url": fakes["claude"].base_url.removesuffix("/v1"),
                   "api_key": "an-key-000000", "models": {"claude-only": "claude-x"},
                   "passthrough": ["/v1/models"]},
    }, server={"api_keys": [KEY, {"key": LIMITED, "id": "limited", "requests_per_minute": 1}],
               "max_body_bytes": MAX_BODY},
        defaults={"circuit": {"enabled": False}})
    process = GatewayProcess(tmp_path_factory.mktemp("endpoints"), doc).start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def fresh(fakes: dict[str, FakeUpstream]) -> None:
    for fake in fakes.values():
        fake.reset()


def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {KEY}"}


# -- moderations -------------------------------------------------------------------------------


def test_moderations_through_the_sdk_match_openai_s_schema(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    raw = client(gateway).moderations.with_raw_response.create(
        model="omni-moderation-latest", input=["I will kill the process", "hello"])
    answer = raw.parse()

    assert [r.flagged for r in answer.results] == [True, False]
    assert answer.results[0].categories.violence is True
    validate(raw.http_response.json(), "CreateModerationResponse")
    assert raw.headers["x-llms-provider"] == "primary"
    sent = fakes["primary"].last_json
    assert sent["model"] == "omni-up", "the alias is sent as the upstream's id"
    assert fakes["primary"].requests[-1].headers["authorization"] == f"Bearer {PROVIDER_KEY}"


def test_moderations_without_a_model_route_to_openai_s_default(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = client(gateway).moderations.create(input="a calm sentence")

    assert answer.results[0].flagged is False
    assert fakes["primary"].last_json["model"] == "omni-up"


def test_a_failing_first_provider_fails_over_to_the_second(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(status(503, "overloaded"))
    raw = client(gateway).moderations.with_raw_response.create(input="kill it")

    assert raw.parse().results[0].flagged is True
    assert raw.headers["x-llms-provider"] == "secondary"
    assert raw.headers["x-llms-attempts"] == "2"
    assert len(fakes["primary"].requests) == 1 and len(fakes["secondary"].requests) == 1


def test_an_upstream_s_client_error_is_relayed_in_the_envelope_and_not_failed_over(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = httpx.post(f"{gateway.base_url}/moderations", headers=auth(),
                        json={"model": "omni-moderation-latest", "input": []})

    assert answer.status_code == 400, "the gateway's own check: input is required"
    fakes["primary"].set_mode(status(400, "input has an unsupported type"))
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).moderations.create(input="x")
    assert "unsupported type" in str(caught.value)
    assert not fakes["secondary"].requests


def test_an_upstream_echoing_its_credentials_never_shows_them(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    for fake in ("primary", "secondary"):
        fakes[fake].set_mode(echo_headers(code=400))
    answer = httpx.post(f"{gateway.base_url}/moderations", headers=auth(),
                        json={"input": "x"})

    assert answer.status_code == 400
    assert PROVIDER_KEY not in answer.text and "debug" in answer.text


def test_an_alias_whose_providers_lack_the_endpoint_is_refused_cleanly(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    for path, body in (("moderations", {"model": "claude-only", "input": "x"}),
                       ("audio/speech", {"model": "claude-only", "input": "x",
                                         "voice": "alloy"})):
        answer = httpx.post(f"{gateway.base_url}/{path}", headers=auth(), json=body)
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "model" and f"/v1/{path}" in error["message"]
    assert not fakes["claude"].requests


def test_a_key_s_limits_hold_on_these_endpoints_too(gateway: GatewayProcess,
                                                   fakes: dict[str, FakeUpstream]) -> None:
    limited = openai.OpenAI(base_url=gateway.base_url, api_key=LIMITED, max_retries=0)

    def story() -> None:  # counts only what it spends: a second telling shares the minute
        before = len(fakes["primary"].requests)
        with contextlib.suppress(openai.RateLimitError):  # the minute's one request is spent
            limited.moderations.create(input="first")
        try:
            limited.audio.transcriptions.create(model="whisper-1", file=("a.wav", b"second"))
        except openai.RateLimitError:
            pass
        else:
            raise AssertionError("the key's second request in a minute was not refused")
        assert len(fakes["primary"].requests) - before <= 1
        assert not any("transcriptions" in r.path for r in fakes["primary"].requests[before:])

    within_one_minute(story)


# -- rerank -------------------------------------------------------------------------------------

DOCS = ["Paris is the capital of France", "The cat sat on the mat",
        "France exports wine and cheese"]


def test_rerank_in_the_cohere_shape(gateway: GatewayProcess,
                                    fakes: dict[str, FakeUpstream]) -> None:
    answer = httpx.post(f"{gateway.base_url}/rerank", headers=auth(), json={
        "model": "rerank-m", "query": "capital of France", "documents": DOCS, "top_n": 2})

    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [r["index"] for r in results] == [0, 2]
    assert results[0]["relevance_score"] == fake_native.relevance("capital of France", DOCS[0])
    assert fakes["primary"].last_json["model"] == "bge-reranker-up"
    assert answer.headers["x-llms-model"] == "rerank-m"


def test_rerank_refuses_a_body_without_documents_before_any_upstream(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = httpx.post(f"{gateway.base_url}/rerank", headers=auth(),
                        json={"model": "rerank-m", "query": "q", "documents": []})

    assert answer.status_code == 400 and answer.json()["error"]["param"] == "documents"
    assert not fakes["primary"].requests


def test_rerank_through_cohere_s_sdk(gateway: GatewayProcess) -> None:
    co = cohere.Client(api_key=KEY, base_url=gateway.url)
    ranked = co.rerank(model="rerank-m", query="capital of France", documents=DOCS, top_n=2)

    assert [r.index for r in ranked.results] == [0, 2]
    v2 = cohere.ClientV2(api_key=KEY, base_url=gateway.url)
    assert [r.index for r in v2.rerank(model="rerank-m", query="cat on a mat",
                                       documents=DOCS, top_n=1).results] == [1]


# -- images -------------------------------------------------------------------------------------


def test_images_generate_b64_and_url_answers_match_openai_s_schema(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    raw = client(gateway).images.with_raw_response.generate(model="gpt-image-1",
                                                            prompt="a red cat", n=2)
    answer = raw.parse()

    assert [base64.b64decode(d.b64_json or "") for d in answer.data] == [
        fake_native.image_bytes("a red cat", i) for i in range(2)]
    validate(raw.http_response.json(), "ImagesResponse")
    assert answer.usage is not None and answer.usage.output_tokens == 272
    assert float(raw.headers["x-llms-cost"]) > 0, "priced from the answer's usage, as chat"
    urls = client(gateway).images.generate(model="dall-e-2", prompt="a dog",
                                           response_format="url")
    assert urls.data[0].url == "https://images.example/0.png"


def test_images_edit_uploads_the_image_as_it_came(gateway: GatewayProcess,
                                                  fakes: dict[str, FakeUpstream]) -> None:
    picture = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40  # every byte value, CRLFs too
    raw = client(gateway).images.with_raw_response.edit(
        model="gpt-image-1", image=("cat.png", picture, "image/png"), prompt="add a hat")

    validate(raw.http_response.json(), "ImagesResponse")
    assert base64.b64decode(raw.parse().data[0].b64_json or "") == fake_native.image_bytes(
        f"add a hat|{len(picture)}", 0)
    fields, files = fake_native.form_of(fakes["primary"].requests[-1].body,
                                        fakes["primary"].requests[-1].headers["content-type"])
    assert (files.get("image") or files["image[]"]) == [picture]
    assert fields["model"] == "gpt-image-1" and fields["prompt"] == "add a hat"


# -- audio --------------------------------------------------------------------------------------

SPOKEN = {"model": "tts-1", "input": "Hello from the gateway", "voice": "alloy"}


def test_speech_is_streamed_through_as_it_comes(gateway: GatewayProcess,
                                                fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(held_mid())  # the fake sends one chunk, then waits for us
    whole = fake_native.speech_bytes(SPOKEN)
    with client(gateway).audio.speech.with_streaming_response.create(
            model="tts-1", input=SPOKEN["input"], voice="alloy") as response:
        assert response.headers["content-type"] == "audio/mpeg"
        chunks = response.iter_bytes()
        first = next(chunks)  # arrives while the upstream is still answering
        assert whole.startswith(first) and len(first) < len(whole)
        fakes["primary"].release()
        rest = b"".join(chunks)
    assert first + rest == whole
    assert fakes["primary"].last_json["model"] == "tts-up"


def test_speech_fails_over_before_its_first_byte_and_answers_whole(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(status(500))
    body = {**SPOKEN, "input": "short", "response_format": "wav"}
    response = client(gateway).audio.speech.with_raw_response.create(
        model="tts-1", input="short", voice="alloy", response_format="wav")

    assert response.headers["x-llms-provider"] == "secondary"
    assert response.headers["content-type"] == "audio/wav"
    assert response.content == fake_native.speech_bytes(body)
    plain = client(gateway).audio.speech.create(model="tts-1", input="short", voice="alloy")
    assert plain.content == fake_native.speech_bytes(body)


def test_speech_past_the_provider_s_max_answer_bytes_is_cut_not_ended_as_whole(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(status(503))  # the secondary takes at most 10,000 bytes
    fakes["secondary"].set_mode(held_mid())  # its first chunk (4,096 bytes) fits: committed
    with pytest.raises(httpx.HTTPError), httpx.stream(
            "POST", f"{gateway.base_url}/audio/speech", headers=auth(),
            json={**SPOKEN, "input": "x" * 40}) as response:
        assert response.status_code == 200
        chunks = response.iter_bytes()
        assert next(chunks)
        fakes["secondary"].release()
        b"".join(chunks)  # 16,003 bytes in all: the cut comes past the 10,000th


def test_transcriptions_upload_a_file_and_rewrite_only_the_model(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    audio = b"hello world from a wav file"
    raw = client(gateway).audio.transcriptions.with_raw_response.create(
        model="whisper-1", file=("a.wav", audio, "audio/wav"), language="en")

    assert raw.parse().text == audio.decode()
    validate(raw.http_response.json(), "CreateTranscriptionResponseJson")
    fields, files = fake_native.form_of(fakes["primary"].requests[-1].body,
                                        fakes["primary"].requests[-1].headers["content-type"])
    assert fields == {"model": "whisper-up", "language": "en"} and files["file"] == [audio]
    text = client(gateway).audio.transcriptions.create(
        model="whisper-1", file=("a.wav", audio, "audio/wav"), response_format="text")
    assert text.strip() == audio.decode(), "a text answer is relayed as text"
    verbose = httpx.post(f"{gateway.base_url}/audio/transcriptions", headers=auth(),
                         files={"file": ("a.wav", audio)},
                         data={"model": "whisper-1", "response_format": "verbose_json"})
    validate(verbose.json(), "CreateTranscriptionResponseVerboseJson")


def test_translations_fail_over_with_the_same_upload(gateway: GatewayProcess,
                                                     fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(status(502))
    raw = client(gateway).audio.translations.with_raw_response.create(
        model="whisper-1", file=("b.mp3", b"bonjour le monde", "audio/mpeg"))

    assert raw.parse().text == "(en) bonjour le monde"
    validate(raw.http_response.json(), "CreateTranslationResponseJson")
    assert raw.headers["x-llms-provider"] == "secondary"
    assert fakes["primary"].requests[-1].body == fakes["secondary"].requests[-1].body


def test_an_upload_without_its_file_is_a_400_naming_it(gateway: GatewayProcess,
                                                       fakes: dict[str, FakeUpstream]) -> None:
    answer = httpx.post(f"{gateway.base_url}/audio/transcriptions", headers=auth(),
                        data={"model": "whisper-1"}, files={"other": ("x", b"y")})

    assert answer.status_code == 400 and answer.json()["error"]["param"] == "file"
    not_form = httpx.post(f"{gateway.base_url}/audio/transcriptions", headers=auth(),
                          json={"model": "whisper-1"})
    assert not_form.status_code == 400
    assert not fakes["primary"].requests


def test_an_upload_over_the_limit_is_a_413_from_the_sdk(gateway: GatewayProcess,
                                                        fakes: dict[str, FakeUpstream]) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        client(gateway).audio.transcriptions.create(
            model="whisper-1", file=("big.wav", b"x" * (MAX_BODY + 1), "audio/wav"))

    assert caught.value.status_code == 413
    assert not fakes["primary"].requests


def test_an_upload_over_the_limit_is_refused_before_it_is_read_whole(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    """The client announces 50 MB and sends only its head and a first piece: the 413 comes
    back while the rest was never sent."""
    head = (f"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {KEY}\r\n"
            f"Content-Type: multipart/form-data; boundary=XX\r\n"
            f"Content-Length: {50 * 1024 * 1024}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(head + b"--XX\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n")
        answer = sock.recv(65536)

    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"request_too_large" in answer or b"larger than" in answer
    assert not fakes["primary"].requests


# -- metrics ------------------------------------------------------------------------------------


def test_metrics_count_each_endpoint_and_the_passthrough(gateway: GatewayProcess) -> None:
    client(gateway).moderations.create(input="counted")
    httpx.get(f"{gateway.url}/passthrough/primary/v1/fine_tuning/jobs", headers=auth())
    metrics = httpx.get(f"{gateway.url}/metrics", headers=auth()).text
    lines = [line for line in metrics.splitlines() if line.startswith("llms_requests_total{")]

    assert any('endpoint="moderations"' in line and 'provider="primary"' in line
               for line in lines)
    assert any('endpoint="passthrough"' in line for line in lines)


# -- passthrough --------------------------------------------------------------------------------


def test_passthrough_relays_an_allowed_path_with_the_provider_s_key(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = httpx.post(f"{gateway.url}/passthrough/primary/v1/fine_tuning/jobs?limit=2",
                        headers={**auth(), "OpenAI-Beta": "x"}, json={"training_file": "f"})

    assert answer.status_code == 200
    assert answer.json()["path"] == "/v1/fine_tuning/jobs" and answer.json()["query"] == "limit=2"
    seen = fakes["primary"].requests[-1]
    assert seen.method == "POST" and seen.json == {"training_file": "f"}
    assert seen.headers["authorization"] == f"Bearer {PROVIDER_KEY}", "the provider's own key"
    assert KEY not in str(seen.headers), "the client's key stays at the gateway"
    assert seen.headers["openai-beta"] == "x"
    deleted = httpx.delete(f"{gateway.url}/passthrough/primary/v1/vector_stores/vs_1",
                           headers=auth())
    assert deleted.status_code == 200 and deleted.json()["method"] == "DELETE"


def test_passthrough_answers_404_for_a_path_not_allowed_without_calling_upstream(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    for path in ("/passthrough/primary/v1/files", "/passthrough/primary/v1/fine_tuning/jobs/x",
                 "/passthrough/secondary/v1/fine_tuning/jobs", "/passthrough/nobody/v1/x"):
        answer = httpx.get(f"{gateway.url}{path}", headers=auth())
        assert answer.status_code == 404, path
        assert answer.json()["error"]["type"]
    assert not fakes["primary"].requests and not fakes["secondary"].requests


def test_passthrough_needs_a_client_key(gateway: GatewayProcess,
                                        fakes: dict[str, FakeUpstream]) -> None:
    missing = httpx.get(f"{gateway.url}/passthrough/primary/v1/fine_tuning/jobs")
    wrong = httpx.get(f"{gateway.url}/passthrough/primary/v1/fine_tuning/jobs",
                      headers={"Authorization": f"Bearer {PROVIDER_KEY}"})

    assert missing.status_code == 401 and wrong.status_code == 401
    assert not fakes["primary"].requests


def test_passthrough_redacts_an_upstream_that_echoes_the_credential(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = httpx.get(f"{gateway.url}/passthrough/primary/v1/vector_stores/echo",
                       headers=auth())

    assert answer.status_code == 200
    assert "authorization=" in answer.json()["debug"].lower(), "the echo came back"
    assert PROVIDER_KEY not in answer.text and PROVIDER_KEY not in str(answer.headers)
    assert fakes["primary"].requests[-1].headers["authorization"] == f"Bearer {PROVIDER_KEY}"


def test_passthrough_relays_an_upstream_error_as_it_came(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(status(429, "slow down", retry_after=3))
    answer = httpx.get(f"{gateway.url}/passthrough/primary/v1/fine_tuning/jobs",
                       headers=auth())

    assert answer.status_code == 429 and answer.headers["retry-after"] == "3"
    assert answer.json()["error"]["message"] == "slow down"


def test_passthrough_to_another_kind_sends_its_own_credentials(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    httpx.get(f"{gateway.url}/passthrough/claude/v1/models", headers=auth())

    seen = fakes["claude"].requests[-1]
    assert seen.headers["x-api-key"] == "an-key-000000" and "authorization" not in seen.headers
