"""The clients our users run, pointed at the gateway: OpenAI SDK, LangChain, LlamaIndex."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import openai
import pytest

from tests.gateway_process import GatewayProcess, config, provider
from tests.upstream import FakeUpstream, ok, tool_call

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream(name="vllm") as up:
        yield up


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            upstream: FakeUpstream) -> Iterator[GatewayProcess]:
    doc = config({"vllm": provider(upstream.base_url,
                                   {"gpt-4o-mini": "org/model", "m": "org/model"},
                                   reasoning="chat_template_kwargs")},
                 defaults={"circuit": {"enabled": False}})
    process = GatewayProcess(tmp_path_factory.mktemp("clients"), doc).start()
    yield process
    process.stop()


@pytest.fixture
def fake(upstream: FakeUpstream) -> FakeUpstream:
    upstream.reset()
    return upstream


def sdk(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)


def test_streamed_reasoning_content_and_tool_call_equal_the_whole_answer(
        gateway: GatewayProcess, fake: FakeUpstream) -> None:
    fake.set_mode(tool_call("get_weather", '{"city": "Oslo"}', content="Checking.",
                            reasoning="They want weather."))
    request = {"model": "m", "messages": [{"role": "user", "content": "Weather in Oslo?"}],
               "tools": [WEATHER]}

    whole = sdk(gateway).chat.completions.create(**request)
    with sdk(gateway).chat.completions.stream(**request) as stream:
        final = stream.get_final_completion()

    for message in (whole.choices[0].message, final.choices[0].message):
        assert message.content == "Checking."
        assert message.tool_calls is not None
        assert message.tool_calls[0].function.name == "get_weather"
        assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Oslo"}
        assert (message.model_extra or {}).get("reasoning") == "They want weather."
    assert whole.choices[0].finish_reason == final.choices[0].finish_reason == "tool_calls"


def test_openai_sdk_async_stream_with_raw_response(gateway: GatewayProcess,
                                                   fake: FakeUpstream) -> None:
    async def run() -> tuple[str, str]:
        client = openai.AsyncOpenAI(base_url=gateway.base_url, api_key="x", max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in raw.parse()
                        if c.choices])
        await client.close()
        return raw.headers["x-llms-provider"], text

    assert asyncio.run(run()) == ("vllm", "Hello from vllm")


def test_langchain_invoke_stream_tools_and_structured_output(gateway: GatewayProcess,
                                                             fake: FakeUpstream) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    llm = ChatOpenAI(base_url=gateway.base_url, api_key="unused", model="m", max_retries=0,
                     extra_body={"chat_template_kwargs": {"thinking": False}})

    assert llm.invoke("Hello!").content == "Hello from vllm"
    assert fake.last_json["chat_template_kwargs"] == {"thinking": False}
    assert "".join(str(chunk.content) for chunk in llm.stream("Hello!")) == "Hello from vllm"

    fake.set_mode(tool_call("get_weather", '{"city": "Oslo"}'))
    called = llm.bind_tools([WEATHER]).invoke("Weather in Oslo?")
    assert called.tool_calls[0]["name"] == "get_weather"
    assert called.tool_calls[0]["args"] == {"city": "Oslo"}
    assert fake.last_json["tools"][0]["function"]["name"] == "get_weather"

    class Colour(BaseModel):
        name: str
        hex: str

    fake.set_mode(ok(content='{"name": "red", "hex": "#ff0000"}'))
    colour = llm.with_structured_output(Colour).invoke("A colour?")
    assert colour == Colour(name="red", hex="#ff0000")
    assert fake.last_json["response_format"]["type"] == "json_schema"


def test_llamaindex_complete_chat_and_stream_chat(gateway: GatewayProcess,
                                                  fake: FakeUpstream) -> None:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai import OpenAI
    from llama_index.llms.openai_like import OpenAILike

    like = OpenAILike(api_base=gateway.base_url, api_key="unused", model="m",
                      is_chat_model=True, context_window=8192, max_retries=0)
    assert like.complete("Hello!").text == "Hello from vllm"
    reply = like.chat([ChatMessage(role="user", content="Hello!")])
    assert reply.message.content == "Hello from vllm"
    streamed = list(like.stream_chat([ChatMessage(role="user", content="Hello!")]))
    assert streamed[-1].message.content == "Hello from vllm"

    native = OpenAI(api_base=gateway.base_url, api_key="unused", model="gpt-4o-mini",
                    max_retries=0)
    assert native.complete("Hello!").text == "Hello from vllm"
    assert fake.last_json["model"] == "org/model"
