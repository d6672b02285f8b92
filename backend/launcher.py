"""Start the real Triton Inference Server (from the nvidia-pytriton wheel) on loopback.

    python -m backend.launcher [--http-port 8000 --grpc-port 8001 --metrics-port 8002]

Used by scripts/serve.sh and by the integration tests (`start_server`).
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRITON = ROOT / ".cache" / "triton"


@dataclass
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_repository: Path, ports: Ports, log_verbose: int = 0) -> list:
    binary = TRITON / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    if not binary.exists():
        raise FileNotFoundError(f"{binary} missing: run scripts/setup.sh first")
    return [str(binary), f"--model-repository={model_repository}", f"--backend-directory={TRITON / 'backends'}",
            "--http-address=127.0.0.1", f"--http-port={ports.http}",
            "--grpc-address=127.0.0.1", f"--grpc-port={ports.grpc}",
            "--metrics-address=127.0.0.1", f"--metrics-port={ports.metrics}",
            "--allow-gpu-metrics=false", "--allow-cpu-metrics=true", f"--log-verbose={log_verbose}",
            "--exit-timeout-secs=10"]


def server_env(extra: dict | None = None) -> dict:
    """The stub embeds libpython: make it the venv's base Python and see the venv first."""
    env = dict(os.environ)
    venv_bin = ROOT / ".venv" / "bin"
    libs = [str(TRITON / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, libs + [env.get("LD_LIBRARY_PATH", "")]))
    env["PATH"] = f"{venv_bin}:{env.get('PATH', '')}"
    env["SPECSERVE_ROOT"] = str(ROOT)
    env.update(extra or {})
    return env


def wait_ready(ports: Ports, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    deadline = time.time() + timeout_s
    url = f"http://127.0.0.1:{ports.http}/v2/health/ready"
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tritonserver exited with code {proc.returncode} before becoming ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"tritonserver not ready after {timeout_s:.0f} s")


def start_server(model_repository: Path = ROOT / "model_repository", ports: Ports | None = None,
                 env: dict | None = None, log_file=None) -> tuple:
    """Start tritonserver; return (process, ports) once it is ready."""
    ports = ports or Ports(free_port(), free_port(), free_port())
    proc = subprocess.Popen(server_command(model_repository, ports), env=server_env(env),
                            stdout=log_file or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_ready(ports, proc)
    except Exception:
        proc.kill()
        raise
    return proc, ports


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    ap.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    ap.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    ap.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    args = ap.parse_args(argv)
    ports = Ports(args.http_port, args.grpc_port, args.metrics_port)
    print(f"Starting Triton on 127.0.0.1 — HTTP {ports.http}, gRPC {ports.grpc}, metrics {ports.metrics}; "
          f"model 'llm'. Try:\n  curl -s -X POST 127.0.0.1:{ports.http}/v2/models/llm/generate "
          "-d '{\"text_input\": \"The capital of France is\", \"max_tokens\": 16}'", flush=True)
    cmd = server_command(args.model_repository, ports)
    os.execve(cmd[0], cmd, server_env())


if __name__ == "__main__":
    sys.exit(main())
