"""The issue's story, for real: a batch of 100 requests to the bundled pool (llama.cpp on the CPU,
Gemma 3 270M) through `/v1/files` and `/v1/batches`, the gateway restarted midway, every result
then retrievable by the OpenAI SDK, each once.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from tests.gateway_process import GatewayProcess, config, free_port, wait_until
from tests.pool_helpers import wait_for_workers
from tests.test_pool_llamacpp import MODEL, pool_entry

pytest.importorskip("llama_cpp", reason="llama-cpp-python is installed by `make test`")

REQUESTS = 100


def test_a_hundred_requests_to_the_pool_survive_a_restart_midway(tmp_path: Path) -> None:
    doc = config({"local": pool_entry(free_port())},
                 defaults={"circuit": {"enabled": False},
                           "timeouts": {"first_token": 30, "total": 60}},
                 batches={"concurrency": 4, "poll_interval": 0.2, "lease": 5})
    gateway = GatewayProcess(tmp_path, doc).start()
    try:
        wait_for_workers(gateway, "ready")
        client = openai.OpenAI(base_url=gateway.base_url, api_key="unused", max_retries=0)
        lines = [{"custom_id": f"colour-{n}", "method": "POST", "url": "/v1/chat/completions",
                  "body": {"model": MODEL, "max_tokens": 4, "temperature": 0,
                           "messages": [{"role": "user", "content": f"Name colour {n}."}]}}
                 for n in range(REQUESTS)]
        uploaded = client.files.create(
            file=("colours.jsonl", "".join(json.dumps(line) + "\n" for line in lines).encode()),
            purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id,
                                      endpoint="/v1/chat/completions", completion_window="24h")

        def done_at_least(count: int) -> bool:
            counts = client.batches.retrieve(batch.id).request_counts
            return counts is not None and counts.completed >= count

        wait_until(lambda: done_at_least(20), 300)
        gateway.stop()
        gateway.start()
        wait_for_workers(gateway, "ready")
        assert not done_at_least(REQUESTS), "the restart came midway"
        wait_until(lambda: client.batches.retrieve(batch.id).status == "completed", 600)

        done = client.batches.retrieve(batch.id)
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (REQUESTS, 0)
        assert done.error_file_id is None and done.output_file_id is not None
        output = [json.loads(line) for line in
                  client.files.content(done.output_file_id).text.splitlines()]
        assert sorted(line["custom_id"] for line in output) == \
            sorted(f"colour-{n}" for n in range(REQUESTS))
        for line in output:
            body = line["response"]["body"]
            assert line["response"]["status_code"] == 200 and body["model"] == MODEL
            assert 0 < body["usage"]["completion_tokens"] <= 4
    finally:
        gateway.stop()
