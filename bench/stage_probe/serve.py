"""`gateway serve` with the stage probe on: what `bench/stages.py` starts instead of it.

    .venv/bin/python bench/stage_probe/serve.py --config llms.json --port 8000 --out DIR

The app is `gateway.app.create_app()`, the factory `gateway serve` runs, served by the same
server with the same options (`gateway.edge.serving.run`, given this module's factory). The probe
comes in through public hooks only: a Litestar startup hook (`Litestar.on_startup`, run once the
app's lifespan has built its `Runtime`) sets `Runtime.trace` to a `probe.StageRecorder`, and a
shutdown hook writes out the lines still held. Each server worker writes DIR/<pid>.log.

The upstream side is one span (`provider` to `reply`): the transport (`AiohttpTransport`) takes
no `aiohttp.TraceConfig` yet. When it does, pass it `StageRecorder.trace_config()` and build the
recorder with `upstream=True`: the probe then splits the span at `upstream_sent` and
`upstream_head`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from litestar import Litestar

BENCH = Path(__file__).resolve().parent.parent
if str(BENCH) not in sys.path:  # run by path: `stage_probe` is a folder of bench/
    sys.path.insert(0, str(BENCH))

from stage_probe.probe import StageRecorder  # noqa: E402

OUT_ENV = "STAGE_PROBE_DIR"
TARGET = "stage_probe.serve:create_probed_app"


def create_probed_app() -> Any:
    """The app `gateway serve` runs, its relay stages stamped into $STAGE_PROBE_DIR."""
    from gateway.app import create_app

    app = create_app()
    litestar = app
    while not isinstance(litestar, Litestar):  # the ASGI layers in front of Litestar
        litestar = litestar.app
    recorder = StageRecorder(Path(os.environ[OUT_ENV]), upstream=False)

    def start(app: Litestar) -> None:
        app.state.runtime.trace = recorder.trace

    litestar.on_startup.append(start)
    litestar.on_shutdown.append(recorder.close)
    return app


def main() -> int:
    from gateway import config
    from gateway.config.loader import CONFIG_ENV
    from gateway.edge import openfiles, serving

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder for the stamps")
    args = parser.parse_args()
    path = config.discover(args.config)
    snapshot = config.load(path)
    # As `gateway serve` does: the app factory reads the config's path from the environment.
    os.environ.update({CONFIG_ENV: str(path.resolve()), OUT_ENV: str(args.out.resolve())})
    # The server's workers import TARGET: bench/ must be on their path too.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (str(BENCH),
                                                             os.environ.get("PYTHONPATH"))))
    open_files = openfiles.raise_limit()
    host = snapshot.server.host
    serving.run(snapshot.server, host, args.port, 1, open_files, app=TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main())
