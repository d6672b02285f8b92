"""Before Triton starts: build what the served config names and set-up left out (model drafters,
the served engine's profile), with progress, by `python -m build_engines.on_demand served` in a
process of its own (the supervisor stays free of torch). That process is handed the record the
supervisor resolved (backend/served.py) rather than resolving the config again.
SPECSERVE_BUILD_ON_DEMAND=0 skips it; the model then refuses a drafter that is not built with an
error naming the command that builds it."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ...served import served_needs, write
from ...server_config import ServerConfig
from .errors import LaunchError
from .triton_command import ROOT


def build_what_is_served(served: ServerConfig) -> None:
    if os.environ.get("SPECSERVE_BUILD_ON_DEMAND", "1") == "0":
        return
    drafters, profiles = served_needs(served, ROOT)
    if not (drafters or profiles):
        return
    print(f"the served config names what is not built yet ({', '.join(drafters + [p.name for _, p in profiles])}): "
          "building it before serving", flush=True)
    with tempfile.TemporaryDirectory(prefix="specserve-build-") as directory:
        record = write(served, Path(directory) / "served.json")
        done = subprocess.run([sys.executable, "-m", "build_engines.on_demand", "served", f"--served-record={record}"],
                              cwd=ROOT)
    if done.returncode != 0:
        raise LaunchError(f"building what the served config names failed (exit {done.returncode}; its output is above)")
