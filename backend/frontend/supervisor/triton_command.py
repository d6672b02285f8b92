"""Triton's command line and environment: where the installed server is, which ports it listens on,
which of its APIs are restricted to which key. The keys and the private socket are placeholders
here (server_secrets.py fills them in out of sight)."""
from __future__ import annotations

import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from ...wire import ADMIN_HEADER, INTERNAL_HEADER, REQUEST_ID_HEADER
from .errors import LaunchError
from .server_secrets import placeholder

ROOT = Path(__file__).resolve().parents[3]
TRITON = ROOT / ".cache" / "triton"
ARGV_ENV_DIR = ROOT / ".cache" / "argv_env"  # argv_env.c built once per version of it


@dataclass
class Ports:
    http: int = 8000  # what clients reach: the edge (backend/frontend/edge/)
    grpc: int = 8001
    metrics: int = 8002


RESTRICTED = "model-repository,shared-memory,logging,trace"  # Triton's API / protocol group names
# Triton's other HTTP API groups: open to requests carrying the internal key (the edge's)
INTERNAL = "health,metadata,inference,model-config,statistics"
# gRPC metadata values are printable ASCII: a key with a control character can never be sent, so
# Triton's restricted gRPC protocols are closed to everyone (admins use HTTP through the edge).
UNSENDABLE_KEY = "\x01closed"
EXIT_TIMEOUT_S = 10  # Triton's own (--exit-timeout-secs); it aborts when that expires, so we never let it


def server_command(model_repository: Path, ports: Ports, log_verbose: int = 0, bind: str = "127.0.0.1") -> list:
    """Triton's command line. Its HTTP listens on a Unix socket in the supervisor's own directory
    (mode 0700): the edge reaches it, no other local user can (Triton 2.51 dies on some 4 MiB
    bodies before any key is checked). gRPC and metrics listen on `bind`. This line is readable in
    /proc by every local user: the socket's path and the keys of its HTTP APIs are placeholders
    filled in from the environment (server_secrets.py, argv_env.c)."""
    binary = TRITON / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    if not binary.exists():
        raise LaunchError(f"{binary} missing: run scripts/setup.sh first")
    return [str(binary), f"--model-repository={model_repository}", f"--backend-directory={TRITON / 'backends'}",
            f"--http-address=unix:{placeholder('HTTP_SOCKET')}", "--http-port=0",  # libevhtp binds "unix:<path>"
            f"--grpc-address={bind}", f"--grpc-port={ports.grpc}",
            f"--metrics-address={bind}", f"--metrics-port={ports.metrics}",
            f"--http-restricted-api={RESTRICTED}:{ADMIN_HEADER}={placeholder('ADMIN_KEY')}",
            f"--http-restricted-api={INTERNAL}:{INTERNAL_HEADER}={placeholder('INTERNAL_KEY')}",
            f"--grpc-restricted-protocol={RESTRICTED}:{ADMIN_HEADER}={UNSENDABLE_KEY}",
            # the edge's request id reaches the model as a request parameter (/infer only in Triton 2.51)
            f"--http-header-forward-pattern=^{REQUEST_ID_HEADER}$",
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
