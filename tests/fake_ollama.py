"""A fake Ollama: OpenAI's API at /v1 (as `FakeUpstream`), its model list at /api/tags and its
native embeddings at /api/embed, with the same modes."""

from __future__ import annotations

from aiohttp import web

from tests.upstream import FakeUpstream, _error, embedding_problem, vector


class FakeOllama(FakeUpstream):
    """Ollama's own routes beside its OpenAI-compatible ones. A chat ending with an assistant
    message is continued from it, as Ollama does (its templates leave the last one open)."""

    prefills = True

    def _routes(self, app: web.Application) -> None:
        super()._routes(app)
        app.router.add_get("/api/tags", self._tags)
        app.router.add_post("/api/embed", self._embed)

    async def _tags(self, request: web.Request) -> web.Response:
        return web.json_response({"models": [{"name": m, "model": m} for m in self.models]})

    async def _embed(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        mode = self._next_mode()
        if mode.kind == "status":
            return _error(mode.code, mode.message, mode.retry_after, mode.body)
        texts = body.get("input")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return web.json_response({"error": "input must be a string or strings"}, status=400)
        if problem := embedding_problem(body):
            return web.json_response({"error": problem}, status=400)
        dimensions = body.get("dimensions") or 8
        return web.json_response({
            "model": body.get("model"),
            "embeddings": [vector(text, dimensions) for text in texts],
            "total_duration": 1000, "load_duration": 10,
            "prompt_eval_count": sum(len(t.split()) for t in texts)})
