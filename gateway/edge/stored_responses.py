"""Stored responses: `GET` and `DELETE /v1/responses/{id}`, `GET .../input_items`.

They read the store the bridge writes (memory, or Redis across replicas). With keys configured
a client key sees only the responses it created, and another key's id is answered as unknown
(404), so ids cannot be probed; an admin key sees them all. Responses a native upstream stored
are that upstream's: the gateway does not know where they live, and answers 404.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from litestar import Request, Response, delete, get
from litestar.params import Parameter

from gateway.accounts import auth
from gateway.adapters.responses.request import input_items
from gateway.adapters.responses.store import StoredTurn, readable
from gateway.core.errors import ResponseNotFound
from gateway.state.runtime import Runtime

JSON = "application/json"
Limit = Annotated[int, Parameter(ge=1, le=100)]


@get("/v1/responses/{response_id:str}")
async def retrieve_response(request: Request[Any, Any, Any], response_id: str) -> Response[bytes]:
    """The response as it was answered."""
    turn = await _owned(request, response_id)
    return Response(bytes(turn.response), media_type=JSON)


@delete("/v1/responses/{response_id:str}", status_code=200)
async def delete_response(request: Request[Any, Any, Any], response_id: str) -> Response[bytes]:
    """Forget the response; a conversation that continued it can no longer be continued."""
    await _owned(request, response_id)
    await _runtime(request).responses.delete(response_id)
    body = {"id": response_id, "object": "response", "deleted": True}
    return Response(msgspec.json.encode(body), media_type=JSON)


@get("/v1/responses/{response_id:str}/input_items")
async def list_input_items(request: Request[Any, Any, Any], response_id: str,
                           limit: Limit = 20, order: Literal["asc", "desc"] = "desc",
                           after: str | None = None) -> Response[bytes]:
    """The items the response was made from, paged as OpenAI pages them."""
    turn = await _owned(request, response_id)
    page = input_items_page(input_items(turn.input, response_id), limit, order, after)
    return Response(msgspec.json.encode(page), media_type=JSON)


def input_items_page(items: list[dict[str, Any]], limit: int, order: str,
                     after: str | None) -> dict[str, Any]:
    """One page of `items`: newest first unless `order` is `asc`, starting past `after`."""
    ordered = items if order == "asc" else items[::-1]
    if after is not None:
        ids = [item.get("id") for item in ordered]
        ordered = ordered[ids.index(after) + 1:] if after in ids else []
    data = ordered[:limit]
    return {"object": "list", "data": data, "has_more": len(ordered) > limit,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None}


def _runtime(request: Request[Any, Any, Any]) -> Runtime:
    runtime: Runtime = request.app.state.runtime
    return runtime


async def _owned(request: Request[Any, Any, Any], response_id: str) -> StoredTurn:
    """The stored response, if this request's key may see it; else 404."""
    runtime = _runtime(request)
    snapshot = runtime.live.snapshot
    key = await auth.admitted(request.headers, snapshot, runtime.accounts)
    turn = await runtime.responses.turn(response_id)
    if turn is None or not len(turn.response):
        raise ResponseNotFound(response_id, param="response_id")
    is_admin = key is not None and key in snapshot.admin_keys
    if not readable(turn, None if key is None else key.limits.key_id, is_admin):
        raise ResponseNotFound(response_id, param="response_id")
    return turn
