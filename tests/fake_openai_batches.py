"""A fake OpenAI that also runs files and batches, as OpenAI's API answers them: a multipart upload
with `purpose=batch`, a batch made from it (`validating`), run when it is next looked at (its
output file written, one line per request, as OpenAI's), cancel, and 404s in OpenAI's envelope
for ids it does not hold. Requests without its key are 401.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.upstream import FakeUpstream

KEY = "sk-test-secret-123456"  # what `tests.gateway_process.provider` configures


def _missing(kind: str, ident: str) -> web.Response:
    return web.json_response({"error": {"message": f"No such {kind}: {ident}",
                                        "type": "invalid_request_error", "param": "id",
                                        "code": None}}, status=404)


@dataclass
class FakeOpenAIBatches(FakeUpstream):
    """`FakeUpstream` with `/v1/files` and `/v1/batches`."""

    files: dict[str, dict[str, Any]] = field(default_factory=dict, init=False)
    contents: dict[str, bytes] = field(default_factory=dict, init=False)
    batches: dict[str, dict[str, Any]] = field(default_factory=dict, init=False)

    def _routes(self, app: web.Application) -> None:
        super()._routes(app)
        app.router.add_post("/v1/files", self._upload)
        app.router.add_get("/v1/files/{id}/content", self._content)
        app.router.add_post("/v1/batches", self._create)
        app.router.add_get("/v1/batches/{id}", self._retrieve)
        app.router.add_post("/v1/batches/{id}/cancel", self._cancel)

    def _keyed(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Bearer {KEY}"

    async def _upload(self, request: web.Request) -> web.Response:
        if not self._keyed(request):
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        form = await request.post()
        upload = form.get("file")
        if form.get("purpose") != "batch" or not isinstance(upload, web.FileField):
            return web.json_response({"error": {"message": "purpose and file are required",
                                                "type": "invalid_request_error"}}, status=400)
        content = upload.file.read()
        made = {"id": f"file-up{len(self.files)}", "object": "file", "bytes": len(content),
                "created_at": int(time.time()), "filename": upload.filename,
                "purpose": "batch", "status": "processed"}
        self.files[made["id"]], self.contents[made["id"]] = made, content
        return web.json_response(made)

    async def _content(self, request: web.Request) -> web.Response:
        ident = request.match_info["id"]
        if ident not in self.contents or not self._keyed(request):
            return _missing("File", ident)
        return web.Response(body=self.contents[ident], content_type="application/octet-stream")

    async def _create(self, request: web.Request) -> web.Response:
        asked = json.loads(await request.read())
        source = asked.get("input_file_id")
        if source not in self.files or not self._keyed(request):
            return _missing("File", str(source))
        lines = self.contents[source].decode().splitlines()
        made = {"id": f"batch_up{len(self.batches)}", "object": "batch",
                "endpoint": asked["endpoint"], "errors": None, "input_file_id": source,
                "completion_window": asked["completion_window"], "status": "validating",
                "output_file_id": None, "error_file_id": None,
                "created_at": int(time.time()), "expires_at": int(time.time()) + 86400,
                "request_counts": {"total": len(lines), "completed": 0, "failed": 0},
                "metadata": asked.get("metadata")}
        self.batches[made["id"]] = made
        return web.json_response(made)

    async def _retrieve(self, request: web.Request) -> web.Response:
        ident = request.match_info["id"]
        batch = self.batches.get(ident)
        if batch is None or not self._keyed(request):
            return _missing("Batch", ident)
        if batch["status"] == "validating":
            self._execute(batch)
        elif batch["status"] == "cancelling":
            batch.update(status="cancelled", cancelled_at=int(time.time()))
        return web.json_response(batch)

    async def _cancel(self, request: web.Request) -> web.Response:
        ident = request.match_info["id"]
        batch = self.batches.get(ident)
        if batch is None or not self._keyed(request):
            return _missing("Batch", ident)
        if batch["status"] in ("validating", "in_progress"):
            batch.update(status="cancelling", cancelling_at=int(time.time()))
        return web.json_response(batch)

    def _execute(self, batch: dict[str, Any]) -> None:
        """Answer every request of the batch, as OpenAI's output file has them."""
        out = []
        for text in self.contents[batch["input_file_id"]].decode().splitlines():
            line = json.loads(text)
            body = {"id": "chatcmpl-batch", "object": "chat.completion", "created": 1,
                    "model": line["body"]["model"],
                    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                 "message": {"role": "assistant", "refusal": None,
                                             "content": f"Hello from {self.name}"}}],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}
            out.append(json.dumps({"id": f"batch_req_{len(out)}",
                                   "custom_id": line["custom_id"],
                                   "response": {"status_code": 200, "request_id": "req_up",
                                                "body": body}, "error": None}))
        output = f"file-out{len(self.files)}"
        self.files[output] = {"id": output, "purpose": "batch_output"}
        self.contents[output] = ("\n".join(out) + "\n").encode()
        now = int(time.time())
        batch.update(status="completed", output_file_id=output, in_progress_at=now,
                     finalizing_at=now, completed_at=now,
                     request_counts={"total": len(out), "completed": len(out), "failed": 0})
