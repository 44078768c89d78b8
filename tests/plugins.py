"""Provider kinds installed as real plug-ins (an entry point in a dist-info on PYTHONPATH), for
stories about what a third-party kind's bug must not do to the gateway."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path


def install(folder: Path, kind: str, source: str) -> dict[str, str]:
    """Install module `{kind}_kind` (its `source` defines `Kind`) as provider kind `kind`;
    the environment a gateway needs to find it."""
    module = f"{kind}_kind"
    (folder / f"{module}.py").write_text(textwrap.dedent(source))
    info = folder / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[llms_gateway.providers]\n{kind} = {module}:Kind\n")
    inherited = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": os.pathsep.join([str(folder), *filter(None, [inherited])])}
