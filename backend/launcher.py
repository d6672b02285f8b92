"""Start the real Triton Inference Server (from the nvidia-pytriton wheel) on loopback.

    python -m backend.launcher [--http-port 8000 --grpc-port 8001 --metrics-port 8002]

Used by scripts/serve.sh and by the integration tests (`start_server`). This process stays
as the server's supervisor and HTTP edge (backend/edge.py): clients' HTTP reaches the edge on
--http-port, which enforces the body-size and nesting limits and forwards to Triton's own
HTTP on a private loopback port. gRPC and metrics are Triton's. Model control, the
repository index, shared-memory registration, logging and trace settings are restricted
(HTTP and gRPC) to requests carrying the header `specserve-admin-key: $SPECSERVE_ADMIN_KEY`
(a random key when unset: nobody). On SIGTERM / SIGINT the edge stops accepting, Triton gets
its exit timeout, and no Python-backend stub or /dev/shm region outlives it; leftovers of a
crashed predecessor are cleaned at start.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
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
    http: int = 8000  # what clients reach: the edge (backend/edge.py)
    grpc: int = 8001
    metrics: int = 8002
    triton_http: int = 0  # Triton's own HTTP behind the edge; 0 = Triton serves `http` itself (no edge)


ADMIN_HEADER = "specserve-admin-key"
RESTRICTED = "model-repository,shared-memory,logging,trace"  # Triton's API / protocol group names
EXIT_TIMEOUT_S = 10
STUB = "triton_python_backend_stub"
SHM_PREFIX = "triton_python_backend_shm_region_"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(model_repository: Path, ports: Ports, log_verbose: int = 0, admin_key: str | None = None) -> list:
    binary = TRITON / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    if not binary.exists():
        raise FileNotFoundError(f"{binary} missing: run scripts/setup.sh first")
    key = admin_key or os.environ.get("SPECSERVE_ADMIN_KEY") or secrets.token_urlsafe(24)
    return [str(binary), f"--model-repository={model_repository}", f"--backend-directory={TRITON / 'backends'}",
            "--http-address=127.0.0.1", f"--http-port={ports.triton_http or ports.http}",
            "--grpc-address=127.0.0.1", f"--grpc-port={ports.grpc}",
            "--metrics-address=127.0.0.1", f"--metrics-port={ports.metrics}",
            f"--http-restricted-api={RESTRICTED}:{ADMIN_HEADER}={key}",
            f"--grpc-restricted-protocol={RESTRICTED}:{ADMIN_HEADER}={key}",
            "--allow-gpu-metrics=false", "--allow-cpu-metrics=true", f"--log-verbose={log_verbose}",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}"]


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
    """Start the server (this module as supervisor + HTTP edge, Triton behind it); return
    (process, ports) once it is ready. proc.terminate() is a clean shutdown."""
    ports = ports or Ports(free_port(), free_port(), free_port())
    cmd = [sys.executable, "-m", "backend.launcher", f"--http-port={ports.http}", f"--grpc-port={ports.grpc}",
           f"--metrics-port={ports.metrics}", f"--model-repository={model_repository}"]
    proc = subprocess.Popen(cmd, env=dict(os.environ, **(env or {})), cwd=ROOT,
                            stdout=log_file or subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_ready(ports, proc)
    except Exception:
        proc.terminate()
        try:
            proc.wait(EXIT_TIMEOUT_S + 10)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    return proc, ports


# -- supervision -------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the supervisor dies, however it dies (Linux)."""
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stubs() -> list:
    """(pid, argv) of every Python-backend stub; argv: stub, model.py, shm region, sizes, tritonserver pid, ..."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == STUB and len(argv) > 5:
            out.append((int(d.name), [a.decode(errors="replace") for a in argv]))
    return out


def reap_stubs(server_pid: int | None = None, shm_dir: Path = Path("/dev/shm"), min_age_s: float = 60.0) -> int:
    """Kill the Python-backend stubs of `server_pid` and of any tritonserver that is gone (a stub
    ignores SIGTERM and outlives a crashed server), remove their shared-memory regions, and remove
    regions no live stub names that are older than `min_age_s` (a starting server's are newer).
    Other live servers' stubs are left alone. -> the number of stubs killed."""
    killed = 0
    for pid, argv in _stubs():
        try:
            parent = int(argv[5])
        except ValueError:
            continue
        if parent == server_pid or not _alive(parent):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
            (shm_dir / Path(argv[2]).name).unlink(missing_ok=True)
    named = {Path(argv[2]).name for pid, argv in _stubs() if _alive(pid)}
    for region in shm_dir.glob(SHM_PREFIX + "*"):
        try:
            if region.name not in named and time.time() - region.stat().st_mtime > min_age_s:
                region.unlink()
        except OSError:
            pass
    return killed


def supervise(cmd: list, ports: Ports, max_body_bytes: int, max_depth: int) -> int:
    """Run Triton (`cmd`) and the HTTP edge until a signal or Triton's exit; clean up after both."""
    from . import edge

    proc = subprocess.Popen(cmd, env=server_env(), preexec_fn=_die_with_parent)

    async def run() -> int:
        stop, loop, got = asyncio.Event(), asyncio.get_running_loop(), []
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda s=sig: (got.append(s), stop.set()))

        async def watch() -> None:
            while proc.poll() is None and not stop.is_set():
                await asyncio.sleep(0.2)
            stop.set()

        watcher = asyncio.create_task(watch())
        edge_task = asyncio.create_task(edge.serve(
            "127.0.0.1", ports.http, f"http://127.0.0.1:{ports.triton_http}", stop,
            shutdown_timeout=EXIT_TIMEOUT_S + 2, max_body_bytes=max_body_bytes, max_depth=max_depth,
            grpc_upstream=f"127.0.0.1:{ports.grpc}"))
        done, _ = await asyncio.wait({edge_task, asyncio.create_task(stop.wait())},
                                     return_when=asyncio.FIRST_COMPLETED)
        if edge_task in done and edge_task.exception() is not None:
            print(f"the HTTP edge could not serve port {ports.http}: {edge_task.exception()}", flush=True)
        stop.set()
        if proc.poll() is None:  # Triton drains in flight for its exit timeout while the edge closes
            proc.send_signal(signal.SIGTERM)
        try:
            await loop.run_in_executor(None, proc.wait, EXIT_TIMEOUT_S + 5)
        except subprocess.TimeoutExpired:
            print("tritonserver did not exit in time: killing it", flush=True)
            proc.kill()
            await loop.run_in_executor(None, proc.wait)
        if not edge_task.done():
            await asyncio.wait({edge_task}, timeout=EXIT_TIMEOUT_S + 5)
        watcher.cancel()
        if got:  # asked to stop: a clean stop is success whatever Triton's own code
            return 0 if edge_task.done() and not edge_task.cancelled() and edge_task.exception() is None else 1
        print(f"tritonserver exited with code {proc.returncode}", flush=True)
        return proc.returncode if proc.returncode and proc.returncode > 0 else 1

    try:
        return asyncio.run(run())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if reap_stubs(proc.pid):
            print("killed the Python-backend stub tritonserver left behind", flush=True)


def main(argv=None) -> int:
    from .edge import MAX_BODY_BYTES, MAX_DEPTH

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    ap.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    ap.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    ap.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    ap.add_argument("--max-body-bytes", type=int, default=int(os.environ.get("SPECSERVE_MAX_BODY_BYTES") or MAX_BODY_BYTES),
                    help="largest HTTP request body (413 beyond)")
    ap.add_argument("--max-json-depth", type=int, default=int(os.environ.get("SPECSERVE_MAX_JSON_DEPTH") or MAX_DEPTH),
                    help="deepest JSON nesting in an HTTP request (400 beyond)")
    args = ap.parse_args(argv)
    if reap_stubs():
        print("killed Python-backend stubs a crashed server left behind", flush=True)
    ports = Ports(args.http_port, args.grpc_port, args.metrics_port, triton_http=free_port())
    print(f"Starting Triton on 127.0.0.1 — HTTP {ports.http}, gRPC {ports.grpc}, metrics {ports.metrics}; "
          f"model 'llm' (also 'ensemble', 'tensorrt_llm_bls'; unary 'llm_unary'); OpenAI API at "
          f"http://127.0.0.1:{ports.http}/v1. Try:\n  curl -s -X POST 127.0.0.1:{ports.http}/v2/models/llm/generate "
          "-d '{\"text_input\": \"The capital of France is\", \"max_tokens\": 16}'", flush=True)
    return supervise(server_command(args.model_repository, ports), ports, args.max_body_bytes, args.max_json_depth)


if __name__ == "__main__":
    sys.exit(main())
