#!/usr/bin/env bash
# Put specserve's Q8_0 matmul into an unpacked llama-cpp-python source tree (its vendored llama.cpp):
#   bash native/llama_cpp/apply.sh <llama_cpp_python-X.Y.Z source dir>
# The kernel's files go to ggml/src/ggml-cpu/specserve/; ggml-cpu.patch adds them to the CPU
# backend's build and calls the kernel from ggml_compute_forward_mul_mat. Fails loudly if the
# patch does not apply (a new llama.cpp pin: re-read ggml_compute_forward_mul_mat and redo it).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SRC="${1:?usage: apply.sh <llama-cpp-python source dir>}"
CPU="$SRC/vendor/llama.cpp/ggml/src/ggml-cpu"
[ -f "$CPU/ggml-cpu.c" ] || { echo "apply.sh: no $CPU/ggml-cpu.c" >&2; exit 1; }
mkdir -p "$CPU/specserve"
cp "$HERE/specserve.h" "$HERE/expf8.h" "$HERE/q8_matmul.h" "$HERE/q8_matmul.cpp" "$HERE/q8_matmul_avx512.inc" "$HERE/q8_lanes.h" "$HERE/q8_lanes.cpp" "$HERE/lanes_weights.cpp" "$HERE/fwht.h" "$HERE/fwht.cpp" "$HERE/rms_norm.h" "$HERE/rms_norm.cpp" "$HERE/ggml_hook.c" "$HERE/attn_hook.cpp" "$HERE/attn_two_pass.h" "$HERE/attn_two_pass.cpp" "$HERE/attn_scores.h" "$HERE/attn_scores.cpp" "$CPU/specserve/"
patch -d "$SRC" -p1 --forward --batch --quiet < "$HERE/ggml-cpu.patch"
