#!/usr/bin/env bash
# Set up what is missing, then serve the default model on 127.0.0.1 (Ctrl-C stops).
# Ports: HTTP_PORT (8000), GRPC_PORT (8001), METRICS_PORT (8002).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup.sh"
cd "$ROOT" && exec .venv/bin/python -m backend.frontend.supervisor "$@"
