"""An OpenAI chat-completions body as Gemini's `generateContent` request: pure, no I/O.

The model goes in the URL, not the body. Approximated: JSON schemas keep only the OpenAPI subset
Gemini accepts (`clean_schema`), `parallel_tool_calls`, `logprobs` and `user` are dropped, and
only images, audio and PDF data reach the model as media. Vertex AI's Gemini takes the same.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import msgspec

from providers.contract.chat import ChatRequest, asked_output, checked, content_text
from providers.contract.provider import Outgoing
from providers.contract.spec import ProviderSpec
from providers.kinds.google_stream import SIGNATURE_KEY

# Google's own OpenAI-compatible endpoint uses 1K / 8K / 24K; 512 is the smallest any 2.5 takes.
THINKING_BUDGETS = {"minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
TOOL_MODES = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
SAMPLING = {"temperature": "temperature", "top_p": "topP", "top_k": "topK", "n": "candidateCount",
            "seed": "seed", "presence_penalty": "presencePenalty",
            "frequency_penalty": "frequencyPenalty"}
# The keywords of Gemini's Schema object: any other (additionalProperties, $schema, const, ...)
# makes the whole request a 400.
SCHEMA_KEYS = frozenset({"type", "format", "title", "description", "nullable", "enum", "items",
                         "maxItems", "minItems", "properties", "required", "minProperties",
                         "maxProperties", "minLength", "maxLength", "pattern", "example",
                         "anyOf", "propertyOrdering", "default", "minimum", "maximum"})
SCHEMA_FORMATS = frozenset({"enum", "date-time", "int32", "int64", "float", "double"})
MAX_SCHEMA_DEPTH = 32  # a recursive $ref is cut here: Gemini's schemas cannot recurse
MEDIA_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg",
               ".gif": "image/gif", ".webp": "image/webp", ".heic": "image/heic",
               ".heif": "image/heif", ".pdf": "application/pdf"}


def to_gemini(body: Mapping[str, Any]) -> dict[str, Any]:
    """The `generateContent` body for an OpenAI chat-completions body (model: in the URL);
    InvalidRequest names a field of the wrong type."""
    checked(body, ChatRequest)  # what follows reads only fields of the types checked here
    system, contents = conversation(body.get("messages") or ())
    request: dict[str, Any] = {"contents": contents}
    if system:
        request["systemInstruction"] = {"parts": [{"text": text} for text in system]}
    if declarations := _declarations(body.get("tools")):
        request["tools"] = [{"functionDeclarations": declarations}]
        if config := _tool_config(body.get("tool_choice")):
            request["toolConfig"] = config
    if config := generation_config(body):
        request["generationConfig"] = config
    return request


def conversation(chat: Any) -> tuple[list[str], list[dict[str, Any]]]:
    """System texts, and the turns as `user` / `model` contents (same-role turns merged)."""
    system: list[str] = []
    contents: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id → function name, for the results that follow
    for message in chat:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role in ("system", "developer"):
            if text := content_text(message.get("content")):
                system.append(text)
        elif role in ("tool", "function"):
            _append(contents, "user", [_function_response(message, names)])
        elif role == "assistant":
            _append(contents, "model", _assistant_parts(message, names))
        else:
            _append(contents, "user", _parts(message.get("content")))
    return system, contents


def _append(contents: list[dict[str, Any]], role: str, parts: list[dict[str, Any]]) -> None:
    # Gemini rejects a turn without parts, and wants user and model turns to alternate.
    if not parts:
        return
    if contents and contents[-1]["role"] == role:
        contents[-1]["parts"].extend(parts)
    else:
        contents.append({"role": role, "parts": parts})


def _parts(content: Any) -> list[dict[str, Any]]:
    if content is None:
        return []
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts: list[dict[str, Any]] = []
    for item in content if isinstance(content, list) else ():
        kind = item.get("type") if isinstance(item, dict) else None
        if kind == "text" and item.get("text"):
            parts.append({"text": str(item["text"])})
        elif kind == "image_url":
            image = item.get("image_url")
            parts.append(media_part(str(image.get("url", "") if isinstance(image, dict)
                                        else image or "")))
        elif kind == "input_audio":
            audio = item.get("input_audio") or {}
            parts.append({"inlineData": {"mimeType": f"audio/{audio.get('format', 'wav')}",
                                         "data": audio.get("data", "")}})
        elif kind == "file" and (data := (item.get("file") or {}).get("file_data")):
            parts.append(media_part(str(data)))
    return parts


def media_part(url: str) -> dict[str, Any]:
    """A data URI as `inlineData`; a URL as `fileData`, its type guessed from the extension."""
    if url.startswith("data:") and ";base64," in url:
        mime_type, _, data = url[5:].partition(";base64,")
        return {"inlineData": {"mimeType": mime_type or "image/jpeg", "data": data}}
    extension = posixpath.splitext(urlsplit(url).path.lower())[1]
    return {"fileData": {"mimeType": MEDIA_TYPES.get(extension, "image/jpeg"), "fileUri": url}}


def _assistant_parts(message: Mapping[str, Any], names: dict[str, str]) -> list[dict[str, Any]]:
    parts = _parts(message.get("content"))
    calls = list(message.get("tool_calls") or ())
    if isinstance(legacy := message.get("function_call"), dict):
        calls.append({"id": "", "function": legacy})
    for call in calls:
        function = call.get("function") or {}
        names[str(call.get("id", ""))] = str(function.get("name", ""))
        part: dict[str, Any] = {"functionCall": {"name": function.get("name", ""),
                                                 "args": _json_object(function.get("arguments"))}}
        extra = (call.get("extra_content") or {}).get("google") or {}
        if signature := extra.get(SIGNATURE_KEY):
            part["thoughtSignature"] = signature
        parts.append(part)
    return parts


def _function_response(message: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    name = names.get(str(message.get("tool_call_id", ""))) or message.get("name") or ""
    text = content_text(message.get("content"))
    parsed = _json_object(text)
    # Gemini wants an object: a JSON object result goes as it is, anything else is wrapped.
    response = parsed if parsed or text.strip() == "{}" else {"content": text}
    return {"functionResponse": {"name": name, "response": response}}


def _json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        parsed = json.loads(value or "{}")
    except (TypeError, ValueError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _declarations(tools: Any) -> list[dict[str, Any]]:
    declared = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            continue
        function = tool.get("function") or {}
        declaration: dict[str, Any] = {"name": function.get("name", "")}
        if function.get("description"):
            declaration["description"] = function["description"]
        parameters = clean_schema(function.get("parameters"))
        # An OBJECT without properties is a 400 ("should be non-empty"): say nothing instead.
        if parameters and (parameters.get("type") != "object" or parameters.get("properties")):
            declaration["parameters"] = parameters
        declared.append(declaration)
    return declared


def _tool_config(choice: Any) -> dict[str, Any] | None:
    if isinstance(choice, str) and choice in TOOL_MODES:
        return {"functionCallingConfig": {"mode": TOOL_MODES[choice]}}
    if isinstance(choice, dict) and (name := (choice.get("function") or {}).get("name")):
        return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [name]}}
    return None


def clean_schema(schema: Any, defs: Mapping[str, Any] | None = None,
                 depth: int = 0) -> dict[str, Any]:
    """A JSON schema cut to Gemini's subset: local `$ref`s inlined, null types as `nullable`."""
    if not isinstance(schema, dict) or depth > MAX_SCHEMA_DEPTH:
        return {}
    if defs is None:  # a client's schema: any keyword may hold anything
        defs = {name: found for key in ("definitions", "$defs")
                if isinstance(table := schema.get(key), dict) for name, found in table.items()}
    schema = _normalized(_resolved(schema, defs))
    if "$ref" in schema:  # an optional reference became the schema itself
        return clean_schema(schema, defs, depth + 1)
    cleaned: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in SCHEMA_KEYS or (key == "format" and value not in SCHEMA_FORMATS):
            continue
        if key == "properties" and isinstance(value, dict):
            value = {name: clean_schema(sub, defs, depth + 1) for name, sub in value.items()}
        elif key == "items":
            value = clean_schema(value, defs, depth + 1)
        elif key == "anyOf" and isinstance(value, list):
            value = [clean_schema(sub, defs, depth + 1) for sub in value]
        cleaned[key] = value
    if isinstance(cleaned.get("required"), list):  # naming an undefined property is a 400
        known = cleaned.get("properties") or {}
        cleaned["required"] = [name for name in cleaned["required"] if name in known]
    return cleaned


def _resolved(schema: dict[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if not isinstance(ref, str):
        return schema
    target = defs.get(ref.rsplit("/", 1)[-1])
    rest = {key: value for key, value in schema.items() if key != "$ref"}
    return {**target, **rest} if isinstance(target, dict) else rest


def _normalized(schema: dict[str, Any]) -> dict[str, Any]:
    """`const`, `oneOf` and `null` said the ways Gemini understands."""
    schema = dict(schema)
    if "const" in schema:
        schema.setdefault("enum", [schema.pop("const")])
    if "oneOf" in schema:
        schema.setdefault("anyOf", schema.pop("oneOf"))
    kinds = schema.get("type")
    if isinstance(kinds, list):
        named = [kind for kind in kinds if kind != "null"]
        schema["nullable"] = schema.get("nullable") or len(named) < len(kinds)
        schema.pop("type")
        if len(named) == 1:
            schema["type"] = named[0]
        elif named:
            schema["anyOf"] = [{"type": kind} for kind in named]
    options = schema.get("anyOf")
    if isinstance(options, list):
        kept = [o for o in options if not (isinstance(o, dict) and o.get("type") == "null")]
        if len(kept) < len(options):
            schema["nullable"] = True
        if len(kept) == 1 and isinstance(kept[0], dict):
            del schema["anyOf"]
            schema = {**kept[0], **schema}
        else:
            schema["anyOf"] = kept
    if schema.get("nullable") is False:
        del schema["nullable"]
    return schema


def generation_config(body: Mapping[str, Any]) -> dict[str, Any]:
    """`generationConfig`: limits, sampling, stop sequences, JSON mode and thinking."""
    config: dict[str, Any] = {}
    if limit := asked_output(body):
        config["maxOutputTokens"] = limit
    for name, field in SAMPLING.items():
        if body.get(name) is not None:
            config[field] = body[name]
    if stop := body.get("stop"):
        config["stopSequences"] = [stop] if isinstance(stop, str) else list(stop)
    config.update(_response_format(body.get("response_format")))
    if thinking := thinking_config(body):
        config["thinkingConfig"] = thinking
    return config


def _response_format(response_format: Any) -> dict[str, Any]:
    if not isinstance(response_format, dict):
        return {}
    if response_format.get("type") == "json_object":
        return {"responseMimeType": "application/json"}
    if response_format.get("type") == "json_schema":
        schema = clean_schema((response_format.get("json_schema") or {}).get("schema"))
        return {"responseMimeType": "application/json",
                **({"responseSchema": schema} if schema else {})}
    return {}


def thinking_config(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A thinking budget, with thoughts returned, when the client asked for reasoning."""
    kwargs = body.get("chat_template_kwargs") or {}
    switches = (kwargs.get("thinking"), kwargs.get("enable_thinking"), body.get("enable_thinking"))
    effort = body.get("reasoning_effort")
    if effort == "none":  # 2.5 models think by default; OpenAI's "none" turns that off
        return {"thinkingBudget": 0}
    if False in switches:
        return None
    if isinstance(effort, str) and effort in THINKING_BUDGETS:
        return {"thinkingBudget": THINKING_BUDGETS[effort], "includeThoughts": True}
    if True in switches:
        return {"thinkingBudget": THINKING_BUDGETS["medium"], "includeThoughts": True}
    return None


def request_body(request: Outgoing, spec: ProviderSpec) -> bytes:
    """The `generateContent` body for `request`, with the provider's `drop_params` and `params`
    (merged one level deep: `generationConfig` too). Vertex AI's Gemini takes the same."""
    body = to_gemini(request.json())
    for name in spec.drop_params:
        body.pop(name, None)
    for name, value in spec.params.items():
        both = isinstance(value, dict) and isinstance(body.get(name), dict)
        body[name] = {**body[name], **value} if both else value
    return msgspec.json.encode(body)
