"""The checkpoint's manifest.json (build_engines/convert_target.py and prepare_gguf.py write it),
read without torch: the launcher names the served engine before anything is loaded."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def gguf_entry(checkpoint: Path) -> Optional[dict]:
    """The checkpoint manifest's `gguf` entry (file, type, source, sha256), or None."""
    manifest = checkpoint / "manifest.json"
    return json.loads(manifest.read_text()).get("gguf") if manifest.exists() else None
