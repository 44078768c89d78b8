"""Whatever bytes arrive, the gateway answers with JSON it meant to send: never a 500."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from gateway.edge import openapi
from tests.conftest import Pair
from tests.gateway_process import GatewayProcess

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["chat-model", "nope", ""]) | JSON,
    "messages": st.lists(st.fixed_dictionaries({}, optional={"role": JSON | st.just("user"),
                                                            "content": JSON}), max_size=3)
    | JSON,
    "prompt": JSON,
    "stream": st.booleans() | JSON,
    "n": JSON,
})
BODIES = (FIELDS.map(lambda d: json.dumps(d).encode()) | JSON.map(lambda v: json.dumps(v).encode())
          | st.binary(max_size=200))


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=BODIES, path=st.sampled_from(["chat/completions", "completions"]))
def test_no_body_makes_the_gateway_fail(pair: Pair, body: bytes, path: str) -> None:
    response = httpx.post(f"{pair.gateway.base_url}/{path}", content=body,
                          headers={"Content-Type": "application/json"}, timeout=10)

    assert response.status_code != 500, response.text
    assert "Traceback" not in response.text
    if response.headers["content-type"].startswith("application/json"):
        payload = response.json()
        assert "choices" in payload or set(payload) == {"error"}
    else:
        assert response.headers["content-type"].startswith("text/event-stream")


# -- every endpoint, every provider kind ---------------------------------------------------------

KIND_ALIASES = ["openai-m", "anthropic-m", "google-m", "ollama-m"]


def fixed(required: dict[str, Any], **optional: Any) -> st.SearchStrategy[dict[str, Any]]:
    """An object with these fields; the optional ones present or not."""
    return st.fixed_dictionaries(
        {k: v if isinstance(v, st.SearchStrategy) else st.just(v) for k, v in required.items()},
        optional={k: v if isinstance(v, st.SearchStrategy) else st.just(v)
                  for k, v in optional.items()})


def rarely_wrong(valid: Any) -> st.SearchStrategy[Any]:
    """`valid` nine times in ten, any JSON at all the tenth: the bodies are mostly well-formed,
    so they reach the kinds' translators and the upstreams, each with a wrong value here and
    there, at any depth, as a translator would meet it."""
    valid = valid if isinstance(valid, st.SearchStrategy) else st.just(valid)
    return st.integers(0, 9).flatmap(lambda roll: JSON if roll == 0 else valid)


TEXT = st.text(max_size=12)
SCHEMA = st.sampled_from([{"type": "object", "properties": {"a": {"type": "string"}}},
                          {"type": "object", "$defs": {"A": {"type": "integer"}},
                           "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}])
PART = st.one_of(
    fixed({"type": "text", "text": rarely_wrong(TEXT)}),
    fixed({"type": "image_url", "image_url": rarely_wrong(st.sampled_from([
        {"url": "data:image/png;base64,AAAA"}, "https://example.com/a.png"]))}),
    fixed({"type": "input_audio",
           "input_audio": rarely_wrong(fixed({"data": "AAAA", "format": "wav"}))}))
CONTENT = rarely_wrong(TEXT | st.lists(rarely_wrong(PART), min_size=1, max_size=2))
FUNCTION = fixed({"name": st.sampled_from(["f", "g"])},
                 arguments=rarely_wrong(st.just('{"a": "x"}')))
CALL = fixed({"id": "call_1", "type": "function", "function": rarely_wrong(FUNCTION)},
             extra_content=JSON)
MESSAGE = st.one_of(
    fixed({"role": "user", "content": CONTENT}),
    fixed({"role": "system", "content": CONTENT}),
    fixed({"role": "assistant"}, content=CONTENT,
          tool_calls=rarely_wrong(st.lists(CALL, min_size=1, max_size=2)),
          function_call=rarely_wrong(FUNCTION)),
    fixed({"role": "tool", "tool_call_id": "call_1", "content": CONTENT}))
SAMPLING = {"stream": rarely_wrong(st.booleans()), "max_tokens": rarely_wrong(st.integers(1, 64)),
            "temperature": rarely_wrong(st.floats(0, 2)), "user": rarely_wrong(TEXT),
            "stop": rarely_wrong(st.sampled_from(["\n", ["x", "y"]]))}
CHAT = fixed(
    {"model": st.sampled_from(KIND_ALIASES),
     "messages": rarely_wrong(st.lists(rarely_wrong(MESSAGE), min_size=1, max_size=3))},
    **SAMPLING, n=rarely_wrong(st.integers(1, 2)),
    tools=rarely_wrong(st.lists(fixed({"type": "function", "function": rarely_wrong(fixed(
        {"name": "f"}, description=TEXT, parameters=rarely_wrong(SCHEMA)))}), max_size=2)),
    tool_choice=rarely_wrong(st.sampled_from(["auto", "none", "required", {
        "type": "function", "function": {"name": "f"}}])),
    response_format=rarely_wrong(st.sampled_from([{"type": "json_object"}]) | fixed({
        "type": "json_schema", "json_schema": rarely_wrong(fixed({"name": "s"},
                                                                  schema=rarely_wrong(SCHEMA)))})),
    reasoning_effort=rarely_wrong(st.sampled_from(["low", "high", "none"])),
    chat_template_kwargs=rarely_wrong(fixed({}, thinking=rarely_wrong(st.booleans()))),
    functions=rarely_wrong(st.lists(fixed({"name": "f"}, parameters=SCHEMA), max_size=1)),
    function_call=rarely_wrong(st.sampled_from(["auto", {"name": "f"}])),
    parallel_tool_calls=rarely_wrong(st.booleans()))
COMPLETION = fixed({"model": st.sampled_from(KIND_ALIASES),
                    "prompt": rarely_wrong(TEXT | st.lists(TEXT, min_size=1, max_size=2))},
                   **SAMPLING, n=rarely_wrong(st.integers(1, 2)))
ITEM = st.one_of(
    fixed({"type": "message", "role": st.sampled_from(["user", "assistant", "system"]),
           "content": rarely_wrong(TEXT | st.lists(fixed({"type": "input_text",
                                                          "text": rarely_wrong(TEXT)}),
                                                    min_size=1, max_size=2))}),
    fixed({"type": "function_call", "call_id": "c", "name": "f"},
          arguments=rarely_wrong(st.just("{}"))),
    fixed({"type": "function_call_output", "call_id": "c", "output": rarely_wrong(TEXT)}),
    fixed({"type": "reasoning"}))
RESPONSES = fixed(
    {"model": st.sampled_from(KIND_ALIASES),
     "input": rarely_wrong(TEXT | st.lists(rarely_wrong(ITEM), min_size=1, max_size=3))},
    stream=rarely_wrong(st.booleans()), store=rarely_wrong(st.booleans()),
    instructions=rarely_wrong(TEXT), temperature=rarely_wrong(st.floats(0, 2)),
    max_output_tokens=rarely_wrong(st.integers(16, 64)),
    parallel_tool_calls=rarely_wrong(st.booleans()),
    tools=rarely_wrong(st.lists(fixed({"type": "function", "name": "f"},
                                      parameters=rarely_wrong(SCHEMA)), max_size=2)),
    tool_choice=rarely_wrong(st.sampled_from(["auto", "required", {"type": "function",
                                                                   "name": "f"}])),
    text=rarely_wrong(fixed({}, format=rarely_wrong(st.sampled_from([
        {"type": "text"}, {"type": "json_schema", "name": "s",
                           "schema": {"type": "object"}}])))),
    reasoning=rarely_wrong(fixed({}, effort=rarely_wrong(st.sampled_from(["low", "high"])))))
EMBEDDINGS = fixed(
    {"model": st.sampled_from(KIND_ALIASES),
     "input": rarely_wrong(TEXT.filter(bool) | st.lists(TEXT.filter(bool), min_size=1,
                                                         max_size=3))},
    encoding_format=rarely_wrong(st.sampled_from(["float", "base64"])),
    dimensions=rarely_wrong(st.integers(1, 16)))
BLOCK = st.one_of(
    fixed({"type": "text", "text": rarely_wrong(TEXT)}, cache_control=JSON),
    fixed({"type": "image", "source": rarely_wrong(st.sampled_from([
        {"type": "base64", "media_type": "image/png", "data": "AAAA"},
        {"type": "url", "url": "https://example.com/a.png"}]))}),
    fixed({"type": "tool_use", "id": "t1", "name": "f", "input": rarely_wrong(st.just({}))}),
    fixed({"type": "tool_result", "tool_use_id": "t1"},
          content=rarely_wrong(TEXT | st.lists(fixed({"type": "text", "text": TEXT}),
                                               max_size=2)),
          is_error=rarely_wrong(st.booleans())),
    fixed({"type": "thinking", "thinking": rarely_wrong(TEXT), "signature": "s"}))
MESSAGES = fixed(
    {"model": st.sampled_from(KIND_ALIASES), "max_tokens": rarely_wrong(st.integers(1, 64)),
     "messages": rarely_wrong(st.lists(rarely_wrong(fixed({
         "role": st.sampled_from(["user", "assistant"]),
         "content": rarely_wrong(TEXT | st.lists(rarely_wrong(BLOCK), min_size=1,
                                                 max_size=3))})), min_size=1, max_size=3))},
    system=rarely_wrong(TEXT | st.lists(fixed({"type": "text", "text": TEXT}), max_size=2)),
    stream=rarely_wrong(st.booleans()), stop_sequences=rarely_wrong(st.lists(TEXT, max_size=2)),
    tools=rarely_wrong(st.lists(fixed({"name": "f"}, input_schema=rarely_wrong(SCHEMA),
                                      description=TEXT), max_size=2)),
    tool_choice=rarely_wrong(st.sampled_from([{"type": "auto"}, {"type": "any"},
                                              {"type": "tool", "name": "f"}])),
    thinking=rarely_wrong(fixed({"type": "enabled"},
                                budget_tokens=rarely_wrong(st.integers(0, 20000)))),
    metadata=rarely_wrong(fixed({}, user_id=rarely_wrong(TEXT))))
REQUESTS = st.one_of(st.tuples(st.just("chat/completions"), CHAT),
                     st.tuples(st.just("completions"), COMPLETION),
                     st.tuples(st.just("responses"), RESPONSES),
                     st.tuples(st.just("embeddings"), EMBEDDINGS),
                     st.tuples(st.just("messages"), MESSAGES),
                     st.tuples(st.just("messages/count_tokens"), MESSAGES))


def test_no_body_makes_any_kind_fail_on_any_endpoint(every_kind: GatewayProcess) -> None:
    statuses: Counter[int] = Counter()

    @settings(max_examples=600, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(request=REQUESTS)
    def run(request: tuple[str, dict[str, Any]]) -> None:
        path, body = request
        response = httpx.post(f"{every_kind.base_url}/{path}", content=json.dumps(body),
                              headers={"Content-Type": "application/json"}, timeout=15)
        statuses[response.status_code] += 1
        assert response.status_code < 500, response.text
        if response.status_code >= 400 and path.startswith("messages"):  # Anthropic's shape
            answer = response.json()
            assert answer["type"] == "error" and {"message", "type"} <= set(answer["error"])
        elif response.status_code >= 400:  # the envelope, whoever refused it
            error = response.json()["error"]
            assert {"message", "type", "code", "param"} <= set(error)
            if error["message"].startswith("Invalid request:"):  # a typed check names where
                assert error["param"], error

    run()
    print(f"hypothesis every kind, every endpoint: {sum(statuses.values())} cases, "
          f"statuses {dict(sorted(statuses.items()))}")
    # Bodies reached the providers too, not only the gateway's own checks.
    assert sum(statuses.values()) >= 300 and statuses[200] >= 150


SCHEMA = schemathesis.openapi.from_dict(openapi.document())
# Anthropic's routes take any role and an integer `max_tokens`, so few generated bodies are
# ones a provider answers: one that is, given with the generated ones, shows they get through.
ANSWERABLE = {
    "/v1/messages": {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "hi"}]},
}


@pytest.mark.parametrize("path", list(openapi.ROUTES))
def test_schemathesis_finds_no_server_error_on_the_relay_routes(every_kind: GatewayProcess,
                                                                path: str) -> None:
    cases = []
    operation = SCHEMA[path]["POST"]

    @settings(max_examples=60, deadline=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(), model=st.sampled_from(KIND_ALIASES))
    def generated(case: Any, model: str) -> None:
        if isinstance(case.body, dict):
            case.body["model"] = model
        response = case.call(base_url=every_kind.url, timeout=15)
        cases.append(response.status_code)
        assert response.status_code < 500, response.text

    run = generated if path not in ANSWERABLE else example(
        case=operation.Case(body=dict(ANSWERABLE[path]), media_type="application/json"),
        model="anthropic-m")(generated)
    run()
    # Generated bodies reached the providers, not only the gateway's own checks.
    print(f"schemathesis {path}: {len(cases)} cases, statuses {sorted(Counter(cases).items())}")
    assert len(cases) >= 30 and 200 in cases
