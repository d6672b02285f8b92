"""Entry point of the containers (docker/Dockerfile, docker/Dockerfile.trtllm).

    entrypoint.py serve     start the server (launcher + HTTP edge + Triton) with the project's model repository
                            (both images' default);
                            with SPECSERVE_AUTO_PREPARE=1 it runs `prepare` first
    entrypoint.py prepare   fill the model cache, offline: convert the default model from the GGUF baked
                            into the image and measure this host's step-time profile (scripts/setup.sh
                            steps 3-5); each part is skipped when already there. On the GPU image
                            (SPECSERVE_ENGINE=trtllm): build_engines/prepare_trtllm.py for the served
                            checkpoint (LLM-API settings, drafters, manifest; the cache mounted writable)
    entrypoint.py check     exit 0 iff Triton answers 200 on /v2/health/ready (the health check)

The model cache is a volume mounted at /cache (models/, drafters/, profiles/); the image links
`<project>/.cache/{models,drafters,profiles}` to it, so every default path in
model_repository/llm/config.pbtxt and configs/policies/*.yaml resolves unchanged. The Triton
binaries stay in the image (`<project>/.cache/triton`), never in the volume.

`serve` runs the same server as scripts/serve.sh: backend/frontend/supervisor/, the supervisor (drain on
SIGTERM, Triton restarted if it dies, leftovers cleaned) with the HTTP edge (limits, admin key)
in front of Triton, never a bare tritonserver with its own HTTP port public. The one difference:
inside a container the edge, gRPC and metrics listen on all interfaces (SPECSERVE_BIND_ADDRESS,
default 0.0.0.0), or the published ports would reach nothing; Triton's own HTTP stays on the
container's loopback behind the edge. docker/docker-compose.yml publishes the ports on the host's
127.0.0.1 only.
"""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

ROOT = Path(os.environ.get("SPECSERVE_ROOT") or Path(__file__).resolve().parents[1])
DEFAULT_MODEL = "smollm2-135m-instruct"


def log(msg: str) -> None:
    print(f"[entrypoint] {msg}", flush=True)


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def serve_command() -> list:
    """The supervisor's command line (backend/frontend/supervisor/), listening on SPECSERVE_BIND_ADDRESS."""
    return [sys.executable, "-m", "backend.frontend.supervisor", f"--http-port={env_int('HTTP_PORT', 8000)}",
            f"--grpc-port={env_int('GRPC_PORT', 8001)}", f"--metrics-port={env_int('METRICS_PORT', 8002)}",
            f"--model-repository={ROOT / 'model_repository'}",
            f"--bind-address={os.environ.get('SPECSERVE_BIND_ADDRESS') or '0.0.0.0'}"]


def checkpoint() -> Path:
    ckpt = Path(os.environ.get("SPECSERVE_CHECKPOINT") or f".cache/models/{DEFAULT_MODEL}")
    return ckpt if ckpt.is_absolute() else ROOT / ckpt


def serve() -> int:
    if os.environ.get("SPECSERVE_AUTO_PREPARE") == "1":
        prepare()
    ckpt = checkpoint()
    if not (ckpt / "config.json").exists():
        log(f"no checkpoint at {ckpt}. Put a Hugging Face Llama-family directory there (the cache volume is "
            f"mounted at /cache; models live in /cache/models/<name>), mount a cache made by "
            f"scripts/setup.sh (SPECSERVE_CACHE=../.cache), or, on the CPU image, run `prepare` once.")
        return 2
    cmd = serve_command()
    log(f"serving {ckpt}: {' '.join(cmd)}")
    os.chdir(ROOT)  # the launcher is PID 1's successor: it gets docker's SIGTERM and drains
    os.execv(cmd[0], cmd)
    return 1  # not reached


def run(*args: str) -> None:
    log(" ".join(args))
    subprocess.run([sys.executable, "-m", *args], cwd=ROOT, check=True)


def prepare() -> int:
    """scripts/setup.sh steps 3-5 into the cache volume; a part already there costs nothing."""
    if os.environ.get("SPECSERVE_ENGINE") == "trtllm":
        return prepare_trtllm()
    cache = ROOT / ".cache"
    for part in ("models", "drafters", "profiles"):
        (cache / part).resolve().mkdir(parents=True, exist_ok=True)  # the volume may be empty
    ckpt = cache / "models" / DEFAULT_MODEL
    gguf_dir = os.environ.get("SPECSERVE_GGUF_DIR") or str(ROOT / "gguf")
    if not (ckpt / "manifest.json").exists():  # ~1 min: dequantise the GGUF shipped in the image
        run("build_engines.convert_target", "--out", str(ckpt), "--download-cache", gguf_dir)
    preset = os.environ.get("SPECSERVE_PREPARE_DRAFTERS", "")  # "", "quick" or "full" (minutes to an hour)
    if preset:
        run("build_engines.distill_drafter", "--preset", preset, "--target", str(ckpt), "--out", str(cache / "drafters"))
    run("build_engines.prepare_gguf", "--checkpoint", str(ckpt),
        "--source", str(Path(gguf_dir) / "SmolLM2-135M-Instruct.Q4_1.gguf"))  # seconds; skipped when present
    engine = os.environ.get("SPECSERVE_ENGINE", "llama.cpp")
    if engine in ("llama.cpp", "torch"):  # a few minutes the first time: this host's step times (skipped when measured)
        run("build_engines.profile_costs", "--engine", engine, "--repeats", "3", "--drafter-dir",
            str(cache / "drafters"), "--checkpoint", str(ckpt), "--out-dir", str(cache / "profiles"))
    log("model cache ready")
    return 0


def prepare_trtllm() -> int:
    """The GPU image's model cache: the checkpoint must be there already (no network, no GGUF)."""
    args = ["build_engines.prepare_trtllm", "--checkpoint", str(checkpoint())]
    if os.environ.get("SPECSERVE_PREPARE_DRAFTERS"):
        args += ["--build-drafters", os.environ["SPECSERVE_PREPARE_DRAFTERS"]]
    run(*args)
    return 0


def check() -> int:
    url = f"http://127.0.0.1:{env_int('HTTP_PORT', 8000)}/v2/health/ready"
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return 0 if r.status == 200 else 1
    except OSError:
        return 1


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = {"serve": serve, "prepare": prepare, "check": check}
    if len(argv) != 1 or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 64
    return commands[argv[0]]()


if __name__ == "__main__":
    sys.exit(main())
