"""Each gateway key gets its own requests and tokens per minute, across replicas."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import httpx
import openai
import pytest

from gateway.core.limits import KeyLimits, Left, RateLimiter, duration
from tests.gateway_process import GatewayProcess, config, provider
from tests.minutes import within_one_minute
from tests.redis_server import RedisServer
from tests.test_teams import Admin
from tests.upstream import FakeUpstream

MESSAGES = [{"role": "user", "content": "hello"}]


def test_limiter_counts_requests_and_tokens_per_window() -> None:
    now = [120.0]
    limiter = RateLimiter(clock=lambda: now[0])
    team = KeyLimits("team", requests_per_minute=2, tokens_per_minute=100)

    assert limiter.admit(team) == Left((2, 1), (100, 100), 60)
    assert limiter.admit(team) == Left((2, 0), (100, 100), 60)
    assert limiter.admit(team) == Left((2, 0), (100, 100), 60, refused="team"), \
        "refused until the window ends"
    now[0] = 180.5
    assert limiter.admit(team) == Left((2, 1), (100, 100), 59.5)
    limiter.spend_tokens("team", 150)
    refused = limiter.admit(team)
    assert refused == Left((2, 1), (100, 0), 59.5, refused="team"), \
        "tokens over the limit refuse too, and a refused request is not counted"


def test_limits_that_limit_nothing_are_neither_read_nor_counted() -> None:
    limiter = RateLimiter(clock=lambda: 30.0)
    assert limiter.admit(KeyLimits("free"), None) is None
    assert limiter.admit(KeyLimits("free", priority=3), KeyLimits("team:open")) is None
    assert not limiter.local and not limiter.pending


def test_the_tightest_of_a_key_and_its_team_is_told_for_each_kind() -> None:
    limiter = RateLimiter(clock=lambda: 15.0)
    key = KeyLimits("k", requests_per_minute=10, tokens_per_minute=500)
    team = KeyLimits("team:ops", requests_per_minute=2, tokens_per_minute=10_000)

    assert limiter.admit(key, team) == Left((2, 1), (500, 500), 45)
    limiter.spend_tokens("k", 100)
    assert limiter.admit(key, team) == Left((2, 0), (500, 400), 45)
    assert limiter.admit(key, team) == Left((2, 0), (500, 400), 45, refused="team:ops")
    assert limiter.admit(key) == Left((10, 7), (500, 400), 45), \
        "the team's refusal counted nothing against the key"


def test_the_headers_say_what_is_left_as_openai_writes_it() -> None:
    assert Left((60, 59), (150_000, 149_984), 1.0).headers() == {
        "x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s", "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984", "x-ratelimit-reset-tokens": "1s"}
    assert Left(None, (20, 0), 59.5).headers() == {
        "x-ratelimit-limit-tokens": "20", "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-reset-tokens": "59.5s"}, "a key without a request limit: tokens only"
    assert [duration(s) for s in (360, 60, 1, 59.5, 17.1424, 0.12, 0.0004, 3723.25)] == [
        "6m0s", "1m0s", "1s", "59.5s", "17.142s", "120ms", "0s", "1h2m3.25s"]


def test_limiter_adds_what_other_replicas_reported() -> None:
    limiter = RateLimiter(clock=lambda: 30.0)
    team = KeyLimits("team", requests_per_minute=5)
    assert limiter.admit(team) == Left((5, 4), None, 30)
    limiter.apply_totals({("team", 0, "req"): 5})

    assert limiter.admit(team) == Left((5, 0), None, 30, refused="team")


KEY = "unlimited-key"  # to read a gateway's /ready


def chat(gateway: GatewayProcess, key: str) -> httpx.Response:
    return httpx.post(f"{gateway.base_url}/chat/completions",
                      json={"model": "m", "messages": MESSAGES},
                      headers={"Authorization": f"Bearer {key}"})


def limited_config(up: FakeUpstream, **state: object) -> dict:
    return config(
        {"up": provider(up.base_url, {"m": "m"})},
        server={"api_keys": [
            {"key": "key-for-team-a", "id": "team-a", "requests_per_minute": 3},
            {"key": "key-for-team-b", "id": "team-b", "tokens_per_minute": 20},
            "unlimited-key"]},
        **({"state": state} if state else {}))


def test_a_key_over_its_limits_gets_429_while_others_carry_on(
        tmp_path_factory: pytest.TempPathFactory,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")

    def story() -> None:  # in one minute, on a gateway of its own: its counts start at zero
        gateway = GatewayProcess(tmp_path_factory.mktemp("limits"), limited_config(up)).start()
        try:
            statuses = [chat(gateway, "key-for-team-a").status_code for _ in range(4)]
            refused = chat(gateway, "key-for-team-a")

            assert statuses == [200, 200, 200, 429]
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert 1 <= int(refused.headers["retry-after"]) <= 60
            assert "key-for-team-a" not in refused.text
            assert chat(gateway, "unlimited-key").status_code == 200
            # Each answer reports 7 tokens: after three (21) the budget of 20 is spent.
            assert [chat(gateway, "key-for-team-b").status_code for _ in range(4)] == [
                200, 200, 200, 429]
            logged = gateway.wait_for_log("request", 10)  # written once each answer is sent
            assert {r["key_id"] for r in logged} == {"team-a", "team-b", "key-" + __import__(
                "hashlib").sha256(b"unlimited-key").hexdigest()[:8]}
            assert "key-for-team" not in gateway.logs()
        finally:
            gateway.stop()

    within_one_minute(story)


def test_limits_hold_across_replicas_sharing_redis(
        tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    doc = limited_config(up, backend="redis", url=redis_server.url, sync_interval=0.1)

    def story() -> None:  # in one minute, on gateways and a Redis of its own
        redis_server.stop()
        redis_server.start()
        first = GatewayProcess(tmp_path_factory.mktemp("a"), doc).start()
        second = GatewayProcess(tmp_path_factory.mktemp("b"), doc).start()
        try:
            first.wait_for_log("shared_state_connected")
            second.wait_for_log("shared_state_connected")
            assert [chat(first, "key-for-team-a").status_code for _ in range(2)] == [200, 200]
            redis_server.synced(first, KEY)  # its two are counted in Redis

            assert chat(second, "key-for-team-a").status_code == 200
            redis_server.synced(second, KEY)  # its third is counted: it read 3 back
            redis_server.synced(first, KEY)  # and so has the first
            assert chat(second, "key-for-team-a").status_code == 429
            assert chat(first, "key-for-team-a").status_code == 429
        finally:
            first.stop()
            second.stop()

    within_one_minute(story)


RATE_HEADERS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


def seconds(reset: str) -> float:
    """A reset as OpenAI writes it (`1m0s`, `59.5s`, `120ms`), in seconds."""
    match = re.fullmatch(r"(?:(\d+)m)?(\d+(?:\.\d+)?)(s|ms)", reset)
    assert match, reset
    minutes, amount, unit = match.groups()
    return int(minutes or 0) * 60 + float(amount) / (1000 if unit == "ms" else 1)


def test_the_openai_sdk_reads_a_limited_key_s_headers_and_its_429(
        tmp_path_factory: pytest.TempPathFactory,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    doc = config({"up": provider(up.base_url, {"m": "m"})}, server={"api_keys": [
        {"key": "limited-key", "id": "limited", "requests_per_minute": 3,
         "tokens_per_minute": 1000}, "unlimited-key"]})

    def story() -> None:  # in one minute, on a gateway of its own: its counts start at zero
        gateway = GatewayProcess(tmp_path_factory.mktemp("headers"), doc).start()
        try:
            client = openai.OpenAI(base_url=gateway.base_url, api_key="limited-key",
                                   max_retries=0)
            answers = [client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, stream=stream) for stream in (False, False, True)]
            for answer in answers[2:]:  # a stream's headers say it too
                answer.parse().close()
            told = [{h: a.headers[h] for h in RATE_HEADERS} for a in answers]

            assert [t["x-ratelimit-remaining-requests"] for t in told] == ["2", "1", "0"]
            assert {t["x-ratelimit-limit-requests"] for t in told} == {"3"}
            assert {t["x-ratelimit-limit-tokens"] for t in told} == {"1000"}
            tokens = [int(t["x-ratelimit-remaining-tokens"]) for t in told]
            assert tokens[0] == 1000 and tokens == sorted(tokens, reverse=True), tokens
            assert tokens[-1] < 1000, "the answers' usage counted against the minute's tokens"
            for t in told:
                assert 0 < seconds(t["x-ratelimit-reset-requests"]) <= 60
                assert t["x-ratelimit-reset-tokens"] == t["x-ratelimit-reset-requests"]

            with pytest.raises(openai.RateLimitError) as refused:
                client.chat.completions.create(model="m", messages=MESSAGES)
            headers = refused.value.response.headers
            assert refused.value.code == "rate_limit_exceeded"
            assert headers["x-ratelimit-remaining-requests"] == "0"
            assert headers["x-ratelimit-limit-requests"] == "3"
            assert headers["x-ratelimit-limit-tokens"] == "1000"
            wait = seconds(headers["x-ratelimit-reset-requests"])
            assert int(headers["retry-after"]) == max(1, math.ceil(wait)) <= 60

            free = openai.OpenAI(base_url=gateway.base_url, api_key="unlimited-key",
                                 max_retries=0).chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES)
            assert not [h for h in free.headers if h.startswith("x-ratelimit")]
        finally:
            gateway.stop()

    within_one_minute(story)


def test_a_virtual_key_in_a_tighter_team_shows_the_team_s_limit(
        tmp_path_factory: pytest.TempPathFactory,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    doc = config({"up": provider(up.base_url, {"m": "m"})})

    def story() -> None:  # in one minute, on a gateway (and accounts) of its own
        gateway = GatewayProcess(tmp_path_factory.mktemp("team"), doc).start()
        try:
            admin = Admin(gateway)
            admin.team(name="ops", rpm=2)
            secret = admin.key(name="a", team="ops", rpm=10, tpm=500)["key"]
            client = openai.OpenAI(base_url=gateway.base_url, api_key=secret, max_retries=0)
            answers = [client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES) for _ in range(2)]

            assert [(a.headers["x-ratelimit-limit-requests"],
                     a.headers["x-ratelimit-remaining-requests"]) for a in answers] == [
                ("2", "1"), ("2", "0")], "the team's two, not the key's ten"
            assert {a.headers["x-ratelimit-limit-tokens"] for a in answers} == {"500"}, \
                "tokens: the key's own limit, the only one"
            with pytest.raises(openai.RateLimitError) as refused:
                client.chat.completions.create(model="m", messages=MESSAGES)
            assert "team ops" in refused.value.message
            assert refused.value.response.headers["x-ratelimit-remaining-requests"] == "0"
            assert "retry-after" in refused.value.response.headers
        finally:
            gateway.stop()

    within_one_minute(story)


def test_passthrough_counts_against_a_key_s_limits_as_the_relay_does(
        tmp_path_factory: pytest.TempPathFactory,
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    up = upstream_factory("up")
    doc = limited_config(up)
    doc["providers"]["up"]["passthrough"] = ["/v1/models"]

    def story() -> None:
        gateway = GatewayProcess(tmp_path_factory.mktemp("passthrough"), doc).start()
        try:
            def listed() -> httpx.Response:
                return httpx.get(f"{gateway.url}/passthrough/up/v1/models", timeout=10,
                                 headers={"Authorization": "Bearer key-for-team-a"})

            answers = [listed() for _ in range(3)]
            refused = listed()

            assert [a.status_code for a in answers] == [200, 200, 200]
            assert [a.headers["x-ratelimit-remaining-requests"] for a in answers] == \
                ["2", "1", "0"]
            assert refused.status_code == 429 and refused.headers["retry-after"]
            assert refused.headers["x-ratelimit-remaining-requests"] == "0"
            assert chat(gateway, "key-for-team-a").status_code == 429, "one count for both"
        finally:
            gateway.stop()

    within_one_minute(story)
