#!/usr/bin/env bash
# What a new user waits for: a fresh clone of this checkout's HEAD, then the README's two commands.
#   1. `bash scripts/serve.sh` until the first generated token (set-up from nothing included),
#   2. `bash scripts/serve.sh` again, until the first token (everything cached),
#   3. `bash scripts/test.sh` (set-up checks, then the whole suite; its first run builds the quick
#      drafters and the load tools on demand).
# Prints one line per phase with its wall time; logs stay in the clone's directory.
#   bash bench/time_fresh_clone.sh [DIR]     (DIR: where to clone; default a new temporary one)
# An AVX2-only CPU, approximated on an AVX-512 one (torch's and oneDNN's kernels limited to AVX2,
# llama.cpp built without -march=native, so with AVX2 but no AVX-512):
#   ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 CMAKE_ARGS=-DGGML_NATIVE=OFF bash bench/time_fresh_clone.sh
set -euo pipefail
SRC="${SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"  # the checkout to clone
DIR="${1:-$(mktemp -d /tmp/specserve-fresh.XXXXXX)}"
PORT="${HTTP_PORT:-18000}"
say() { echo "[fresh-clone] $*"; }

git clone -q "$SRC" "$DIR/repo"
cd "$DIR/repo"
say "clone of $(git rev-parse --short HEAD) in $DIR/repo; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)," \
    "$(nproc) cores, $(grep -qw avx512f /proc/cpuinfo && echo AVX-512 || echo 'AVX2 only')" \
    "${ONEDNN_MAX_CPU_ISA:+(limited: ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-} CMAKE_ARGS=${CMAKE_ARGS:-})}"

first_token() {  # $1: log file. Serve, wait for a generated token, stop; prints the seconds it took.
  local t0 pid
  t0=$(date +%s)
  HTTP_PORT=$PORT GRPC_PORT=$((PORT + 1)) METRICS_PORT=$((PORT + 2)) setsid bash scripts/serve.sh >"$1" 2>&1 &
  pid=$!
  until curl -sf -X POST "127.0.0.1:$PORT/v2/models/llm/generate" \
        -d '{"text_input": "The capital of France is", "max_tokens": 1}' 2>/dev/null | grep -q '"text_output"'; do
    if ! kill -0 "$pid" 2>/dev/null; then echo "serve.sh exited before serving; see $1" >&2; return 1; fi
    sleep 2
  done
  echo $(( $(date +%s) - t0 ))
  kill -TERM -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

s1=$(first_token "$DIR/serve-1.log"); say "first token, fresh clone: $s1 s"
s2=$(first_token "$DIR/serve-2.log"); say "first token, second run:  $s2 s"
t0=$(date +%s)
if bash scripts/test.sh -q >"$DIR/test.log" 2>&1; then rc=0; else rc=$?; fi
say "scripts/test.sh: $(( $(date +%s) - t0 )) s, exit $rc ($(grep -E '^[0-9]+ (passed|failed)' "$DIR/test.log" | tail -1))"
