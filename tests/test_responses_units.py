"""The Responses <-> chat translations, without a network."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.adapters.responses import reply
from gateway.adapters.responses.events import ResponseEvents
from gateway.adapters.responses.request import to_chat
from providers.contract.errors import InvalidRequest
from tests.openapi import validate


@pytest.mark.parametrize(("request_fields", "expected"), [
    ({"input": "hi"}, {"messages": [{"role": "user", "content": "hi"}]}),
    ({"input": "hi", "instructions": "be kind"},
     {"messages": [{"role": "system", "content": "be kind"}, {"role": "user", "content": "hi"}]}),
    ({"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is it?"},
        {"type": "input_image", "image_url": "https://x/y.png", "detail": "high"}]}]},
     {"messages": [{"role": "user", "content": [
         {"type": "text", "text": "what is it?"},
         {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "high"}}]}]}),
    ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "one"}]},
     {"messages": [{"role": "assistant", "content": None, "tool_calls": [
         {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
         {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
         {"role": "tool", "tool_call_id": "c1", "content": "one"}]}),
    ({"input": "x", "max_output_tokens": 9, "reasoning": {"effort": "high"},
      "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": False,
      "text": {"format": {"type": "json_object"}}},
     {"messages": [{"role": "user", "content": "x"}], "max_tokens": 9,
      "reasoning_effort": "high", "tool_choice": {"type": "function", "function": {"name": "f"}},
      "parallel_tool_calls": False, "response_format": {"type": "json_object"}}),
    ({"input": "x", "stream": True},
     {"messages": [{"role": "user", "content": "x"}], "stream": True,
      "stream_options": {"include_usage": True}}),
])
def test_requests_become_chat_bodies(request_fields: dict[str, Any],
                                     expected: dict[str, Any]) -> None:
    assert to_chat({"model": "m", **request_fields}) == {"model": "m", **expected}


def test_unsupported_tools_are_a_clear_400() -> None:
    with pytest.raises(InvalidRequest, match="web_search"):
        to_chat({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})


def test_a_chat_answer_becomes_a_valid_response() -> None:
    chat = {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Checking.", "reasoning": "hmm",
        "tool_calls": [{"id": "c1", "type": "function",
                        "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                  "completion_tokens_details": {"reasoning_tokens": 2}}}

    response = reply.to_response(chat, {"model": "m", "input": "x"}, "resp_1")

    validate(response, "Response")
    assert [item["type"] for item in response["output"]] == [
        "reasoning", "message", "function_call"]
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 2}


def test_stream_events_are_valid_numbered_and_complete() -> None:
    events = ResponseEvents({"model": "m", "input": "x"}, "resp_1")
    chunks = [{"choices": [{"index": 0, "delta": {"reasoning_content": "r"}}]},
              {"choices": [{"index": 0, "delta": {"content": "Hi"}}]},
              {"choices": [{"index": 0, "delta": {"tool_calls": [
                  {"index": 0, "id": "c1", "function": {"name": "f", "arguments": "{}"}}]}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}]
    body = b"".join(events.feed(chunk) for chunk in chunks) + events.finish()

    parsed = [json.loads(line[6:]) for line in body.decode().splitlines()
              if line.startswith("data: ")]
    assert [e["sequence_number"] for e in parsed] == list(range(len(parsed)))
    for event in parsed:
        validate(event, "ResponseStreamEvent")
    assert parsed[-1]["type"] == "response.incomplete"
    assert [item["type"] for item in parsed[-1]["response"]["output"]] == [
        "reasoning", "message", "function_call"]
