"""What Triton must know and no other local user may read: the per-start keys of its HTTP APIs
and the Unix socket its HTTP listens on, in a directory only this user can enter.

Triton 2.51 takes them only as arguments, and every local user can read a process's command line
(/proc/<pid>/cmdline) but only its own user its environment. So Triton's command line carries
placeholders (`placeholder`), their values travel in its environment (`server_secrets`), and a
small preloaded library (argv_env.c, built here) puts them into its arguments before main() runs;
it also ties Triton's life to the supervisor's (SPECSERVE_PARENT_PID). Without a C compiler the
values go on the command line (`fill_placeholders`), with a warning.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import secrets
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import LaunchError

ARG_PREFIX = "SPECSERVE_ARG_"  # argv_env.c replaces @SPECSERVE_ARG_<NAME>@ in Triton's arguments
UNIX_PATH_MAX = 107  # sun_path's 108 bytes, less the terminating NUL


def placeholder(name: str) -> str:
    """What stands in Triton's arguments for the secret `name` (argv_env.c fills it in)."""
    return f"@{ARG_PREFIX}{name}@"


@dataclass
class UpstreamKeys:
    """Per-start keys of Triton's HTTP APIs, both added by the edge: `admin` (restricted APIs) for a
    client that sent SPECSERVE_ADMIN_KEY, `internal` (the others) to everything it forwards."""
    admin: str
    internal: str

    @classmethod
    def fresh(cls) -> "UpstreamKeys":
        return cls(secrets.token_urlsafe(24), secrets.token_urlsafe(24))


def server_secrets(http_socket: Path, keys: UpstreamKeys) -> dict:
    """The values of server_command's placeholders, as environment variables."""
    return {f"{ARG_PREFIX}HTTP_SOCKET": str(http_socket), f"{ARG_PREFIX}ADMIN_KEY": keys.admin,
            f"{ARG_PREFIX}INTERNAL_KEY": keys.internal}


def private_socket_path(directory: Path) -> Path:
    """Where Triton's HTTP listens: in `directory`, which only this user can enter."""
    path = directory / "triton-http.sock"
    if len(str(path).encode()) > UNIX_PATH_MAX:
        raise LaunchError(f"{path} is too long for a Unix socket ({UNIX_PATH_MAX} bytes at most): set TMPDIR shorter")
    return path


def unix_http(socket_path: Path, method: str, path: str, body=None, headers: dict | None = None,
              timeout_s: float = 2.0) -> tuple:
    """(status, body) of one request to the HTTP server listening on the Unix socket `socket_path`
    (OSError if it cannot be reached)."""
    conn = http.client.HTTPConnection("triton", timeout=timeout_s)
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.sock.settimeout(timeout_s)
        conn.sock.connect(str(socket_path))
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def argv_env_library(directory: Path) -> Path | None:
    """argv_env.c built into `directory` (a C compiler is there wherever set-up built llama.cpp),
    once per version of its source (the name carries its hash), or None if it cannot be built."""
    source = Path(__file__).with_name("argv_env.c")
    out = directory / f"argv_env-{hashlib.sha256(source.read_bytes()).hexdigest()[:16]}.so"
    if out.exists():
        return out
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if cc is None:
        return None
    try:
        directory.mkdir(parents=True, exist_ok=True)
        building = directory / f".{out.name}.{os.getpid()}"
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(building), str(source)],
                       check=True, capture_output=True, timeout=60)
        building.replace(out)  # atomic: a supervisor starting beside this one never loads half a file
    except (OSError, subprocess.SubprocessError):
        return None
    return out


def fill_placeholders(cmd: list, values: dict) -> list:
    """What argv_env.c does, for when it cannot be built."""
    for name, value in values.items():
        cmd = [a.replace(f"@{name}@", value) for a in cmd]
    return cmd
