"""Time each stage of a relayed whole answer inside the gateway, for `bench/stages.py`.

    PYTHONPATH=bench/stage_probe STAGE_PROBE_DIR=DIR python -m gateway serve ...

In the `gateway serve` process only, wraps the boundaries of the request's path and appends one
line per answered request to DIR/<pid>.log: `time.perf_counter_ns()` at each of `STAGES`. The
stamps are kept for the latest request only, so requests that overlap spoil each other's line
(the reader drops lines whose stamps are out of order): meant for rates where requests rarely
overlap, like the 500 req/s of the latency target. Each wrapper costs ~1 µs. With no
STAGE_PROBE_DIR it does nothing.
"""

import os
import sys
import time

STAGES = ("received", "relay", "admitted", "provider", "upstream_write", "upstream_data",
          "reply", "answered", "after_done")

_dir = os.environ.get("STAGE_PROBE_DIR")
if _dir and "serve" in sys.argv:
    from uvicorn.protocols.http import httptools_impl

    from gateway import fastpath, relay
    from providers import wire

    _now = time.perf_counter_ns
    _stamps = dict.fromkeys(STAGES, 0)
    _lines: list[str] = []
    _log = open(os.path.join(_dir, f"{os.getpid()}.log"), "a")  # noqa: SIM115

    def _wrap_method(cls, name, stage):  # type: ignore[no-untyped-def]
        original = getattr(cls, name)

        def wrapped(*args):  # type: ignore[no-untyped-def]
            _stamps[stage] = _now()
            return original(*args)
        setattr(cls, name, wrapped)

    _wrap_method(httptools_impl.HttpToolsProtocol, "data_received", "received")
    _wrap_method(wire.Connection, "send", "upstream_write")

    _upstream_data = wire.Connection.data_received

    def _first_upstream_data(self, data):  # type: ignore[no-untyped-def]
        if _stamps["upstream_data"] < _stamps["upstream_write"]:
            _stamps["upstream_data"] = _now()
        return _upstream_data(self, data)
    wire.Connection.data_received = _first_upstream_data

    _relay_call = fastpath.FastRelay.__call__

    async def _relay(self, scope, receive, send):  # type: ignore[no-untyped-def]
        _stamps["relay"] = _now()
        return await _relay_call(self, scope, receive, send)
    fastpath.FastRelay.__call__ = _relay

    _admit = relay._admit

    async def _admitted(*args):  # type: ignore[no-untyped-def]
        admitted = await _admit(*args)
        _stamps["admitted"] = _now()
        return admitted
    relay._admit = _admitted

    _send = relay._send

    async def _provider(*args):  # type: ignore[no-untyped-def]
        _stamps["provider"] = _now()
        reply = await _send(*args)
        _stamps["reply"] = _now()
        return reply
    relay._send = _provider

    _write = fastpath.write_to_uvicorn

    def _answered(*args):  # type: ignore[no-untyped-def]
        written = _write(*args)
        _stamps["answered"] = _now()
        return written
    fastpath.write_to_uvicorn = _answered

    _completed = relay.Exchange.completed

    def _after_done(self):  # type: ignore[no-untyped-def]
        _completed(self)
        _stamps["after_done"] = _now()
        _lines.append(" ".join(str(_stamps[stage]) for stage in STAGES) + "\n")
        if len(_lines) >= 200:  # a file write per 200 requests; uvicorn skips exit hooks
            _log.write("".join(_lines))
            _log.flush()
            _lines.clear()
    relay.Exchange.completed = _after_done
