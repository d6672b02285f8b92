#!/usr/bin/env bash
# Set up what is missing, then run the whole test suite (unit, lossless, real-server end to end).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The tests check drafters' correctness, not their quality: the quick drafter builds suffice
# (full builds, if present, are used instead).
bash "$ROOT/scripts/setup.sh"
cd "$ROOT" && exec .venv/bin/python -m pytest "$@"
