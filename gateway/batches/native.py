"""Batches relayed to an upstream that runs them itself (a provider with `"batches":
"native"`: `openai`, or `anthropic`'s message batches), instead of run by the gateway.

A file is relayed when every request in it names an alias whose first provider is that same
native one, for an endpoint it serves: its lines go up with each alias replaced by the
provider's model id, as a file (OpenAI's) or, for an upstream that keeps no files
(`Provider.batch_files`), inside the batch when it is made. The upstream's ids are kept as the
gateway's (a file's, a batch's, its output files'), each row naming its owner and provider, so
the same ownership rule holds and the upstream's answers pass through unchanged; what an
upstream does not keep of a batch (its input file, its metadata) is filled in from the row.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from gateway.accounts.service import Charge
from gateway.batches import charges, jsonl
from gateway.batches.store import OVER, Store
from gateway.core.errors import ModelNotFound
from gateway.state.runtime import Runtime
from providers.contract.errors import (
    BadUpstreamResponse,
    GatewayError,
    InvalidRequest,
    ProviderUnavailable,
)
from providers.contract.log import get_logger
from providers.contract.provider import Provider


@dataclass(frozen=True, slots=True)
class Target:
    """Where a file's batch would run: the provider, and each alias's model id there."""

    provider: str
    models: Mapping[str, str]


def target(runtime: Runtime, lines: Sequence[jsonl.Request]) -> Target | None:
    """The native provider every line's alias goes to first, if there is one."""
    snapshot = runtime.live.snapshot
    found: str | None = None
    models: dict[str, str] = {}
    for line in lines:
        try:
            alias = snapshot.resolve(line.model)
        except ModelNotFound:
            return None
        routes = snapshot.routes.get(alias) or ()
        provider = runtime.live.providers.get(routes[0].provider) if routes else None
        if provider is None or not provider.native_batches \
                or found not in (None, provider.name) \
                or not provider.supports(jsonl.ENDPOINTS[line.url]):
            return None
        found = provider.name
        models[line.model] = routes[0].upstream_model
    return Target(found, models) if found is not None else None


def _provider(runtime: Runtime, name: str) -> Provider:
    provider = runtime.live.providers.get(name)
    if provider is None or not provider.native_batches:
        raise ProviderUnavailable(f"Provider {name} that runs this batch is not serving")
    return provider


def _object(payload: bytes) -> dict[str, Any]:
    try:
        found = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        found = None
    if not isinstance(found, dict) or not isinstance(found.get("id"), str):
        raise BadUpstreamResponse("the upstream's answer is not an object with an id")
    return found


def _rewritten(lines: Sequence[jsonl.Request], models: Mapping[str, str]) -> bytes:
    """The file as the upstream wants it: each line's model its own id."""
    out = []
    for line in lines:
        body = msgspec.json.decode(line.body)
        body["model"] = models[line.model]
        out.append(msgspec.json.encode({"custom_id": line.custom_id, "method": "POST",
                                        "url": line.url, "body": body}))
    return b"\n".join(out) + b"\n"


def _multipart(filename: str, content: bytes) -> tuple[bytes, str]:
    boundary = secrets.token_hex(16)
    safe = filename.replace('"', "").replace("\r", "").replace("\n", "") or "batch.jsonl"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
            f"batch\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"{safe}\"\r\nContent-Type: application/jsonl\r\n\r\n").encode()
    return body + content + f"\r\n--{boundary}--\r\n".encode(), \
        f"multipart/form-data; boundary={boundary}"


async def upload(runtime: Runtime, to: Target, row: Mapping[str, Any],
                 lines: Sequence[jsonl.Request]) -> dict[str, Any]:
    """Upload the file to the provider: the row's fields that say where it is (for one
    that keeps no files, the file stays here, named for it)."""
    if not _provider(runtime, to.provider).batch_files:
        return {"provider": to.provider, "upstream_id": None}
    body, content_type = _multipart(row["filename"], _rewritten(lines, to.models))
    made = _object(await _provider(runtime, to.provider).batch_api("POST", "files", body,
                                                                   content_type))
    return {"id": made["id"], "provider": to.provider, "upstream_id": made["id"]}


async def create_batch(runtime: Runtime, source: Mapping[str, Any], content: bytes,
                       endpoint: str, window: str, metadata: Mapping[str, str] | None
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create the batch at the file's provider: the row's fields that say where it is, and
    the upstream's answer."""
    provider = _provider(runtime, source["provider"])
    if source["upstream_id"] is None:  # an upstream that keeps no files: the lines go along
        made = _object(await provider.batch_api(
            "POST", "batches", _inline(runtime, source, content, endpoint),
            "application/jsonl"))
    else:
        asked = {"input_file_id": source["upstream_id"], "endpoint": endpoint,
                 "completion_window": window, "metadata": metadata}
        made = _object(await provider.batch_api("POST", "batches",
                                                msgspec.json.encode(asked)))
    made = {"input_file_id": source["id"], "metadata": metadata} | made
    return {"id": made["id"], "provider": source["provider"], "upstream_id": made["id"],
            "status": str(made.get("status", "validating")), "total": 0}, made


def _inline(runtime: Runtime, source: Mapping[str, Any], content: bytes, endpoint: str
            ) -> bytes:
    """A kept file's lines as its provider takes them, each model its own id; a 400 if a line
    calls another endpoint, a 503 if the file's models no longer go to that provider first."""
    lines = jsonl.parse(content, runtime.live.snapshot.batches)
    if any(line.url != endpoint for line in lines):
        raise InvalidRequest(f"Every line of the file must call the batch's endpoint "
                             f"{endpoint}", param="endpoint")
    to = target(runtime, lines)
    if to is None or to.provider != source["provider"]:
        raise ProviderUnavailable(f"The file's models no longer go first to provider "
                                  f"{source['provider']}, which was to run its batch")
    return _rewritten(lines, to.models)


def _kept(found: dict[str, Any], row: Mapping[str, Any]) -> dict[str, Any]:
    """The upstream's batch, with what it does not keep of it filled in from the row."""
    return {"input_file_id": row["input_file_id"], "metadata": row["metadata"]} | found


async def refreshed(runtime: Runtime, store: Store, row: Mapping[str, Any],
                    holds: MutableMapping[str, Charge]) -> dict[str, Any]:
    """The upstream's batch as it is now; its output files become the owner's, and once it
    has ended its owner is charged for it (`charges`, `holds` the batches' this process
    holds)."""
    found = _object(await _provider(runtime, row["provider"]).batch_api(
        "GET", f"batches/{row['upstream_id']}"))
    for name in ("output_file_id", "error_file_id"):
        if isinstance(file_id := found.get(name), str) \
                and await store.file(file_id, row["owner"]) is None:
            await store.add_file({"id": file_id, "owner": row["owner"],
                                  "filename": f"{row['id']}_{name.split('_')[0]}.jsonl",
                                  "purpose": "batch_output", "bytes": 0,
                                  "created_at": time.time(), "content": b"",
                                  "provider": row["provider"], "upstream_id": file_id})
    if isinstance(status := found.get("status"), str) and status != row["status"] \
            and await store.update_batch(row["id"], {"status": status}, was=row["status"]) \
            and status in OVER:
        output, answers = found.get("output_file_id"), b""
        try:
            if isinstance(output, str):
                answers = await content(runtime, {**row, "upstream_id": output})
        except GatewayError as exc:  # charged what could be read: nothing, and said so
            get_logger().warning("batch_output_unread", batch=row["id"], error=str(exc))
        charges.charge(runtime, row, await store.content(row["input_file_id"], row["owner"]),
                       answers, holds)
    return _kept(found, row)


async def cancel(runtime: Runtime, row: Mapping[str, Any]) -> dict[str, Any]:
    """Cancel the batch upstream: the upstream's answer."""
    return _kept(_object(await _provider(runtime, row["provider"]).batch_api(
        "POST", f"batches/{row['upstream_id']}/cancel", b"{}")), row)


async def content(runtime: Runtime, row: Mapping[str, Any]) -> bytes:
    """A file the upstream holds (a batch's output), as it has it."""
    return await _provider(runtime, row["provider"]).batch_api(
        "GET", f"files/{row['upstream_id']}/content")
