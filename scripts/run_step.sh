# Sourced by scripts/setup.sh: run one set-up step; if it dies of a signal (a crash in native code:
# llama.cpp, torch), say which step, what the signal means and what to try, not a bare
# "Segmentation fault". Python steps print their own traceback too (PYTHONFAULTHANDLER).
#   run_step "what it does" command args...
run_step() {
  local what="$1" rc=0
  shift
  PYTHONFAULTHANDLER=1 "$@" || rc=$?
  [ "$rc" -eq 0 ] && return 0
  if [ "$rc" -gt 128 ]; then
    local sig name
    sig=$((rc - 128))
    name="$(kill -l "$sig" 2>/dev/null || echo "signal $sig")"
    {
      echo "[setup] FAILED: $what crashed (SIG$name) in native code."
      echo "[setup]   command: $*"
      echo "[setup]   CPU: $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'); SIMD: $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512_vnni|avx_vnni|amx_tile|amx_int8)$' | tr '\n' ' ')"
      case "$name" in
        SEGV|BUS|ABRT)
          echo "[setup]   llama.cpp is built for this CPU (-march=native, no AMX: backend/engines/llama_cpp_cpu.py)."
          echo "[setup]   Try: a rebuild for this machine (rm -rf .cache/wheels/llama-cpp-*; bash scripts/setup.sh);"
          echo "[setup]   then stock kernels only (SPECSERVE_Q8_MATMUL=0 bash scripts/setup.sh) to tell ours from llama.cpp's;"
          echo "[setup]   then a portable build (CMAKE_ARGS=-DGGML_NATIVE=OFF bash scripts/setup.sh)." ;;
        ILL)
          echo "[setup]   An instruction this CPU lacks: the cached llama.cpp build was made for another CPU."
          echo "[setup]   Try: rm -rf .cache/wheels/llama-cpp-*; bash scripts/setup.sh" ;;
        KILL)
          echo "[setup]   Killed from outside: most often the kernel's OOM killer (see dmesg); free memory and retry." ;;
      esac
      echo "[setup]   Please report it with this output."
    } >&2
  else
    echo "[setup] FAILED: $what (exit code $rc): $*" >&2
  fi
  return "$rc"
}
