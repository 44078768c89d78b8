"""`/v1/embeddings`: the RAG half, through the same routing, failover and envelopes as chat.

Real clients (the OpenAI SDK sync and async, LangChain, LlamaIndex) call a real gateway process;
upstreams are fakes on real sockets that embed deterministically (`tests.upstream.vector`), so
every vector a client gets can be checked against the one its provider made.
"""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.fake_anthropic import FakeAnthropic
from tests.fake_gemini import FakeGemini
from tests.fake_ollama import FakeOllama
from tests.gateway_process import GatewayProcess, config, provider
from tests.openapi import validate
from tests.upstream import FakeUpstream, status, vector

DOCS = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Stock prices fell today."]


@pytest.fixture(scope="module")
def fakes() -> Iterator[dict[str, FakeUpstream]]:
    with FakeUpstream(name="primary") as primary, FakeUpstream(name="secondary") as secondary, \
            FakeGemini(name="gemini") as gemini, FakeOllama(name="ollama") as ollama, \
            FakeAnthropic(name="claude") as claude:
        yield {"primary": primary, "secondary": secondary, "gemini": gemini,
               "ollama": ollama, "claude": claude}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            fakes: dict[str, FakeUpstream]) -> Iterator[GatewayProcess]:
    price = {"input": 1000.0, "output": 0}  # large enough to show in x-llms-cost
    doc = config({
        "claude": {"type": "anthropic", "base_url": fakes["claude"].base_url.removesuffix("/v1"),
                   "api_key": "an-key-000000",
                   "models": {"text-embedding-3-small": "claude-x", "chat-only": "claude-x"}},
        "primary": provider(fakes["primary"].base_url, {
            "text-embedding-3-small": {"id": "embed-large", "price": price}}),
        "secondary": provider(fakes["secondary"].base_url, {"text-embedding-3-small": "e2"}),
        "gemini": {"type": "google", "base_url": fakes["gemini"].base_url,
                   "api_key": "gm-key-000000", "models": {"gemini-embed": "text-embedding-004"}},
        "gemini-small-batches": {"type": "google", "base_url": fakes["gemini"].base_url,
                                 "api_key": "gm-key-000000", "max_embedding_batch": 40,
                                 "models": {"gemini-embed-40": "text-embedding-004"}},
        "ollama": {"type": "ollama", "base_url": fakes["ollama"].base_url,
                   "models": {"nomic": "nomic-embed-text"}},
    }, defaults={"circuit": {"enabled": False}})
    process = GatewayProcess(tmp_path_factory.mktemp("embeddings"), doc).start()
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def fresh(fakes: dict[str, FakeUpstream]) -> None:
    for fake in fakes.values():
        fake.reset()


def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, abs_tol=1e-6) for x, y in zip(a, b,
                                                                                    strict=True))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def floats(encoded: str) -> list[float]:
    raw = base64.b64decode(encoded)
    return list(struct.unpack(f"<{len(raw) // 4}f", raw))


def test_the_openai_sdk_embeds_a_batch_and_gets_each_vector_in_order(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    raw = client(gateway).embeddings.with_raw_response.create(
        model="text-embedding-3-small", input=DOCS)
    answer = raw.parse()
    assert raw.headers["x-llms-provider"] == "primary", "the anthropic kind cannot embed: skipped"
    assert raw.headers["x-llms-attempts"] == "1"
    assert [e.index for e in answer.data] == [0, 1, 2]
    assert all(close(e.embedding, vector(text)) for e, text in zip(answer.data, DOCS,
                                                                  strict=True))
    sent = fakes["primary"].last_json
    assert sent["model"] == "embed-large" and sent["input"] == DOCS
    assert sent["encoding_format"] == "base64", "the SDK asks for base64; it is relayed as asked"
    assert answer.usage.prompt_tokens == sum(len(d.split()) for d in DOCS)
    assert float(raw.headers["x-llms-cost"]) == pytest.approx(0.017), "priced like chat"
    assert not fakes["claude"].requests


def test_the_async_sdk_asks_for_floats_and_the_answer_matches_openai_s_schema(
        gateway: GatewayProcess) -> None:
    async def embed() -> openai.types.CreateEmbeddingResponse:
        async with openai.AsyncOpenAI(base_url=gateway.base_url, api_key="unused",
                                      max_retries=0) as aclient:
            return await aclient.embeddings.create(model="text-embedding-3-small",
                                                   input="hello world", encoding_format="float",
                                                   dimensions=4)

    answer = asyncio.run(embed())
    assert close(answer.data[0].embedding, vector("hello world", 4))
    validate(answer.model_dump(exclude_unset=True), "CreateEmbeddingResponse")


def test_base64_from_an_openai_upstream_is_relayed_as_it_came(
        gateway: GatewayProcess) -> None:
    body = httpx.post(f"{gateway.base_url}/embeddings", json={
        "model": "text-embedding-3-small", "input": ["one two"],
        "encoding_format": "base64"}).json()
    validate(body, "CreateEmbeddingResponse")
    assert isinstance(body["data"][0]["embedding"], str)
    assert close(floats(body["data"][0]["embedding"]), vector("one two"))


def test_token_arrays_reach_an_openai_upstream_untouched(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = client(gateway).embeddings.create(model="text-embedding-3-small",
                                               input=[[1, 2, 3], [4, 5]],
                                               encoding_format="float")
    assert fakes["primary"].last_json["input"] == [[1, 2, 3], [4, 5]]
    assert close(answer.data[1].embedding, vector([4, 5]))


def test_primary_returns_503_and_the_secondary_embeds_and_says_so(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(status(503))
    raw = client(gateway).embeddings.with_raw_response.create(
        model="text-embedding-3-small", input="failover", encoding_format="float")
    assert raw.headers["x-llms-provider"] == "secondary"
    assert raw.headers["x-llms-attempts"] == "2"
    assert close(raw.parse().data[0].embedding, vector("failover"))


def test_an_upstream_that_answers_too_few_vectors_is_failed_over(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    wrong = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1]}]}'
    fakes["primary"].set_mode(status(200, body=wrong))
    answer = httpx.post(f"{gateway.base_url}/embeddings", json={
        "model": "text-embedding-3-small", "input": ["a", "b"]})
    assert answer.status_code == 200
    assert answer.headers["x-llms-provider"] == "secondary"
    assert len(answer.json()["data"]) == 2


def test_a_client_error_is_not_failed_over(gateway: GatewayProcess,
                                           fakes: dict[str, FakeUpstream]) -> None:
    fakes["primary"].set_mode(status(400, "input is too long for this model"))
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).embeddings.create(model="text-embedding-3-small", input="x")
    assert "too long" in str(caught.value)
    assert not fakes["secondary"].requests


def test_gemini_embeds_through_batch_embed_contents_and_the_gateway_encodes_base64(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = client(gateway).embeddings.create(model="gemini-embed", input=DOCS, dimensions=6)
    assert all(close(e.embedding, vector(text, 6)) for e, text in zip(answer.data, DOCS,
                                                                     strict=True))
    sent = fakes["gemini"].requests[-1]
    assert sent.path.endswith("/models/text-embedding-004:batchEmbedContents")
    assert sent.headers["x-goog-api-key"] == "gm-key-000000"
    assert sent.json["requests"][0] == {"model": "models/text-embedding-004",
                                        "content": {"parts": [{"text": DOCS[0]}]},
                                        "outputDimensionality": 6}
    assert answer.usage.prompt_tokens > 0, "estimated: Gemini reports no count"


def test_a_batch_past_the_provider_limit_is_split_and_joined_in_order(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    texts = [f"document number {n}" for n in range(250)]
    body = httpx.post(f"{gateway.base_url}/embeddings", json={
        "model": "gemini-embed", "input": texts, "encoding_format": "float"}).json()
    calls = [len(r.json["requests"]) for r in fakes["gemini"].requests]
    assert calls == [100, 100, 50], "Gemini's limit of 100 a call"
    assert [e["index"] for e in body["data"]] == list(range(250))
    assert all(close(e["embedding"], vector(t)) for e, t in zip(body["data"], texts,
                                                              strict=True))
    fakes["gemini"].reset()
    httpx.post(f"{gateway.base_url}/embeddings", json={"model": "gemini-embed-40",
                                                         "input": texts[:90]})
    assert [len(r.json["requests"]) for r in fakes["gemini"].requests] == [40, 40, 10], \
        "max_embedding_batch in llms.json"


def test_ollama_embeds_through_api_embed_and_refuses_token_arrays_by_name(
        gateway: GatewayProcess, fakes: dict[str, FakeUpstream]) -> None:
    answer = client(gateway).embeddings.create(model="nomic", input=["a b", "c"],
                                               encoding_format="float")
    assert fakes["ollama"].requests[-1].path == "/api/embed"
    assert fakes["ollama"].last_json == {"model": "nomic-embed-text", "input": ["a b", "c"]}
    assert close(answer.data[0].embedding, vector("a b"))
    assert answer.usage.prompt_tokens == 3
    refused = httpx.post(f"{gateway.base_url}/embeddings",
                         json={"model": "nomic", "input": [[1, 2]]})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "input"


def test_an_alias_no_provider_can_embed_is_a_400_naming_model(gateway: GatewayProcess) -> None:
    answer = httpx.post(f"{gateway.base_url}/embeddings",
                        json={"model": "chat-only", "input": "x"})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "model" and "claude" in error["message"]


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "nomic", "input": ""}, "input"),
    ({"model": "nomic", "input": []}, "input"),
    ({"model": "nomic", "input": ["ok", ""]}, "input[1]"),
    ({"model": "nomic", "input": ["text", [1, 2]]}, "input"),
    ({"model": "nomic", "input": ["x"] * 2049}, "input"),
    ({"model": "nomic", "input": "x", "encoding_format": "hex"}, "encoding_format"),
    ({"model": "nomic", "input": "x", "dimensions": 0}, "dimensions"),
    ({"input": "x"}, "model"),
])
def test_bad_embedding_requests_are_400s_naming_the_field(
        gateway: GatewayProcess, body: dict[str, object], param: str) -> None:
    answer = httpx.post(f"{gateway.base_url}/embeddings", json=body)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param


def test_metrics_count_embeddings_as_their_own_endpoint(gateway: GatewayProcess) -> None:
    client(gateway).embeddings.create(model="nomic", input="counted")
    metrics = httpx.get(f"{gateway.base_url.removesuffix('/v1')}/metrics").text
    assert any(line.startswith("llms_requests_total{") and 'endpoint="embeddings"' in line
               and 'model="nomic"' in line for line in metrics.splitlines())


def test_langchain_embeds_documents_and_a_query(gateway: GatewayProcess) -> None:
    from langchain_openai import OpenAIEmbeddings

    # Against a server that is not OpenAI, LangChain's docs say to send text, not tiktoken ids.
    embedder = OpenAIEmbeddings(model="nomic", base_url=gateway.base_url, api_key="unused",
                                check_embedding_ctx_length=False)
    documents = embedder.embed_documents(DOCS)
    query = embedder.embed_query("Where did the cat sit?")
    assert len(documents) == 3 and all(len(v) == 8 for v in documents)
    assert close(documents[2], vector(DOCS[2]))
    assert cosine(query, documents[0]) > cosine(query, documents[2])


def test_llamaindex_embeds_text(gateway: GatewayProcess) -> None:
    from llama_index.embeddings.openai import OpenAIEmbedding

    embedder = OpenAIEmbedding(model_name="text-embedding-3-small", api_base=gateway.base_url,
                               api_key="unused", max_retries=0)
    batch = embedder.get_text_embedding_batch(DOCS)
    assert close(embedder.get_query_embedding("hello there"), vector("hello there"))
    assert all(close(v, vector(t)) for v, t in zip(batch, DOCS, strict=True))


def test_the_route_answers_without_the_v1_prefix_too(gateway: GatewayProcess) -> None:
    root = gateway.base_url.removesuffix("/v1")
    answer = httpx.post(f"{root}/embeddings", json={"model": "nomic", "input": "x"})
    assert answer.status_code == 200 and answer.json()["object"] == "list"


def test_the_openapi_document_describes_the_route(gateway: GatewayProcess) -> None:
    document = httpx.get(f"{gateway.base_url.removesuffix('/v1')}/openapi.json").json()
    assert "/v1/embeddings" in document["paths"]
