"""The pure pieces, table-driven and without a network: routing, error mapping, SSE watching."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway import config
from gateway.core.errors import AllProvidersFailed, Attempt, ModelNotFound
from gateway.observe.traffic import ProviderTraffic, RecentTraffic, Refusal, refusal
from gateway.routing import router
from providers.contract.errors import (
    ProviderError,
    ProviderRateLimited,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    UpstreamClientError,
)
from providers.contract.provider import Outgoing, Reply
from providers.contract.spec import CircuitPolicy, Retries
from providers.contract.stream import SSEWatch
from providers.wire.upstream_errors import (
    error_for_status,
    read_error,
    retry_after_seconds,
    scrub,
)

SNAPSHOT = config.parse(
    '{"providers": {'
    '"a": {"type": "openai", "base_url": "http://a/v1", "models": {"m": "a-m"}},'
    '"off": {"type": "openai", "base_url": "http://o/v1", "enabled": false, "models": {"m": "o"}},'
    '"b": {"type": "openai", "base_url": "http://b/v1", "models": {"m": "b-m", "n": "b-n"}}}}',
    Path("llms.json"), {})


def test_candidates_are_enabled_providers_in_file_order() -> None:
    assert [(r.provider, r.upstream_model) for r in router.candidates(SNAPSHOT, "m")] == [
        ("a", "a-m"), ("b", "b-m")]
    with pytest.raises(ModelNotFound):
        router.candidates(SNAPSHOT, "unknown")


@pytest.mark.parametrize(("status", "expected", "retryable"), [
    (400, UpstreamClientError, None), (422, UpstreamClientError, None),
    (401, ProviderRejected, False), (403, ProviderRejected, False), (404, ProviderRejected, False),
    (408, ProviderTimeout, True), (429, ProviderRateLimited, True),
    (500, ProviderUnavailable, True), (503, ProviderUnavailable, True),
    (529, ProviderUnavailable, True),
])
def test_upstream_status_decides_failover(status: int, expected: type,
                                          retryable: bool | None) -> None:
    error = error_for_status("p", status, b'{"error": {"message": "m"}}', {}, None)

    assert type(error) is expected
    if retryable is not None:
        assert isinstance(error, ProviderError) and error.retryable is retryable


@pytest.mark.parametrize(("body", "message"), [
    (b'{"error": {"message": "bad", "type": "t", "code": "c"}}', "bad"),
    (b'{"error": "plain string"}', "plain string"),
    (b'{"object": "error", "message": "vllm old", "type": "BadRequestError", "code": 400}',
     "vllm old"),
    (b'{"detail": "fastapi says no"}', "fastapi says no"),
    (b"<html>502 Bad Runtime</html>", "<html>502 Bad Runtime</html>"),
])
def test_every_common_error_shape_is_read(body: bytes, message: str) -> None:
    assert read_error(body).message == message


def test_secrets_are_scrubbed_from_upstream_messages() -> None:
    text = ("Incorrect API key provided: sk-proj-abcdefghijklmnop. Authorization: Bearer "
            "tok_123456789abc, url https://x/v1?key=AIzaSecretValue&alt=sse, own: my-own-key-9")

    cleaned = scrub(text, secret="my-own-key-9")

    for leaked in ("sk-proj-abcdefghijklmnop", "tok_123456789abc", "AIzaSecretValue",
                   "my-own-key-9"):
        assert leaked not in cleaned
    assert len(scrub("x" * 5000)) <= 500


def test_retry_after_accepts_seconds_and_http_dates() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("Thu, 01 Jan 1970 00:01:40 GMT", now=90) == 10
    assert retry_after_seconds("soon") is None


def test_retry_delay_grows_with_jitter_and_honours_retry_after_up_to_the_cap() -> None:
    retries = Retries(attempts=5, backoff=0.5, max_backoff=3, retry_after_cap=10)

    assert router.retry_delay(retries, 1, None, jitter=lambda: 1.0) == 0.5
    assert router.retry_delay(retries, 3, None, jitter=lambda: 1.0) == 2.0
    assert router.retry_delay(retries, 6, None, jitter=lambda: 1.0) == 3.0
    assert router.retry_delay(retries, 1, None, jitter=lambda: 0.0) == 0.25
    assert router.retry_delay(retries, 1, 4.0, jitter=lambda: 0.0) == 4.0
    assert router.retry_delay(retries, 1, 60.0, jitter=lambda: 0.0) == 10


@pytest.mark.parametrize(("reasons", "status"), [
    (["rate_limited", "rate_limited"], 429),
    (["first_token_timeout", "total_timeout"], 504),
    (["rate_limited", "unavailable"], 502),
    ([], 502),
])
def test_all_failed_status_says_how_they_failed(reasons: list[str], status: int) -> None:
    attempts = [Attempt(f"p{i}", None, r, "x") for i, r in enumerate(reasons)]

    assert AllProvidersFailed("m", attempts).status == status


class FakeProvider:
    def __init__(self, name: str, outcomes: list[Exception | str], attempts: int = 1) -> None:
        self.name = name
        self.outcomes = outcomes
        self.spec = type("Spec", (), {"retries": Retries(attempts=attempts, backoff=0.001),
                                      "circuit": CircuitPolicy()})()
        self.calls = 0

    async def answer(self, request: Outgoing, model: str) -> Reply:
        outcome = self.outcomes[min(self.calls, len(self.outcomes) - 1)]
        self.calls += 1
        if isinstance(outcome, Exception):
            raise outcome
        return Reply(f"{outcome}:{model}".encode())


def run_attempt(providers: dict[str, FakeProvider]) -> router.Served:
    routes = tuple(config.Route(name, f"{name}-id") for name in providers)
    request = Outgoing("chat/completions", b"{}", "m", False, "r")
    return asyncio.run(router.attempt("m", routes, providers, request))  # type: ignore[arg-type]


def test_attempt_retries_then_fails_over_and_reports_every_try() -> None:
    a = FakeProvider("a", [ProviderUnavailable("down", upstream_status=503)], attempts=2)
    b = FakeProvider("b", ["ok"])

    served = run_attempt({"a": a, "b": b})

    assert isinstance(served.answer, Reply) and served.answer.body == b"ok:b-id"
    assert served.provider == "b"
    assert served.attempts == 3 and a.calls == 2
    assert [(f.provider, f.status) for f in served.failed] == [("a", 503), ("a", 503)]


def test_attempt_does_not_retry_a_rejecting_provider_nor_fail_over_a_client_error() -> None:
    a = FakeProvider("a", [ProviderRejected("bad key", upstream_status=401)], attempts=3)
    b = FakeProvider("b", [UpstreamClientError("b", 400, "bad", error_type=None, code=None,
                                               param=None)])
    c = FakeProvider("c", ["ok"])

    with pytest.raises(UpstreamClientError):
        run_attempt({"a": a, "b": b, "c": c})
    assert a.calls == 1 and c.calls == 0


def test_sse_watch_sees_done_finish_errors_and_garbage_across_chunk_boundaries() -> None:
    watch = SSEWatch()
    for piece in (b'data: {"choices":[{"delta":{"content":"hi"},"finish_reason":null}]}\n',
                  b'\ndata: {"choices":[{"delta":{},"finish_reason"', b':"stop"}]}\n\n',
                  b": keep-alive\n\ndata: [DO", b"NE]\n\n"):
        watch.feed(piece)
    assert (watch.data_events, watch.finished, watch.done, watch.garbage) == (3, True, True, False)

    broken = SSEWatch()
    broken.feed(b"<html>oops</html>\n\n")
    assert broken.garbage

    failing = SSEWatch()
    failing.feed(b'data: {"error": {"message": "overloaded"}}\n\n')
    assert failing.error_event is not None and not failing.done


@pytest.mark.parametrize(("reasons", "code", "expected"), [
    (["model_loading"], "provider_error", Refusal.NOT_READY),
    (["not_ready", "model_loading"], "provider_error", Refusal.NOT_READY),
    (["pool_full"], "provider_error", Refusal.SHED),
    (["model_loading", "pool_full"], "provider_error", Refusal.NOT_READY),
    ([], "overloaded", Refusal.SHED),
    (["model_loading", "unavailable"], "provider_error", None),
    (["timeout"], "provider_error", None),
    ([], "internal_error", None),
])
def test_a_loading_or_full_pool_is_a_refusal_not_a_failure(
        reasons: list[str], code: str, expected: Refusal | None) -> None:
    assert refusal(reasons, code) is expected


def test_provider_traffic_counts_refusals_apart_from_failures() -> None:
    now = [1000.0]
    traffic = ProviderTraffic(clock=lambda: now[0])
    for reason in ("model_loading", "model_loading", "pool_full", "unavailable"):
        traffic.failed("local", reason)
    traffic.served("local", 0.2, None)
    now[0] += 301  # past the five minutes shown: only what follows counts
    traffic.failed("local", "pool_full")
    traffic.served("local", 0.1, 0.5)

    assert traffic.summary("local") == {"answered": 1, "failed": 0, "not_ready": 0, "shed": 1,
                                        "ttft_p50_ms": 100.0, "cost_usd": 0.5}
    now[0] -= 301
    assert traffic.summary("local")["not_ready"] == 2


def test_recent_traffic_keeps_refusals_out_of_the_error_rate() -> None:
    traffic = RecentTraffic(clock=lambda: 1000.0)
    traffic.add(0.5, ok=True)
    traffic.add(0.01, ok=False, refused=Refusal.NOT_READY)
    traffic.add(0.01, ok=False, refused=Refusal.SHED)
    traffic.add(0.9, ok=False)

    (row,) = [r for r in traffic.series() if r["rps"]]
    assert (row["error_rate"], row["not_ready"], row["shed"]) == (0.5, 1, 1)
