"""What a pool worker is sent: the request in the spellings its engine understands, bounded.

A CPU worker serves one request at a time, so one request it misreads is everyone's outage:
llama.cpp's server ignores `max_completion_tokens` (LangChain's spelling) and generates toward
its whole context, refuses `response_format: json_schema` with a 500, refuses content-part
arrays, and dies on a `grammar` it cannot parse. Each is translated (or, the grammar, refused)
here, per engine. And every answer is bounded: a model's
`max_output_tokens` (on llama.cpp 1,024 unless set) caps what a client asks for, or asks
nothing for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from providers.contract.chat import asked_output
from providers.contract.errors import InvalidRequest
from providers.kinds.pool.engines import LLAMACPP

CPU_MAX_OUTPUT_TOKENS = 1024


def output_cap(engine: str, configured: int | None) -> int | None:
    """The most tokens one answer may take: the model's own setting, else the engine's."""
    if configured is not None:
        return configured
    return CPU_MAX_OUTPUT_TOKENS if engine == LLAMACPP else None


def for_engine(body: Mapping[str, Any], endpoint: str, engine: str,
               cap: int | None) -> dict[str, Any] | None:
    """The body to send a worker of `engine`, or None when it can go as it is."""
    out = dict(body)
    changed = False
    if engine == LLAMACPP and "grammar" in out:
        # A grammar llama.cpp cannot parse kills the worker process (a segfault), for everyone.
        raise InvalidRequest("This model's engine (llama.cpp) does not take a client grammar: "
                             "use response_format with a json_schema instead", param="grammar")
    if engine == LLAMACPP:
        if out.get("stream"):  # every request is, on the way to a llama.cpp worker
            _check_logit_bias(out.get("logit_bias"))
        if "max_completion_tokens" in out:
            largest = asked_output(out)
            out.pop("max_completion_tokens")
            if largest is not None:
                out["max_tokens"] = largest
            changed = True
        changed |= _schema_format(out)
        changed |= _text_content(out)
    field = "max_completion_tokens" if "max_completion_tokens" in out else "max_tokens"
    short, long = out.get("max_tokens"), out.get("max_completion_tokens")
    if isinstance(short, int) and isinstance(long, int) and short != long:
        # Both spellings sent: the engine reads one, so both say the largest (as the hold).
        out["max_tokens"] = out["max_completion_tokens"] = max(short, long)
        changed = True
    asked = out.get(field)
    # Legacy completions default to 16 tokens when none are asked: only a larger ask is capped.
    unasked = asked is None and endpoint == "chat/completions"
    if cap is not None and (unasked or (isinstance(asked, int) and asked > cap)):
        out[field] = cap
        changed = True
    return out if changed else None


def _check_logit_bias(bias: Any) -> None:
    """Token ids as OpenAI writes them ("50256"): llama.cpp's server dies on any other key
    when the request streams."""
    if isinstance(bias, dict) and not all(isinstance(k, str) and k.lstrip("-").isdigit()
                                          for k in bias):
        raise InvalidRequest("logit_bias keys must be token ids", param="logit_bias")


def _schema_format(body: dict[str, Any]) -> bool:
    """`json_schema` as llama.cpp's server takes a schema: `json_object` with `schema`."""
    wanted = body.get("response_format")
    if not isinstance(wanted, dict) or wanted.get("type") != "json_schema":
        return False
    schema = (wanted.get("json_schema") or {}).get("schema")
    body["response_format"] = {"type": "json_object",
                               **({"schema": schema} if isinstance(schema, dict) else {})}
    return True


def _text_content(body: dict[str, Any]) -> bool:
    """Messages whose content is only text parts, as one string each."""
    changed = False
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    flattened = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                             for p in content):
            message = {**message, "content": "".join(str(p.get("text") or "")
                                                     for p in content)}
            changed = True
        flattened.append(message)
    if changed:
        body["messages"] = flattened
    return changed
