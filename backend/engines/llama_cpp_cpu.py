"""What this project asks of llama.cpp on every x86 CPU kind, in one place.

llama.cpp's CPU backend can move a model's weights into *extra buffer types* at load:
ggml's repack (weights interleaved for its own kernels) and, where the build has it,
Intel AMX (`load_tensors: AMX model buffer size = ...`). On 2-core Sapphire-Rapids-class
VMs (AWS m7i / c7i / r7i and most 2024-26 Intel cloud machines) the AMX path segfaults
in the first `llama_decode` (llama.cpp issue 20824, ollama issue 17205) although the
kernel grants AMX. We never take either path:

* at build time ggml is compiled without AMX (`BUILD_CFLAGS`: GCC's explicit `-mno-amx-*`
  win over `-march=native` whatever their order), so no binary of ours contains it;
* at load time every model is loaded with `use_extra_bufts = False` (`model_params`):
  the weights stay in ggml's plain layout, which our own Q8_0 kernel reads
  (native/llama_cpp), and a build made some other way still never repacks;
* llama.cpp's own server, the benchmarks' peer, runs with `--no-repack`
  (`LLAMA_SERVER_ARGS`), the same switch on its command line.

Why never rather than "where a probe says it works": measured on a 2-core Xeon with AMX
(issue 39), an AMX-free build with and without the repack path verified 1/2/4/8 tokens of
the served Q8_0 model in 13.6/18.6/25.2/34.2 vs 13.2/19.2/25.2/35.9 ms: the extra buffers
buy nothing for the served type, so a probe would risk a crash for no gain. The tests
(tests/backend/engines/test_llama_cpp_cpu.py) check what each caller asks for.

    python -m backend.engines.llama_cpp_cpu cflags     # the C/C++ flags the llama.cpp builds add
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from types import SimpleNamespace

# GCC and Clang: an explicit -mno-<isa> beats -march=native's choice in any order.
BUILD_CFLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
LLAMA_SERVER_ARGS = ("--no-repack",)  # llama-server's name for use_extra_bufts = false


def model_params(ll):
    """llama_model_params for every model this project loads with llama.cpp (ll: the
    llama_cpp module): CPU only, weights in ggml's plain layout (no repack, no AMX)."""
    mp = ll.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = False
    return mp


@contextmanager
def high_level_defaults():
    """llama-cpp-python's high-level `Llama` (a benchmark peer) builds its model params from
    `llama_model_default_params()`: inside this block that gives `model_params`'s."""
    import llama_cpp.llama_cpp as low

    default = low.llama_model_default_params
    low.llama_model_default_params = lambda: model_params(SimpleNamespace(llama_model_default_params=default))
    try:
        yield
    finally:
        low.llama_model_default_params = default


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["cflags"]:
        print(BUILD_CFLAGS)
        return 0
    print("usage: python -m backend.engines.llama_cpp_cpu cflags", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())
