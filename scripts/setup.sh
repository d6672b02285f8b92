#!/usr/bin/env bash
# Install what serving the default model needs, idempotently (a second run takes seconds):
#   1. the project venv (.venv) with pinned requirements (torch 2.13.0 CPU), the project
#      itself installed into it, editable (pyproject.toml), and llama-cpp-python built for this CPU,
#   2. the real Triton Inference Server + Python backend from the nvidia-pytriton wheel,
#   3. the default model, converted once into a cached safetensors checkpoint, and the GGUF the
#      llama.cpp engine serves,
#   4. the served engine's step-time profile (build_engines/profile_costs.py, within
#      SPECSERVE_PROFILE_BUDGET_S, 120 s).
# The rest is built the first time something needs it (build_engines/on_demand.py: a served config
# that names it, a test, a benchmark), with progress, or here up front:
#   --drafters   the distilled model drafters chat, code, chat-feature (SPECSERVE_DRAFTER_PRESET=quick,
#                a few minutes; full: ~20-27 min each on a CPU with native bf16, ~55 min on AVX2 only)
#   --profiles   the torch engine's step-time profile too (and the llama.cpp one again with the drafters)
#   --loadtools  perf_analyzer and genai-perf (scripts/setup_loadtools.sh)
#   --all        all three
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="$ROOT/.cache"
PYTRITON_SPEC="nvidia-pytriton==0.7.0"
say() { echo "[setup] $*"; }
DRAFTERS=0 PROFILES=0 LOADTOOLS=0
for arg in "$@"; do
  case "$arg" in
    --drafters) DRAFTERS=1 ;;
    --profiles) PROFILES=1 ;;
    --loadtools) LOADTOOLS=1 ;;
    --all) DRAFTERS=1 PROFILES=1 LOADTOOLS=1 ;;
    *) echo "usage: scripts/setup.sh [--drafters] [--profiles] [--loadtools] [--all]" >&2; exit 64 ;;
  esac
done
cd "$ROOT"
# shellcheck source=scripts/run_step.sh
. scripts/run_step.sh

# 1. venv ------------------------------------------------------------------------
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3
if [ ! -x .venv/bin/python ] || ! cmp -s requirements.txt .venv/.requirements.installed; then
  say "creating .venv and installing requirements.txt (first run: about a minute)"
  "$PY" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
  cp requirements.txt .venv/.requirements.installed
else
  say ".venv up to date"
fi
# the project itself (policy, backend, build_engines; see pyproject.toml), editable and
# without dependencies: edits are live, and tests, benchmarks and the Triton model.py
# import the same sources. Reinstalled only when pyproject.toml or the checkout's path changes.
project_stamp() { cat pyproject.toml; echo "# installed from $ROOT"; }
if ! project_stamp | cmp -s - .venv/.project.installed; then
  say "installing the project into .venv (editable)"
  .venv/bin/pip install -q --disable-pip-version-check --no-deps -e .
  project_stamp > .venv/.project.installed
else
  say "project installed"
fi

# the llama.cpp engine: llama-cpp-python has no binary wheel on the index, so its sdist is built here
# (vendored llama.cpp, native to this CPU: ~5 min on 2 quiet AVX-512 cores, ~8 on AVX2 ones), with
#  - our Q8_0 matmul and attention put into its CPU backend (native/llama_cpp: verification of
#    several tokens then costs far fewer decoding steps; each row computed the same way whatever
#    shares the step),
#  - no Intel AMX code (backend/engines/llama_cpp_cpu.py: its weight repack crashes on
#    Sapphire-Rapids-class VMs and buys nothing for the served type),
#  - no multimodal library (mtmd: images and audio, which we never load; -DLLAVA_BUILD=OFF).
# The wheel is cached per CPU kind, build options and kernel sources (a native build would not run on
# another CPU), so a second run installs it in seconds. CMAKE_ARGS you set are passed on (and key the cache).
LLAMA_SPEC="llama-cpp-python==0.3.36"
LLAMA_CMAKE_ARGS="${CMAKE_ARGS:-} -DLLAVA_BUILD=OFF"
LLAMA_CFLAGS="$(.venv/bin/python -m backend.engines.llama_cpp_cpu cflags)"
cpu_kind="$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | sort | md5sum | cut -c1-12)"
native_kind="$(cd native/llama_cpp && cat apply.sh ggml-cpu.patch *.h *.c *.cpp *.inc | md5sum | cut -c1-6)"  # what the build reads
build_kind="$cpu_kind-$(echo "$LLAMA_CMAKE_ARGS $LLAMA_CFLAGS" | md5sum | cut -c1-6)-$native_kind"
W="$CACHE/wheels/llama-cpp-$build_kind"
if [ "$(cat .venv/.llama.installed 2>/dev/null)" != "$LLAMA_SPEC $build_kind" ]; then
  if ! ls "$W"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    say "building $LLAMA_SPEC from source for this CPU, with our Q8_0 kernel (about 5-8 min on 2 cores; progress in compile steps)"
    # shellcheck source=scripts/llama_cpp_sdist.sh
    . scripts/llama_cpp_sdist.sh
    sdist="$(llama_sdist "$ROOT" "$LLAMA_SPEC" .venv/bin/python)"
    src="$(mktemp -d)"
    tar -xzf "$sdist" -C "$src"
    bash native/llama_cpp/apply.sh "$src"/llama_cpp_python-*
    mkdir -p "$W"
    CFLAGS="$LLAMA_CFLAGS" CXXFLAGS="$LLAMA_CFLAGS" CMAKE_ARGS="$LLAMA_CMAKE_ARGS" \
      .venv/bin/pip wheel -v --no-deps --no-cache-dir --disable-pip-version-check -w "$W.part" "$src"/llama_cpp_python-* 2>&1 \
      | awk '/^ *\[[0-9]+\/[0-9]+\]/ { split($1, a, /[\[\/\]]/); if (a[2] % 20 == 0 || a[2] == a[3]) { print "[setup]   llama.cpp compile " a[2] "/" a[3]; fflush() } }
             /^(ERROR|CMake Error)|: error:/ { print; fflush() }'
    rm -rf "$src"
    mv "$W.part"/llama_cpp_python-*.whl "$W"/ && rm -rf "$W.part"
  fi
  .venv/bin/pip install -q --no-deps --disable-pip-version-check --force-reinstall "$W"/llama_cpp_python-*.whl
  echo "$LLAMA_SPEC $build_kind" > .venv/.llama.installed
else
  say "llama.cpp engine installed"
fi

# 2. Triton server ---------------------------------------------------------------
T="$CACHE/triton"
if [ ! -x "$T/backends/python/triton_python_backend_stub" ]; then
  say "fetching the Triton Inference Server from $PYTRITON_SPEC (55 MB)"
  mkdir -p "$T" && tmp="$(mktemp -d)"
  .venv/bin/pip download -q --no-deps --disable-pip-version-check -d "$tmp" "$PYTRITON_SPEC"
  (cd "$T" && unzip -q -o "$tmp"/nvidia_pytriton-*.whl 'pytriton/tritonserver/*' 'nvidia_pytriton.libs/*')
  rm -rf "$tmp"
  pyver="$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
  mkdir -p "$T/backends/python"
  cp "$T/pytriton/tritonserver/backends/python/"{libtriton_python.so,triton_python_backend_utils.py} "$T/backends/python/"
  cp "$T/pytriton/tritonserver/python_backend_stubs/$pyver/triton_python_backend_stub" "$T/backends/python/"
  chmod +x "$T/pytriton/tritonserver/bin/tritonserver" "$T/backends/python/triton_python_backend_stub"
else
  say "Triton server present"
fi

# 3. default model -----------------------------------------------------------------
run_step "converting the default model" .venv/bin/python -m build_engines.convert_target \
  --out "$CACHE/models/smollm2-135m-instruct" --download-cache "$CACHE/downloads"

# the GGUF the llama.cpp engine serves (type chosen by measurement; see build_engines/prepare_gguf.py)
run_step "preparing the served GGUF with llama.cpp" .venv/bin/python -m build_engines.prepare_gguf \
  --checkpoint "$CACHE/models/smollm2-135m-instruct" --source "$CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"

# 4. the served engine's step-time / switch-cost profile the adaptive policy reads (this machine's)
run_step "measuring llama.cpp's step times on this machine (the first model load)" \
  .venv/bin/python -m build_engines.on_demand profile --engine llama.cpp

# what the flags ask for up front (otherwise built on demand) ------------------------------------
if [ "$DRAFTERS" = 1 ]; then run_step "building the model drafters" .venv/bin/python -m build_engines.on_demand drafters; fi
if [ "$PROFILES" = 1 ]; then
  for engine in llama.cpp torch; do
    run_step "measuring $engine's step times" .venv/bin/python -m build_engines.on_demand profile --engine "$engine"
  done
fi
if [ "$LOADTOOLS" = 1 ]; then bash scripts/setup_loadtools.sh; fi
say "done"
