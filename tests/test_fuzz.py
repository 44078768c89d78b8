"""Whatever bytes arrive, the gateway answers with JSON it meant to send: never a 500."""

from __future__ import annotations

import json

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Pair

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["chat-model", "nope", ""]) | JSON,
    "messages": st.lists(st.fixed_dictionaries({}, optional={"role": JSON | st.just("user"),
                                                            "content": JSON}), max_size=3)
    | JSON,
    "prompt": JSON,
    "stream": st.booleans() | JSON,
    "n": JSON,
})
BODIES = (FIELDS.map(lambda d: json.dumps(d).encode()) | JSON.map(lambda v: json.dumps(v).encode())
          | st.binary(max_size=200))


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=BODIES, path=st.sampled_from(["chat/completions", "completions"]))
def test_no_body_makes_the_gateway_fail(pair: Pair, body: bytes, path: str) -> None:
    response = httpx.post(f"{pair.gateway.base_url}/{path}", content=body,
                          headers={"Content-Type": "application/json"}, timeout=10)

    assert response.status_code != 500, response.text
    assert "Traceback" not in response.text
    if response.headers["content-type"].startswith("application/json"):
        payload = response.json()
        assert "choices" in payload or set(payload) == {"error"}
    else:
        assert response.headers["content-type"].startswith("text/event-stream")
