"""Starting the server from another process (the integration tests, benchmarks): the supervisor
as a child process on free ports, and waiting until it is ready."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .triton_command import EXIT_TIMEOUT_S, ROOT, Ports


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(ports: Ports, proc: subprocess.Popen, timeout_s: float = 180.0) -> None:
    wait_http_ok(f"http://127.0.0.1:{ports.http}/v2/health/ready", proc, timeout_s, "tritonserver")


def wait_http_ok(url: str, proc: subprocess.Popen, timeout_s: float, name: str) -> None:
    """Poll `url` until it answers 200 (a server that is loading answers otherwise or not at all);
    RuntimeError if `proc` exits first, TimeoutError after timeout_s."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with code {proc.returncode} before becoming ready")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{name} not ready after {timeout_s:.0f} s")


def launch_server(model_repository: Path = ROOT / "model_repository", ports: Ports | None = None,
                  env: dict | None = None, log_file=None) -> tuple:
    """Start the server (the supervisor + HTTP edge, Triton behind it) -> (process, ports) at once,
    not ready yet. proc.terminate() is a clean shutdown."""
    ports = ports or Ports(free_port(), free_port(), free_port())
    cmd = [sys.executable, "-m", __package__, f"--http-port={ports.http}", f"--grpc-port={ports.grpc}",
           f"--metrics-port={ports.metrics}", f"--model-repository={model_repository}"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, **(env or {})), cwd=ROOT,
                            stdout=log_file or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    return proc, ports


def start_server(model_repository: Path = ROOT / "model_repository", ports: Ports | None = None,
                 env: dict | None = None, log_file=None, ready_timeout_s: float = 180.0) -> tuple:
    """launch_server, returning once the server is ready (ready_timeout_s includes what it builds
    on demand first)."""
    proc, ports = launch_server(model_repository, ports, env, log_file)
    try:
        wait_ready(ports, proc, ready_timeout_s)
    except Exception:
        proc.terminate()
        try:
            proc.wait(EXIT_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    return proc, ports
