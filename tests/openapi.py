"""Validate what the gateway builds against OpenAI's published OpenAPI schemas.

`tests/data/openai-schemas.json` holds the schemas we check (and everything they reference),
extracted from OpenAI's OpenAPI 3.1 description (MIT). The schema has OpenAPI 3.0 leftovers
(`nullable: true`, an `enum` without null beside it): they are patched here, never in the output.
"""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SCHEMAS = Path(__file__).parent / "data" / "openai-schemas.json"
BASE = "urn:openai-openapi"


def _patch_nullable(node: Any) -> Any:
    """`{"type": T, "nullable": true}` means T or null (OpenAPI 3.0); say it in JSON Schema."""
    if isinstance(node, list):
        return [_patch_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _patch_nullable(value) for key, value in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


def _patch_base64_embedding(document: dict[str, Any]) -> None:
    """`Embedding.embedding` lists floats only; with `encoding_format: base64` OpenAI answers
    the vector as one base64 string (its API reference says so)."""
    properties = document["components"]["schemas"]["Embedding"]["properties"]
    properties["embedding"] = {"anyOf": [properties["embedding"], {"type": "string"}]}


@cache
def _registry() -> Registry:
    document = _patch_nullable(json.loads(SCHEMAS.read_text()))
    _patch_base64_embedding(document)
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    return Registry().with_resource(BASE, resource)


def validate(instance: Any, schema_name: str) -> None:
    """Raise jsonschema.ValidationError unless `instance` matches `#/components/schemas/NAME`."""
    schema = {"$ref": f"{BASE}#/components/schemas/{schema_name}"}
    jsonschema.Draft202012Validator(schema, registry=_registry()).validate(copy.deepcopy(instance))
