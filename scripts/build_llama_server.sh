#!/usr/bin/env bash
# Build llama.cpp's own server, `llama-server`, the peer bench/bench_peer.py compares us with:
# from the vendored llama.cpp of the very llama-cpp-python sdist scripts/setup.sh pins (the same
# llama.cpp our engine runs), so the two servers differ only in their serving loops. Benchmarks
# only: nothing serves or tests with it, so set-up never builds it.
#
#   bash scripts/build_llama_server.sh     # prints the binary's path on stdout, progress on stderr
#
# Usually run through `python -m build_engines.on_demand llama-server` (which holds a lock, so two
# processes build once). The sdist is kept in .cache/downloads/; the binary in
# .cache/llama-server/<CPU kind>-<build options>/llama-server (a native build would not run on
# another CPU), so a second run costs a file check. About 10-15 min on 2 cores (Ninja if present,
# else make). Static (BUILD_SHARED_LIBS=OFF): one file, no build tree to keep. Extra CMake flags:
# LLAMA_SERVER_CMAKE_ARGS (they key the cache too).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
say() { echo "[llama-server] $*" >&2; }

# the pin lives in one place: scripts/setup.sh's LLAMA_SPEC
SPEC="$(sed -n 's/^LLAMA_SPEC="\(.*\)"$/\1/p' "$ROOT/scripts/setup.sh")"
[ -n "$SPEC" ] || { say "no LLAMA_SPEC in scripts/setup.sh"; exit 1; }
VERSION="${SPEC#*==}"
# llama.cpp's own kernels (no specserve patch: it is the peer), built without AMX like ours
# (backend/engines/llama_cpp_cpu.py; bench_peer.py also runs it with --no-repack)
NO_AMX="$("$ROOT/.venv/bin/python" -m backend.engines.llama_cpp_cpu cflags)"
FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
-DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF ${LLAMA_SERVER_CMAKE_ARGS:-}"
cpu_kind="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | sort | md5sum | cut -c1-12)"  # as setup.sh keys its wheel
OUT="$CACHE/llama-server/$cpu_kind-$(echo "$SPEC $FLAGS $NO_AMX" | md5sum | cut -c1-6)"
if [ -x "$OUT/llama-server" ]; then
  echo "$OUT/llama-server"
  exit 0
fi
PY="$ROOT/.venv/bin/python"
[ -x "$PY" ] || PY=python3

# 1. the sdist (pip's configured index, as set-up fetches everything), shared with set-up's build
# shellcheck source=scripts/llama_cpp_sdist.sh
. "$ROOT/scripts/llama_cpp_sdist.sh"
SDIST="$(llama_sdist "$ROOT" "$SPEC" "$PY")"

# 2. its vendored llama.cpp, configured and built (llama-server only)
WORK="$CACHE/llama-server/.build-$$"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK"
say "unpacking vendor/llama.cpp from $(basename "$SDIST")"
tar -xzf "$SDIST" -C "$WORK" --wildcards '*/vendor/llama.cpp/*'
SRC="$(ls -d "$WORK"/*/vendor/llama.cpp)"
GEN=()
if command -v ninja >/dev/null; then GEN=(-G Ninja); fi
say "configuring ($([ ${#GEN[@]} -gt 0 ] && echo Ninja || echo make)): $FLAGS"
# shellcheck disable=SC2086  # FLAGS is a list of words
if ! CFLAGS="$NO_AMX" CXXFLAGS="$NO_AMX" cmake -S "$SRC" -B "$WORK/build" "${GEN[@]}" $FLAGS > "$WORK/configure.log" 2>&1; then
  tail -30 "$WORK/configure.log" >&2
  exit 1
fi
say "building llama-server on $(nproc) cores (about 10-15 min on 2; progress in compile steps)"
# Ninja prints [step/total], make [ nn%]: one progress line per 20 steps / 10%, and every error
cmake --build "$WORK/build" -j"$(nproc)" --target llama-server 2>&1 \
  | awk '/^\[[0-9]+\/[0-9]+\]/ { split($1, a, /[\[\/\]]/); if (a[2] % 20 == 0 || a[2] == a[3]) { print "[llama-server]   compile " a[2] "/" a[3]; fflush() } }
         /^\[ *[0-9]+%\]/ { p = $0; sub(/^\[ */, "", p); sub(/%.*/, "", p); if (p + 0 >= shown + 10) { shown = p + 0; print "[llama-server]   compile " p "%"; fflush() } }
         /^(ERROR|CMake Error|FAILED)|: error:/ { print; fflush() }' >&2

# 3. cached: the binary and what built it
mkdir -p "$OUT.part"
install -m 755 "$WORK/build/bin/llama-server" "$OUT.part/llama-server"
printf '%s\n%s\n%s\n' "$SPEC" "$FLAGS CFLAGS=$NO_AMX" "$("$OUT.part/llama-server" --version 2>&1 | head -2 | tr '\n' ' ')" > "$OUT.part/build-info.txt"
rm -rf "$OUT" && mv "$OUT.part" "$OUT"
say "built $OUT/llama-server"
echo "$OUT/llama-server"
