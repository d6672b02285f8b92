"""The load tools' pins, read from scripts/setup_loadtools.sh (their one source of truth).

    python loadtools_pins.py scripts/setup_loadtools.sh requirements   the frozen genai-perf set
    python loadtools_pins.py scripts/setup_loadtools.sh perf-analyzer  perf-analyzer==<version>

docker/Dockerfile.loadgen installs exactly what the project's set-up installs on a development
machine: genai-perf with its complete frozen dependency set (--no-deps), and the perf_analyzer
binary from the `perf-analyzer` wheel (unpacked, not pip-installed: genai-perf's frozen set holds a
different `perf_analyzer` distribution of the same name).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path


def genai_perf_requirements(script: str) -> str:
    m = re.search(r"GENAI_PERF_REQUIREMENTS=\"\$\(cat <<'EOF'\n(.*?)\nEOF\n", script, re.S)
    if not m:
        raise SystemExit("GENAI_PERF_REQUIREMENTS block not found in the set-up script")
    return m.group(1).strip() + "\n"


def perf_analyzer_spec(script: str) -> str:
    m = re.search(r"^PERF_ANALYZER_VERSION=(\S+)$", script, re.M)
    if not m:
        raise SystemExit("PERF_ANALYZER_VERSION not found in the set-up script")
    return f"perf-analyzer=={m.group(1)}\n"


def main(argv) -> int:
    if len(argv) != 2 or argv[1] not in ("requirements", "perf-analyzer"):
        print(__doc__, file=sys.stderr)
        return 64
    script = Path(argv[0]).read_text()
    sys.stdout.write(genai_perf_requirements(script) if argv[1] == "requirements" else perf_analyzer_spec(script))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
