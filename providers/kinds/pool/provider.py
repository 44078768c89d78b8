"""`"type": "pool"`: the bundled workers as one provider. Each try goes to one worker chosen by
the pool; a worker that fails before answering is skipped and the request tried on another,
and only when none is left does the router move on to the next provider."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import msgspec

from providers.contract import embeddings
from providers.contract.errors import (
    BadUpstreamResponse,
    ModelLimit,
    ModelLoading,
    PoolFull,
    PoolNotReady,
    ProviderError,
    UpstreamClientError,
)
from providers.contract.failover import NoneAnswered, first_answer
from providers.contract.lasting import Lasting
from providers.contract.log import get_logger
from providers.contract.provider import Answer, Outgoing, Provider, ProviderDisabled, Reply
from providers.contract.spec import ProviderSpec
from providers.contract.stream import Opened, close_quietly, peek
from providers.contract.transport import Transport
from providers.contract.usage import Usage
from providers.kinds.openai import OpenAIProvider
from providers.kinds.pool.counting import EmptyStream, estimated_prompt_tokens, pooled, with_usage
from providers.kinds.pool.engines import LLAMACPP, VLLM, schedules_by_priority
from providers.kinds.pool.picking import prefix_hashes, prompt_text
from providers.kinds.pool.pool import Pool, Slot
from providers.kinds.pool.protect import for_engine, output_cap
from providers.kinds.pool.settings import (
    MODEL_FIELDS,
    POOL_FIELDS,
    fingerprint,
    read_settings,
    served_name,
)
from providers.kinds.pool.setup import PoolUnavailable, build_pool
from providers.kinds.pool.worker import Worker

# The endpoints a model of each non-chat `task` serves, and only those.
TASK_ENDPOINTS = {"embeddings": "embed", "rerank": "rerank"}
# llama-cpp-python's chat formats that call tools (chatml-function-calling, functionary-v2...).
TOOL_CHAT_FORMATS = ("chatml-function-calling", "functionary")
# What a client loading-model answer suggests waiting: a small model loads in seconds.
LOADING_RETRY_AFTER = 5.0


def _not_ready(pool: Pool, model: str) -> ProviderError:
    if pool.full(model):
        return PoolFull(f"pool {pool.name}: every worker for {model} holds {pool.max_queue} "
                        "requests (max_queue)", pool.retry_after(model))
    if pool.loading(model):
        return ModelLoading(pool.not_ready_reason(model), LOADING_RETRY_AFTER)
    return PoolNotReady(pool.not_ready_reason(model))


class PoolProvider(Provider):
    """Routes to the pool's workers; the pool itself lasts across config snapshots."""

    kind = "pool"
    fields = POOL_FIELDS
    model_fields = MODEL_FIELDS

    def __init__(self, spec: ProviderSpec, transport: Transport) -> None:
        super().__init__(spec, transport)
        self.settings = read_settings(spec.raw)
        self._models = {served_name(alias, m): m for alias, m in self.settings.models.items()}
        if any(m.task == "embed" for m in self.settings.models.values()):
            self.endpoints = self.endpoints | {"embeddings"}
        if any(m.task == "rerank" for m in self.settings.models.values()):
            # vLLM's pooling runner serves /v1/rerank (llama.cpp workers refuse the task).
            self.endpoints = self.endpoints | {"rerank"}
        # Workers are this deployment's own (most on loopback): the environment's proxy is not
        # for them; a "proxy" or "tls" on the pool's entry applies to every worker.
        self.link = spec.link_for(None)
        self.pool: Pool | None = None
        self._lasting: Lasting | None = None
        self._clients: dict[str, OpenAIProvider] = {}

    async def start(self, lasting: Lasting) -> None:
        async def build() -> Pool:
            return await build_pool(self.name, self.settings, self.transport, self.link,
                                    self.spec.api_key)

        try:
            self.pool = await lasting.acquire(f"pool:{self.name}", fingerprint(self.settings),
                                              build)
        except PoolUnavailable as exc:
            raise ProviderDisabled(str(exc)) from exc
        self._lasting = lasting
        # The same workers, kept across a reload that changed only what applies live (an
        # alias, a price, a limit): the pool takes this snapshot's limits and timings.
        self.pool.update(self.settings, self.spec.api_key)

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        if self._lasting is not None and self.pool is not None:
            await self._lasting.release(f"pool:{self.name}", self.pool)
        self.pool = None

    def serves(self, endpoint: str, upstream_model: str) -> bool:
        """A model serves the endpoints of its `task` only: asked of a chat model, embeddings
        is a 400 naming the model, not a worker's error."""
        model = self._models.get(upstream_model)
        task = TASK_ENDPOINTS.get(endpoint, "generate")
        return self.supports(endpoint) and (model is None or model.task == task)

    def calls_tools(self, upstream_model: str) -> bool:
        """llama-cpp-python's server calls tools only with its function-calling chat formats;
        any other answers in text and ignores `tools` (vLLM refuses what it cannot do itself)."""
        engine = self.pool.engine if self.pool is not None else self.settings.engine
        model = self._models.get(upstream_model)
        if engine != LLAMACPP or model is None:
            return True
        return (model.chat_format or "").startswith(TOOL_CHAT_FORMATS)

    def live_state(self) -> dict[str, Any] | None:
        return self.pool.view() if self.pool is not None else None

    def continues(self) -> str:
        """vLLM continues a final assistant message when told. llama-cpp-python's server
        closes one and opens a new turn (its chat formats always add the generation prompt)
        and takes no `continue_final_message`: it is asked in words."""
        engine = (self.pool.engine if self.pool is not None else None) or VLLM
        return "instruction" if engine == LLAMACPP else "continue_final_message"

    async def send(self, request: Outgoing, upstream_model: str) -> Reply:
        answer = await self._tried(request, upstream_model)
        assert isinstance(answer, Reply)
        return answer

    async def stream(self, request: Outgoing, upstream_model: str) -> AsyncIterator[bytes]:
        opened = await self._tried(request, upstream_model)
        assert isinstance(opened, Opened)
        try:
            yield opened.head
            async for chunk in opened.rest:
                yield chunk
        finally:
            await opened.close()

    async def answer(self, request: Outgoing, upstream_model: str) -> Answer:
        return await self._tried(request, upstream_model)

    async def _tried(self, request: Outgoing, upstream_model: str) -> Reply | Opened:
        """The request tried on the pool's workers in turn (the one failover loop), each
        chosen by the pool; the last worker's failure, or why none could take it."""
        request = self._for_engine(request, upstream_model)
        pool, hashes = self._pool(), self._hashes(request, upstream_model)
        # The first try may wait in line for a worker; a retry on another worker after a
        # failure takes one that is free now, or none.
        first = await pool.acquire(upstream_model, hashes, self._queue_timeout(),
                                   request.priority)
        waited = [first] if first is not None else []
        tried: set[str] = set()
        limited: list[ModelLimit] = []

        def pick() -> Slot | None:
            if limited:  # too long for the model, or refused by it: every worker would say so
                return None
            slot = waited.pop() if waited else (
                pool.take(upstream_model, hashes, tried) if tried else None)
            if slot is not None:
                tried.add(slot.worker.name)
            return slot

        async def attempt(slot: Slot) -> Reply | Opened:
            try:
                return await self._try(pool, slot, request, upstream_model)
            except ModelLimit as exc:
                limited.append(exc)
                raise

        try:
            return await first_answer(pick, attempt)
        except NoneAnswered as none:
            raise none.last or _not_ready(pool, upstream_model) from None

    def _queue_timeout(self) -> float:
        """How long a request may wait in line: `queue_timeout`, else the time a client is
        promised a first token in."""
        return self.settings.queue_timeout or self.spec.timeouts.first_token

    async def _try(self, pool: Pool, slot: Slot, request: Outgoing,
                   model: str) -> Reply | Opened:
        """One worker's answer: whole, or a stream peeked to its first event (a worker that
        fails before it is skipped: nothing was sent yet). The slot is given back once the
        answer is done: a reply at once, a stream when it is read or closed."""
        worker = slot.worker
        held = False
        try:
            try:
                answer = await self._ask(pool, worker, request, model)
            except EmptyStream:
                failure = await self._why_empty(pool, worker, request, model)
            except ModelLimit:  # the request's limit with this model, not the worker's fault
                raise
            except ProviderError as exc:
                failure = await self._worker_failed(pool, worker, exc)
            else:
                if not isinstance(answer, Opened):
                    return answer
                held = True
                return _Held.keeping(answer, pool, slot)
            raise failure
        finally:
            if not held:
                pool.release(slot)

    async def _ask(self, pool: Pool, worker: Worker, request: Outgoing,
                   model: str) -> Reply | Opened:
        if not request.stream:
            if request.endpoint == "embeddings" and pool.engine == LLAMACPP:
                return await self._embed(worker, request, model)
            return await self._client(worker).send(request, model)
        chunks = self._client(worker).stream(request, model)
        if pool.engine == LLAMACPP:  # its streams count no usage: counted here
            chunks = with_usage(chunks, estimated_prompt_tokens(request.json()), model)
        return await peek(chunks, request.choices)

    def loading_models(self) -> list[str]:
        if self.pool is None:
            return []
        return sorted(alias for alias, model in self.spec.models.items()
                      if self.pool.loading(model.id))

    async def _embed(self, worker: Worker, request: Outgoing, model: str) -> Reply:
        """Embeddings from a llama.cpp worker, one pooled vector per input (`counting`)."""
        body = request.json()
        texts = embeddings.texts(body, self.name)
        http = self._client(worker).http
        vectors, prompt = [], 0
        for text in texts:  # one at a time: batched, its per-token vectors come out mixed up
            payload, _ = await http.post(f"{worker.base_url}/embeddings",
                                         msgspec.json.encode({"model": model, "input": text}))
            (vector,), tokens = pooled(payload, 1)
            vectors.append(vector)
            prompt += tokens or embeddings.estimated_tokens([text])
        listed = embeddings.embedding_list(vectors, request.model, prompt,
                                           body.get("encoding_format"))
        return Reply(msgspec.json.encode(listed), usage=msgspec.convert(listed["usage"], Usage))

    async def _why_empty(self, pool: Pool, worker: Worker, request: Outgoing,
                         model: str) -> ProviderError:
        """A stream the engine ended without an event refused the request inside it: asked
        whole, the engine says why (a client error, or a 500 judged as `_worker_failed`)."""
        try:
            await self._client(worker).send(request.asking(stream=False), model)
        except ModelLimit as exc:  # too long for its window (llama.cpp): not the worker's fault
            return exc
        except ProviderError as exc:
            return await self._worker_failed(pool, worker, exc)
        return BadUpstreamResponse("the worker ended a stream without an event, and answered "
                                  "the same request whole")

    def _for_engine(self, request: Outgoing, model: str) -> Outgoing:
        """The request as this pool's engine understands it, its answer bounded (`protect`)."""
        if self.pool is None or request.endpoint not in ("chat/completions", "completions"):
            return request
        engine = self.pool.engine or VLLM  # None: remote workers only, vLLM servers
        settings = self._models.get(model)
        cap = output_cap(engine, settings.max_output_tokens if settings else None)
        body = for_engine(request.json(), request.endpoint, engine, cap)
        if self._takes_priority(model) and (request.priority or "priority" in request.json()):
            # vLLM runs the lowest first; the gateway's priority (capped by the key's
            # max_priority) replaces any the client wrote in the body.
            body = {**(body if body is not None else request.json()),
                    "priority": -request.priority}
        if body is None:
            return request
        return replace(request, raw=msgspec.json.encode(body), _json=None)

    def _takes_priority(self, model: str) -> bool:
        """Whether every worker serving `model` is a vLLM this pool started with its priority
        policy (a remote worker's policy is unknown: any other refuses a nonzero priority)."""
        if self.pool is None or self.pool.settings.workers:
            return False
        plans = [p for p in self.pool.plans.values() if p.model == model]
        return bool(plans) and all(p.engine == VLLM and schedules_by_priority(p.argv)
                                   for p in plans)

    def _pool(self) -> Pool:
        if self.pool is None:
            raise PoolNotReady(f"pool {self.name} is not running")
        return self.pool

    def _hashes(self, request: Outgoing, model: str) -> tuple[int, ...]:
        """Prefix hashes for affinity; not worth computing when one worker could take it."""
        if self.pool is None or len(self.pool.ready_for(model)) < 2:
            return ()
        return prefix_hashes(prompt_text(request.json()))

    async def _worker_failed(self, pool: Pool, worker: Worker,
                             error: ProviderError) -> ProviderError:
        """A failed try: the worker's fault (benched until its next check), or, when it
        answered 500 and is well when asked at once, the request's (a 400 to the client, the
        worker stays in service). Refused connections, crashes and timeouts stay the
        worker's."""
        if error.upstream_status == 500 and await pool.answers(worker):
            get_logger().info("worker_refused_request", pool=self.name, worker=worker.name,
                              error=error.message)
            raise UpstreamClientError(self.name, 400, f"the model could not take this request: "
                                      f"{error.message}", error_type="invalid_request_error",
                                      code="invalid_request", param=None)
        get_logger().warning("worker_request_failed", pool=self.name, worker=worker.name,
                             reason=error.reason, error=error.message)
        pool.suspect(worker)
        return error

    def _client(self, worker: Worker) -> OpenAIProvider:
        """An OpenAI-kind client for one worker, with this provider's options and timeouts."""
        client = self._clients.get(worker.base_url)
        if client is None:
            spec = replace(self.spec, kind="openai", base_url=worker.base_url,
                           proxy=self.link.proxy)
            client = self._clients[worker.base_url] = OpenAIProvider(spec, self.transport)
        return client


class _Held:
    """A worker's stream, holding its slot until it is read to its end or closed, whichever
    comes first (closed unread, a generator's own `finally` would not run)."""

    def __init__(self, rest: AsyncIterator[bytes], pool: Pool, slot: Slot) -> None:
        self.rest = rest
        self.pool = pool
        self.slot: Slot | None = slot

    @classmethod
    def keeping(cls, opened: Opened, pool: Pool, slot: Slot) -> Opened:
        """`opened`, its slot given back when its rest is done."""
        return Opened(opened.head, cls(opened.rest, pool, slot), opened.watch,
                      opened.media_type)

    def __aiter__(self) -> _Held:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await anext(self.rest)
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self.slot is not None:
            self.pool.release(self.slot)
            self.slot = None
        await close_quietly(self.rest)
