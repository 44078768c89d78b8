"""An upload built to be slow to parse (tens of thousands of `;` in a part's quoted parameter, or
in the Content-Type header itself) is refused at once with a 400 naming what is past its bound,
while the gateway goes on answering another client; a large upload is parsed off the event loop
and relayed as it came."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.gateway_process import GatewayProcess, config, provider, wait_until
from tests.upstream import FakeUpstream, held

TRANSCRIPTIONS = "/v1/audio/transcriptions"
FORM = "multipart/form-data; boundary=XX"


def upload(disposition: bytes, audio: bytes = b"RIFF....WAVE") -> bytes:
    """A transcription upload whose file part has `disposition` as its Content-Disposition."""
    return (b"--XX\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n"
            b"--XX\r\nContent-Disposition: " + disposition + b"\r\n"
            b"Content-Type: audio/wav\r\n\r\n" + audio + b"\r\n--XX--\r\n")


SEMICOLONS_IN_A_QUOTED_VALUE = upload(b'form-data; name="file"; filename="'
                                      + b";" * 80_000 + b'"')
PLAIN = upload(b'form-data; name="file"; filename="a.wav"')


@pytest.fixture
def gateway(start_gateway: Callable[..., GatewayProcess],
            upstream_factory: Callable[[str], FakeUpstream]) -> Iterator[GatewayProcess]:
    upstream = upstream_factory("whisper")
    yield start_gateway(config({"openai": provider(upstream.base_url,
                                                   {"whisper": "whisper-1"})}))


class Watcher:
    """Another client asking /health over and over, counting its answers."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.url = f"{gateway.url}/health"
        self.answers: list[int] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch)

    def _watch(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                self.answers.append(client.get(self.url).status_code)

    def __enter__(self) -> Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def refused(gateway: GatewayProcess, body: bytes, content_type: str, watcher: Watcher
            ) -> list[dict[str, str]]:
    """Send `body` at least ten times, and on until the watcher has been answered three times
    meanwhile (ten refusals can all come back before its first answer); the errors it got
    (asserting each a 400). A gateway the body stalls answers neither: at most 200 sends."""
    before = len(watcher.answers)
    errors = []
    with httpx.Client(timeout=60) as client:
        while len(errors) < 10 or (len(watcher.answers) - before < 3 and len(errors) < 200):
            answer = client.post(f"{gateway.url}{TRANSCRIPTIONS}", content=body,
                                 headers={"content-type": content_type})
            assert answer.status_code == 400, answer.text
            errors.append(answer.json()["error"])
    return errors


def test_semicolons_in_a_part_s_quoted_parameter_are_refused_while_others_are_served(
        gateway: GatewayProcess, upstream_factory: Callable[[str], FakeUpstream]) -> None:
    with Watcher(gateway) as watcher:
        before = len(watcher.answers)
        errors = refused(gateway, SEMICOLONS_IN_A_QUOTED_VALUE, FORM, watcher)
        during = len(watcher.answers) - before

    assert {e["param"] for e in errors} == {"content-disposition"}
    assert all("part 2" in e["message"] for e in errors)
    assert during > 0 and set(watcher.answers) == {200}, "the other client was answered"


def test_a_content_type_of_sixty_thousand_semicolons_is_refused_before_it_goes_anywhere(
        gateway: GatewayProcess) -> None:
    with Watcher(gateway) as watcher:
        before = len(watcher.answers)
        errors = refused(gateway, PLAIN, FORM + ";" * 60_000, watcher)
        during = len(watcher.answers) - before

    assert {e["param"] for e in errors} == {"content-type"}
    assert during > 0 and set(watcher.answers) == {200}


def test_a_large_upload_is_relayed_as_it_came_while_others_are_served(
        start_gateway: Callable[..., GatewayProcess],
        upstream_factory: Callable[[str], FakeUpstream]) -> None:
    upstream = upstream_factory("large")
    gateway = start_gateway(config({"openai": provider(upstream.base_url,
                                                       {"whisper": "whisper-1"})},
                                   server={"max_body_bytes": 30 * 1024 * 1024}))
    audio = bytes(range(256)) * (20 * 1024 * 1024 // 256)
    body = upload(b'form-data; name="file"; filename="long.wav"', audio)
    upstream.set_mode(held())
    with Watcher(gateway) as watcher:
        sending = threading.Thread(target=lambda: httpx.post(
            f"{gateway.url}{TRANSCRIPTIONS}", content=body, timeout=60,
            headers={"content-type": FORM}))
        sending.start()
        wait_until(lambda: len(upstream.requests) == 1, within=30, what="the upload relayed")
        seen = len(watcher.answers)
        wait_until(lambda: len(watcher.answers) > seen + 3, within=30,
                   what="the other client answered while the upload is in flight")
        upstream.release()
        sending.join(60)

    relayed = upstream.requests[0].body
    assert relayed == body.replace(b"whisper\r\n", b"whisper-1\r\n", 1)
    assert set(watcher.answers) == {200}
