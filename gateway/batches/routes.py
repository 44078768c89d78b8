"""`/v1/files` and `/v1/batches` as OpenAI serves them, for the key that asks: its own files and
batches only (another key's id is not found, as one that never was).

A batch input file is read whole when it is uploaded (bounded by `batches`: its size, its lines,
each line) so a bad line is a 400 naming it then, not a failed batch later. A batch whose first
request names an alias served first by a provider that runs batches itself (`native`) is
relayed there; every other is run by the gateway (`gateway.batches.runner`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec
from litestar import Request, Response, delete, get, post
from litestar.datastructures import UploadFile
from litestar.handlers import HTTPRouteHandler

from gateway.accounts import auth
from gateway.accounts.account import Account
from gateway.accounts.service import Charge
from gateway.batches import charges, jsonl, native, owners
from gateway.batches.objects import batch_object, file_object, page
from gateway.batches.store import Store, new_id
from gateway.core.errors import RequestTooLarge
from gateway.core.settings import BatchesConfig, GatewayKey
from gateway.state.runtime import Runtime
from providers.contract.errors import InvalidRequest, NotFound

JSON = "application/json"
WINDOW = "24h"  # the one completion window OpenAI offers
DAY = 86_400.0
MAX_METADATA = 16
# Room for the multipart envelope around the file itself.
ENVELOPE = 64 * 1024


class CreateBatch(msgspec.Struct, forbid_unknown_fields=False):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


async def _runtime(request: Request[Any, Any, Any]) -> tuple[Runtime, Store, str]:
    """The runtime, the batches' store, and the id of the key asking (401 without one)."""
    runtime, store, key = await _keyed(request)
    return runtime, store, owners.id_of(key)


async def _keyed(request: Request[Any, Any, Any]
                 ) -> tuple[Runtime, Store, GatewayKey | Account | None]:
    """The runtime, the batches' store, and the key asking (401 without one)."""
    runtime: Runtime = request.app.state.runtime
    store: Store = request.app.state.batches.store  # the process's `runner.Runner`
    return runtime, store, await auth.admitted(request.headers, runtime.live.snapshot,
                                               runtime.accounts)


def _holds(request: Request[Any, Any, Any]) -> dict[str, Charge]:
    holds: dict[str, Charge] = request.app.state.batches.holds
    return holds


def _json(body: Any) -> Response[bytes]:
    return Response(msgspec.json.encode(body), media_type=JSON)


def _no_file(file_id: str) -> NotFound:
    return NotFound(f"No such File object: {file_id[:128]}", param="file_id")


def _no_batch(batch_id: str) -> NotFound:
    return NotFound(f"No batch found with id '{batch_id[:128]}'", param="batch_id")


def _limit(raw: str | None, default: int, most: int) -> int:
    if raw is None:
        return default
    if not raw.isdigit() or not 1 <= int(raw) <= most:
        raise InvalidRequest(f"limit must be an integer from 1 to {most}", param="limit")
    return int(raw)



async def create_file(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Upload a batch input file (multipart `file`, `purpose=batch`), checked line by
    line."""
    runtime, store, key = await _keyed(request)
    owner = owners.id_of(key)
    form = await request.form()
    purpose, upload = form.get("purpose"), form.get("file")
    if purpose != "batch":
        raise InvalidRequest("purpose must be 'batch': the gateway keeps batch input "
                             "files only", param="purpose")
    if not isinstance(upload, UploadFile):
        raise InvalidRequest("Send the file as the multipart field 'file'", param="file")
    content = await upload.read()
    settings = runtime.live.snapshot.batches
    if len(content) > settings.max_file_bytes:
        raise RequestTooLarge(f"The file is {len(content)} bytes; a batch file may be at "
                              f"most {settings.max_file_bytes}")
    lines = jsonl.parse(content, settings)
    row = {"id": new_id("file-"), "owner": owner,
           "filename": (upload.filename or "batch.jsonl")[:256], "purpose": "batch",
           "bytes": len(content), "created_at": time.time(), "content": content}
    target = native.target(runtime, lines)
    if target is not None:  # its lines pass no stage: the key's model list applies here
        charges.check_models(runtime, key, lines)
        row |= await native.upload(runtime, target, row, lines)
    await store.add_file(row)
    return _json(file_object(row))

@get("/v1/files")
async def list_files(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The key's files, newest first (`order=asc` for oldest), `after` and `limit`."""
    _, store, owner = await _runtime(request)
    query = request.query_params
    limit = _limit(query.get("limit"), 10_000, 10_000)
    rows = await store.files(owner, query.get("purpose"), query.get("after"), limit,
                             query.get("order", "desc") != "asc")
    return _json(page([file_object(r) for r in rows], limit))

@get("/v1/files/{file_id:str}")
async def retrieve_file(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
    _, store, owner = await _runtime(request)
    row = await store.file(file_id, owner)
    if row is None:
        raise _no_file(file_id)
    return _json(file_object(row))

@get("/v1/files/{file_id:str}/content")
async def file_content(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
    """The file's bytes as uploaded, or a batch's output or error file."""
    runtime, store, owner = await _runtime(request)
    row = await store.file(file_id, owner)
    if row is None:
        raise _no_file(file_id)
    if row["provider"] is not None and row["purpose"] == "batch_output":
        content: bytes | None = await native.content(runtime, row)
    else:
        content = await store.content(file_id, owner)
    if content is None:
        raise _no_file(file_id)
    return Response(content, media_type="application/octet-stream")

@delete("/v1/files/{file_id:str}", status_code=200)
async def delete_file(request: Request[Any, Any, Any], file_id: str) -> Response[bytes]:
    _, store, owner = await _runtime(request)
    if not await store.delete_file(file_id, owner):
        raise _no_file(file_id)
    return _json({"id": file_id, "object": "file", "deleted": True})

@post("/v1/batches", status_code=200)
async def create_batch(request: Request[Any, Any, Any]) -> Response[bytes]:
    """A batch of the requests in an uploaded file, run (or relayed) from now."""
    runtime, store, key = await _keyed(request)
    owner = owners.id_of(key)
    try:
        asked = msgspec.json.decode(await request.body(), type=CreateBatch)
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Invalid batch request: {exc}") from None
    if asked.endpoint not in jsonl.ENDPOINTS:
        raise InvalidRequest(f"endpoint must be one of {', '.join(jsonl.ENDPOINTS)}",
                             param="endpoint")
    if asked.completion_window != WINDOW:
        raise InvalidRequest("completion_window must be '24h'", param="completion_window")
    if asked.metadata is not None and len(asked.metadata) > MAX_METADATA:
        raise InvalidRequest(f"metadata may have at most {MAX_METADATA} pairs",
                             param="metadata")
    source = await store.file(asked.input_file_id, owner)
    content = await store.content(asked.input_file_id, owner) if source else None
    if source is None or content is None:
        raise _no_file(asked.input_file_id)
    if source["purpose"] != "batch":
        raise InvalidRequest("input_file_id names a file whose purpose is not 'batch'",
                             param="input_file_id")
    now = time.time()
    row: dict[str, Any] = {
        "id": new_id("batch_"), "owner": owner, "endpoint": asked.endpoint,
        "input_file_id": asked.input_file_id, "completion_window": WINDOW,
        "status": "validating", "metadata": asked.metadata, "created_at": now,
        "expires_at": now + DAY}
    if source["provider"] is not None:
        lines = jsonl.parse(content, runtime.live.snapshot.batches)
        charges.check_models(runtime, key, lines)
        held = await charges.hold(runtime, key, jsonl.ENDPOINTS.get(asked.endpoint, ""), lines)
        try:
            where, made = await native.create_batch(runtime, source, content, asked.endpoint,
                                                    WINDOW, asked.metadata)
            await store.add_batch(row | where, ())
        except BaseException:
            if held is not None and runtime.accounts is not None:  # nothing will run
                runtime.accounts.release(held)
            raise
        if held is not None:
            _holds(request)[where["id"]] = held
        return _json(made)
    lines = jsonl.parse(content, runtime.live.snapshot.batches)
    row |= {"model": lines[0].model, "total": len(lines)}
    wrong = [r for r in lines if r.url != asked.endpoint]
    if wrong:  # as OpenAI's: the batch is made, and fails its validation
        row |= {"status": "failed", "failed_at": now, "total": 0, "errors": [
            {"code": "invalid_url", "line": r.line, "param": "url",
             "message": f"The URL provided for this request does not match the batch "
                        f"endpoint {asked.endpoint}."} for r in wrong[:100]]}
        lines = []
    await store.add_batch(row, lines)
    request.app.state.batches.wake.set()
    return _json(batch_object(row, {}))

@get("/v1/batches")
async def list_batches(request: Request[Any, Any, Any]) -> Response[bytes]:
    """The key's batches, newest first, `after` and `limit`."""
    runtime, store, owner = await _runtime(request)
    limit = _limit(request.query_params.get("limit"), 20, 100)
    rows = await store.batches(owner, request.query_params.get("after"), limit)
    counts = await store.counts([r["id"] for r in rows])
    shown = [await native.refreshed(runtime, store, r, _holds(request))
             if r["provider"] is not None
             else batch_object(r, counts[r["id"]]) for r in rows]
    return _json(page(shown, limit))

@get("/v1/batches/{batch_id:str}")
async def retrieve_batch(request: Request[Any, Any, Any], batch_id: str
                         ) -> Response[bytes]:
    runtime, store, owner = await _runtime(request)
    row = await store.batch(batch_id, owner)
    if row is None:
        raise _no_batch(batch_id)
    if row["provider"] is not None:
        return _json(await native.refreshed(runtime, store, row, _holds(request)))
    return _json(batch_object(row, (await store.counts([batch_id]))[batch_id]))

@post("/v1/batches/{batch_id:str}/cancel", status_code=200)
async def cancel_batch(request: Request[Any, Any, Any], batch_id: str) -> Response[bytes]:
    """Start no more of its requests; those running finish, then it is `cancelled`."""
    runtime, store, owner = await _runtime(request)
    row = await store.batch(batch_id, owner)
    if row is not None and row["provider"] is not None:
        return _json(await native.cancel(runtime, row))
    row = await store.cancel(batch_id, owner, time.time())
    if row is None:
        raise _no_batch(batch_id)
    request.app.state.batches.wake.set()
    return _json(batch_object(row, (await store.counts([batch_id]))[batch_id]))


def routes(bounds: BatchesConfig) -> Sequence[HTTPRouteHandler]:
    """The handlers, the upload's size bounded by `bounds` (fixed for the process's life)."""
    upload = post("/v1/files", request_max_body_size=bounds.max_file_bytes + ENVELOPE,
                  status_code=200)(create_file)
    return [upload, list_files, retrieve_file, file_content, delete_file, create_batch,
            list_batches, retrieve_batch, cancel_batch]
