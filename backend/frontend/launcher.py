"""Start the real Triton Inference Server (from the nvidia-pytriton wheel) on loopback.

    python -m backend.frontend.launcher [--http-port 8000 --grpc-port 8001 --metrics-port 8002]

Used by scripts/serve.sh and by the integration tests (`start_server`). This process stays
as the server's supervisor and HTTP edge (backend/frontend/edge/): clients' HTTP reaches the edge on
--http-port, which enforces the body-size and nesting limits and forwards to Triton's own
HTTP on a Unix socket in this process's private directory (mode 0700: no other local user can
connect to it). gRPC and metrics are Triton's. Model control, the
repository index, shared-memory registration, logging and trace settings are restricted
over HTTP to requests carrying the header `specserve-admin-key: $SPECSERVE_ADMIN_KEY` (checked
by the edge, which passes Triton a per-start internal key instead; unset: nobody) and closed on
gRPC, so the admin key is on no command line. Every other HTTP API of Triton needs a second
per-start key (`specserve-internal-key`), which the edge adds to what it forwards: a process of
this same user that finds Triton's socket gets 403. Neither key nor that socket is on Triton's command line
(readable by every local user in /proc): they reach it in the environment, through a small
preloaded library (argv_env.c). The edge marks requests whose HTTP client left in
SPECSERVE_CANCEL_DIR (a directory of this process's, removed at exit), which the model polls.

Lifecycle. On SIGTERM / SIGINT shutdown begins: the edge answers 503 to every new request
(readiness too), the model refuses new gRPC requests with UNAVAILABLE ("server shutting down";
it reads the drain file this process writes, SPECSERVE_DRAIN_FILE), in-flight requests get
SPECSERVE_DRAIN_SECONDS (10) to finish and are then failed with a final error, and only then is
Triton stopped (its exit timeout, 10 s); the process exits 0 and leaves no Python-backend stub
or /dev/shm region. A second signal skips the drain. If Triton dies, it is restarted after 1, 2,
4, ... 30 s (the delay grows with the deaths of the last 10 minutes), its stub and shared memory
removed first, for as long as it takes: meanwhile the edge answers 503 with Retry-After
(SPECSERVE_MAX_RESTARTS = n > 0: exit 1 after n restarts within 10 minutes instead, for an
orchestrator that restarts the container). Leftovers of a crashed predecessor (a tritonserver on our
ports whose launcher is gone, stubs, /dev/shm regions) are cleaned at start.

Triton is watched in every state (backend/frontend/triton_watch.py): while it loads, a
Python-backend stub that dies (Triton 2.51 would wait for it forever) or a start that passes its
deadline (SPECSERVE_START_TIMEOUT_S; by default 4x the slowest load this launcher measured, at
least 60 s, 600 s for the first) restarts it; once ready, a stub that dies does. Triton is
started with no Python code run in the child (`spawn`: this process holds gRPC client threads,
whose fork handlers can abort a forked child) and dies with this process (argv_env.c).
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import http.client
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..served import SERVED_ENV, from_repository, served_needs, write
from ..server_config import ServerConfig, unknown_env
from ..wire import ADMIN_HEADER, INTERNAL_HEADER, REQUEST_ID_HEADER
from .triton_watch import StartDeadlines, Stub, TritonWatch

ROOT = Path(__file__).resolve().parents[2]
TRITON = ROOT / ".cache" / "triton"
ARGV_ENV_DIR = ROOT / ".cache" / "argv_env"  # argv_env.c built once per version of it


@dataclass
class Ports:
    http: int = 8000  # what clients reach: the edge (backend/frontend/edge/)
    grpc: int = 8001
    metrics: int = 8002


RESTRICTED = "model-repository,shared-memory,logging,trace"  # Triton's API / protocol group names
# gRPC metadata values are printable ASCII: a key with a control character can never be sent, so
# Triton's restricted gRPC protocols are closed to everyone (admins use HTTP through the edge).
UNSENDABLE_KEY = "\x01closed"
EXIT_TIMEOUT_S = 10  # Triton's own (--exit-timeout-secs); it aborts when that expires, so we never let it:
TRITON_STOP_S = 5  # after the drain, Triton's time to exit before it is killed (an open client gRPC
# stream keeps Triton from unloading the model even with nothing in flight)
DRAIN_S = float(os.environ.get("SPECSERVE_DRAIN_SECONDS") or 10)  # in-flight requests' time to finish
MAX_RESTARTS = int(os.environ.get("SPECSERVE_MAX_RESTARTS") or 0)  # >0: give up after that many within the window
RESTART_WINDOW_S = 600.0
RESTART_BACKOFF_MAX_S = 30
UNIX_PATH_MAX = 107  # sun_path's 108 bytes, less the terminating NUL
STUB = "triton_python_backend_stub"
SHM_PREFIX = "triton_python_backend_shm_region_"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Triton's other HTTP API groups: open to requests carrying the internal key (the edge's)
INTERNAL = "health,metadata,inference,model-config,statistics"
ARG_PREFIX = "SPECSERVE_ARG_"  # argv_env.c replaces @SPECSERVE_ARG_<NAME>@ in Triton's arguments


def _arg(name: str) -> str:
    return f"@{ARG_PREFIX}{name}@"


def server_command(model_repository: Path, ports: Ports, log_verbose: int = 0, bind: str = "127.0.0.1") -> list:
    """Triton's command line. Its HTTP listens on a Unix socket in the supervisor's own directory
    (mode 0700): the edge reaches it, no other local user can (Triton 2.51 dies on some 4 MiB
    bodies before any key is checked). gRPC and metrics listen on `bind`. This line is readable in
    /proc by every local user: the socket's path and the keys of its HTTP APIs are placeholders
    filled in from the environment (server_secrets, argv_env.c)."""
    binary = TRITON / "pytriton" / "tritonserver" / "bin" / "tritonserver"
    if not binary.exists():
        raise FileNotFoundError(f"{binary} missing: run scripts/setup.sh first")
    return [str(binary), f"--model-repository={model_repository}", f"--backend-directory={TRITON / 'backends'}",
            f"--http-address=unix:{_arg('HTTP_SOCKET')}", "--http-port=0",  # libevhtp binds "unix:<path>"
            f"--grpc-address={bind}", f"--grpc-port={ports.grpc}",
            f"--metrics-address={bind}", f"--metrics-port={ports.metrics}",
            f"--http-restricted-api={RESTRICTED}:{ADMIN_HEADER}={_arg('ADMIN_KEY')}",
            f"--http-restricted-api={INTERNAL}:{INTERNAL_HEADER}={_arg('INTERNAL_KEY')}",
            f"--grpc-restricted-protocol={RESTRICTED}:{ADMIN_HEADER}={UNSENDABLE_KEY}",
            # the edge's request id reaches the model as a request parameter (/infer only in Triton 2.51)
            f"--http-header-forward-pattern=^{REQUEST_ID_HEADER}$",
            "--allow-gpu-metrics=false", "--allow-cpu-metrics=true", f"--log-verbose={log_verbose}",
            f"--exit-timeout-secs={EXIT_TIMEOUT_S}"]


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
        raise ValueError(f"{path} is too long for a Unix socket ({UNIX_PATH_MAX} bytes at most): set TMPDIR shorter")
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
        building.replace(out)  # atomic: a launcher starting beside this one never loads half a file
    except (OSError, subprocess.SubprocessError):
        return None
    return out


def fill_placeholders(cmd: list, values: dict) -> list:
    """What argv_env.c does, for when it cannot be built."""
    for name, value in values.items():
        cmd = [a.replace(f"@{name}@", value) for a in cmd]
    return cmd


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
    """Start the server (this module as supervisor + HTTP edge, Triton behind it) -> (process,
    ports) at once, not ready yet. proc.terminate() is a clean shutdown."""
    ports = ports or Ports(free_port(), free_port(), free_port())
    cmd = [sys.executable, "-m", "backend.frontend.launcher", f"--http-port={ports.http}", f"--grpc-port={ports.grpc}",
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


# -- supervision -------------------------------------------------------------------------------
def spawn(cmd: list, env: dict) -> subprocess.Popen:
    """Start `cmd` with no Python code run in the child: without a preexec_fn CPython's subprocess
    starts it by vfork + exec, which runs no fork handlers. This process holds gRPC client threads
    (the OpenAI layer's), and running Python or gRPC's fork handlers in a forked copy of it can
    abort the child (gRPC: "Other threads are currently calling into gRPC, skipping fork()
    handlers"). In a process group of its own: a terminal's Ctrl-C reaches only this supervisor,
    which drains first. That it dies with this process is argv_env.c's (SPECSERVE_PARENT_PID)."""
    return subprocess.Popen(cmd, env=env, process_group=0, close_fds=True)


def _state(pid: int) -> str | None:
    """The process's state letter (R, S, Z for a zombie, ...), None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    return _state(pid) not in (None, "Z")


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


def _zombie_stubs(server_pid: int) -> list:
    """Pids of `server_pid`'s Python-backend stubs that died and it has not reaped. A zombie has no
    command line any more (_stubs cannot see it): its name (15 characters) and parent tell."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            comm, rest = (d / "stat").read_text().split(" (", 1)[1].rsplit(") ", 1)
        except (OSError, ValueError, IndexError):
            continue
        fields = rest.split()
        if comm == STUB[:15] and fields[0] == "Z" and fields[1] == str(server_pid):
            out.append(int(d.name))
    return out


def reap_stubs(server_pid: int | None = None, shm_dir: Path = Path("/dev/shm"), min_age_s: float = 60.0) -> int:
    """Kill the Python-backend stubs of `server_pid` and of any tritonserver that is gone (a stub
    ignores SIGTERM and outlives a crashed server), remove their shared-memory regions, and remove
    regions no live stub names that are older than `min_age_s` (a starting server's are newer).
    Other live servers' stubs are left alone. -> the number of stubs killed."""
    killed, pids = 0, []
    for pid, argv in _stubs():
        try:
            parent = int(argv[5])
        except ValueError:
            continue
        if parent == server_pid or not _alive(parent):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
                pids.append(pid)
            except ProcessLookupError:
                pass
            (shm_dir / Path(argv[2]).name).unlink(missing_ok=True)
    deadline = time.monotonic() + 3.0
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    named = {Path(argv[2]).name for pid, argv in _stubs() if _alive(pid)}
    mapped, complete = _mapped_regions()
    for region in shm_dir.glob(SHM_PREFIX + "*"):
        try:
            age = time.time() - region.stat().st_mtime
            # mapped by no process at all: stale once older than a starting server's creation race
            if region.name not in named and region.name not in mapped and age > (2.0 if complete else min_age_s):
                region.unlink()
        except OSError:
            pass
    return killed


def _mapped_regions() -> tuple:
    """({shm region names some live process maps}, whether every process's maps could be read)."""
    mapped, complete = set(), True
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            text = (d / "maps").read_text(errors="replace")
        except FileNotFoundError:
            continue
        except OSError:  # another user's process: only Triton's own map these regions
            try:
                complete = complete and (d / "comm").read_text().strip() not in ("tritonserver", STUB[:15])
            except OSError:
                pass
            continue
        if SHM_PREFIX in text:
            mapped.update(Path(line.split()[-1]).name for line in text.splitlines() if SHM_PREFIX in line)
    return mapped, complete


def _proc_argv(pid: int) -> list:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def stop_orphan_servers(ports: Ports, timeout_s: float = TRITON_STOP_S) -> int:
    """A tritonserver whose launcher was killed (SIGKILL: no cleanup ran) keeps our gRPC or
    metrics port while it shuts down (it got SIGTERM from PR_SET_PDEATHSIG). Stop those that use
    one of `ports` and whose parent is no launcher: SIGTERM, then SIGKILL after `timeout_s`.
    -> how many were found."""
    flags = {f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}"}
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        argv = _proc_argv(int(d.name))
        if argv and Path(argv[0]).name == "tritonserver" and flags & set(argv) and \
                "backend.frontend.launcher" not in _proc_argv(_ppid(int(d.name))):
            found.append(int(d.name))
    for pid in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in found:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return len(found)


def _signal_name(code: int) -> str:
    try:
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
    except ValueError:
        return f"code {code}"


class Supervisor:
    """Runs Triton (`cmd`) behind the HTTP edge; restarts Triton when it dies (bounded, with
    backoff); on SIGTERM / SIGINT drains and stops both (module docstring)."""

    def __init__(self, cmd: list, served: ServerConfig, ports: Ports, max_body_bytes: int, max_depth: int, admin_key: str | None = None,
                 bind: str = "127.0.0.1", drain_s: float = DRAIN_S, max_restarts: int = MAX_RESTARTS,
                 restart_window_s: float = RESTART_WINDOW_S, read_timeout_s: float | None = None,
                 start_timeout_s: float | None = None):
        self.cmd, self.ports, self.bind = cmd, ports, bind
        self.limits = dict(max_body_bytes=max_body_bytes, max_depth=max_depth)
        if read_timeout_s:
            self.limits["read_timeout_s"] = read_timeout_s
        self.admin_key, self.keys = admin_key, UpstreamKeys.fresh()
        self.drain_s, self.max_restarts, self.restart_window_s = drain_s, max_restarts, restart_window_s
        self.deadlines = StartDeadlines(start_timeout_s)  # each start's time to become ready
        self.workdir = Path(tempfile.mkdtemp(prefix="specserve-"))
        self.drain_file = self.workdir / "drain"
        # The edge marks requests whose HTTP client left here; the model polls the marks (backend/frontend/edge/cancel_marks.py). Removed with the workdir at exit.
        self.cancel_dir = self.workdir / "cancelled"
        self.cancel_dir.mkdir()
        self.refusals_file = self.workdir / "edge_refusals.json"  # the edge's counts, read by the model's metrics
        self.served = served  # what every model, the edge and the OpenAI API serve (backend/served.py)
        self.env = server_env({SERVED_ENV: str(write(served, self.workdir / "served.json")),
                               "SPECSERVE_DRAIN_FILE": str(self.drain_file),
                               "SPECSERVE_CANCEL_DIR": str(self.cancel_dir),
                               "SPECSERVE_EDGE_REFUSALS": str(self.refusals_file)})
        self.env.pop("SPECSERVE_ADMIN_KEY", None)  # Triton needs none of it
        self.http_socket = private_socket_path(self.workdir)  # mkdtemp: mode 0700
        values = server_secrets(self.http_socket, self.keys)
        library = argv_env_library(ARGV_ENV_DIR) or argv_env_library(self.workdir)  # .cache read-only: build here
        if library is None:
            print("warning: no C compiler to build backend/frontend/argv_env.c: Triton's private HTTP port and "
                  "its API keys are on its command line, readable by every local user, and a tritonserver "
                  "outlives a killed launcher until the next start stops it", flush=True)
            self.cmd = fill_placeholders(self.cmd, values)
        else:
            self.env.update(values, SPECSERVE_PARENT_PID=str(os.getpid()),
                            LD_PRELOAD=" ".join(filter(None, [str(library), self.env.get("LD_PRELOAD")])))
        self.proc: subprocess.Popen | None = None
        self.restarts: list = []  # monotonic times of restarts within the window
        self.regions: set = set()  # shared-memory regions of the running Triton's stubs

    def _start(self) -> subprocess.Popen:
        # From the main thread: PR_SET_PDEATHSIG (argv_env.c) follows the thread that started it
        self.http_socket.unlink(missing_ok=True)  # a dead Triton's socket: Triton would not bind over it
        self.proc = spawn(self.cmd, self.env)
        return self.proc

    def _restart_delay(self) -> float | None:
        """Seconds to wait before the next restart (1, 2, 4 ... 30 by the restarts within the
        window), or None when max_restarts (> 0) are spent. A crash loop (say a local client
        killing Triton again and again) thus slows down but never ends the service: the edge
        answers 503 with Retry-After meanwhile."""
        now = time.monotonic()
        self.restarts = [t for t in self.restarts if now - t < self.restart_window_s]
        if self.max_restarts > 0 and len(self.restarts) >= self.max_restarts:
            return None
        self.restarts.append(now)
        return float(min(RESTART_BACKOFF_MAX_S, 2 ** (len(self.restarts) - 1)))

    def _ready(self) -> bool:
        try:
            return unix_http(self.http_socket, "GET", "/v2/health/ready",
                             headers={INTERNAL_HEADER: self.keys.internal})[0] == 200
        except OSError:
            return False

    def _stub_models(self) -> set:
        """The models of the repository Triton serves that run in a Python-backend stub."""
        repo = next((Path(a.split("=", 1)[1]) for a in self.cmd if a.startswith("--model-repository=")), None)
        if repo is None:
            return set()
        return {c.parent.name for c in repo.glob("*/config.pbtxt")
                if re.search(r'^\s*backend:\s*"python"', c.read_text(), re.M)}

    async def _watch(self, stop: asyncio.Event, edge_task) -> str | None:
        """Until a stop signal, the edge failing, Triton's exit or a reason to restart it while it
        loads or serves (a stub that died, a start past its deadline: backend/frontend/triton_watch.py):
        -> that reason, or None."""
        loop, next_check = asyncio.get_running_loop(), 0.0
        watch = TritonWatch(self._stub_models(), self.deadlines.next())
        while not stop.is_set() and self.proc.poll() is None and not edge_task.done():
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
                break
            except asyncio.TimeoutError:
                pass
            if time.monotonic() < next_check:
                continue
            next_check = time.monotonic() + 0.5
            mine = [(pid, argv) for pid, argv in _stubs() if argv[5] == str(self.proc.pid) and _alive(pid)]
            self.regions.update(Path(argv[2]).name for _, argv in mine)  # removed when this server is gone
            loading = watch.ready_after is None
            ready = not loading or await loop.run_in_executor(None, self._ready)
            stubs = [Stub.from_argv(pid, argv, False) for pid, argv in mine]
            reason = watch.check(ready, stubs + [Stub(pid, None, True) for pid in _zombie_stubs(self.proc.pid)])
            if loading and watch.ready_after is not None:
                self.deadlines.loaded(watch.ready_after)
                print(f"tritonserver is ready ({watch.ready_after:.1f} s after it started)", flush=True)
            if reason is not None and self.proc.poll() is None and not stop.is_set():
                if watch.deadline_missed:
                    self.deadlines.missed()
                return reason
        return None

    async def _drain(self, hurry: asyncio.Event) -> None:
        """New work refused everywhere (edge: 503; model: UNAVAILABLE), in flight given drain_s."""
        done = self.drain_file.with_name(self.drain_file.name + ".done")
        self.drain_file.write_text(f"{self.drain_s}\n")
        deadline = time.monotonic() + self.drain_s + 2.0  # the model fails what is left at drain_s
        while not done.exists() and self.proc.poll() is None and not hurry.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        print(f"drained in {self.drain_s - max(0.0, deadline - 2.0 - time.monotonic()):.1f} s" if done.exists()
              else "drain time is up", flush=True)

    async def run(self) -> int:
        from .edge import proxy as edge

        loop = asyncio.get_running_loop()
        stop, hurry, draining, edge_stop, got = (asyncio.Event(), asyncio.Event(), asyncio.Event(),
                                                 asyncio.Event(), [])

        def on_signal(sig) -> None:
            (hurry if got else stop).set()  # a second signal: stop without waiting for the drain
            got.append(sig)

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        self._start()
        edge_task = asyncio.create_task(edge.serve(
            self.bind, self.ports.http, f"unix:{self.http_socket}", edge_stop,
            shutdown_timeout=EXIT_TIMEOUT_S + 2, grpc_upstream=f"127.0.0.1:{self.ports.grpc}", draining=draining,
            admin_key=self.admin_key, upstream_admin_key=self.keys.admin, internal_key=self.keys.internal,
            cancel_dir=str(self.cancel_dir), refusals_file=str(self.refusals_file), served=self.served,
            **self.limits))
        failed = False
        while True:
            reason = await self._watch(stop, edge_task)
            if stop.is_set():
                break
            if edge_task.done():
                print(f"the HTTP edge could not serve port {self.ports.http}: {edge_task.exception()}", flush=True)
                failed = True
                break
            pid = self.proc.pid
            if reason is not None:  # Triton lives on: unhealthy, or hung while loading
                print(f"{reason}: restarting tritonserver", flush=True)
                self.proc.kill()
                self.proc.wait()
            else:
                print(f"tritonserver (pid {pid}) died unexpectedly ({_signal_name(self.proc.returncode)})", flush=True)
            if reap_stubs(pid):
                print("killed the Python-backend stub it left behind", flush=True)
            for region in self.regions:  # a dead stub's region: no live process names it any more
                (Path("/dev/shm") / region).unlink(missing_ok=True)
            self.regions.clear()
            delay = self._restart_delay()
            if delay is None:
                print(f"tritonserver died {self.max_restarts + 1} times within {self.restart_window_s:.0f} s: "
                      "giving up", flush=True)
                failed = True
                break
            print(f"restarting tritonserver in {delay:.0f} s (restart {len(self.restarts)} within "
                  f"{self.restart_window_s:.0f} s)", flush=True)
            try:
                await asyncio.wait_for(stop.wait(), delay)
                break
            except asyncio.TimeoutError:
                pass
            self._start()
        if stop.is_set():
            draining.set()
            if self.proc.poll() is None:
                await self._drain(hurry)
        # The edge first: Triton waits for open HTTP connections (the edge's keep-alive ones).
        edge_stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(edge_task), EXIT_TIMEOUT_S + 2)
        except (asyncio.TimeoutError, Exception):
            pass
        if self.proc.poll() is None:  # nothing in flight now: Triton unloads and exits
            self.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + TRITON_STOP_S
        while self.proc.poll() is None and time.monotonic() < deadline and len(got) < 3:
            await asyncio.sleep(0.1)
        if self.proc.poll() is None:  # nothing in flight any more (drained): killing loses no work
            print(f"tritonserver did not exit within {TRITON_STOP_S} s (open client gRPC streams hold the model): "
                  "killing it", flush=True)
            self.proc.kill()
            self.proc.wait()
        elif self.proc.returncode and got:
            print(f"tritonserver exited with {_signal_name(self.proc.returncode)}", flush=True)
        if failed:
            return 1
        return 0 if edge_task.done() and not edge_task.cancelled() and edge_task.exception() is None else 1

    def __call__(self) -> int:
        try:
            return asyncio.run(self.run())
        finally:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc is not None and reap_stubs(self.proc.pid):
                print("killed the Python-backend stub tritonserver left behind", flush=True)
            shutil.rmtree(self.workdir, ignore_errors=True)


def build_what_is_served(served: ServerConfig, model_repository: Path) -> None:
    """Before Triton starts: build what the served config names and set-up left out (model
    drafters, the served engine's profile), with progress (build_engines/on_demand.py), in a
    process of its own (this one stays free of torch). SPECSERVE_BUILD_ON_DEMAND=0 skips it; the
    model then refuses a drafter that is not built with an error naming the command that builds
    it."""
    if os.environ.get("SPECSERVE_BUILD_ON_DEMAND", "1") == "0":
        return
    drafters, profiles = served_needs(served, ROOT)
    if drafters or profiles:
        print(f"the served config names what is not built yet ({', '.join(drafters + [p.name for _, p in profiles])}): "
              "building it before serving", flush=True)
        subprocess.run([sys.executable, "-m", "build_engines.on_demand", "served",
                        f"--model-repository={model_repository}"], cwd=ROOT, check=True)


def main(argv=None) -> int:
    from .edge.proxy import MAX_BODY_BYTES, MAX_DEPTH, READ_TIMEOUT_S

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--http-port", type=int, default=int(os.environ.get("HTTP_PORT", 8000)))
    ap.add_argument("--grpc-port", type=int, default=int(os.environ.get("GRPC_PORT", 8001)))
    ap.add_argument("--metrics-port", type=int, default=int(os.environ.get("METRICS_PORT", 8002)))
    ap.add_argument("--model-repository", type=Path, default=ROOT / "model_repository")
    ap.add_argument("--bind-address", default=os.environ.get("SPECSERVE_BIND_ADDRESS") or "127.0.0.1",
                    help="address the HTTP edge, gRPC and metrics listen on (Triton's own HTTP stays on loopback)")
    ap.add_argument("--max-body-bytes", type=int, default=int(os.environ.get("SPECSERVE_MAX_BODY_BYTES") or MAX_BODY_BYTES),
                    help="largest HTTP request body (413 beyond)")
    ap.add_argument("--http-read-timeout", type=float,
                    default=float(os.environ.get("SPECSERVE_HTTP_READ_TIMEOUT_S") or READ_TIMEOUT_S),
                    help="seconds a client has to send a request's headers, and again its body (idle "
                         "keep-alive connections close after as long)")
    ap.add_argument("--max-json-depth", type=int, default=int(os.environ.get("SPECSERVE_MAX_JSON_DEPTH") or MAX_DEPTH),
                    help="deepest JSON nesting in an HTTP request (400 beyond)")
    ap.add_argument("--start-timeout", type=float, default=float(os.environ.get("SPECSERVE_START_TIMEOUT_S") or 0),
                    help="seconds a starting Triton has to become ready before it is restarted (0: 4x the slowest "
                         "load measured, at least 60 s; 600 s for the first)")
    args = ap.parse_args(argv)
    for message in unknown_env():  # a misspelt setting would otherwise be silently ignored
        print(message, flush=True)
    try:  # the one reading of the served configuration: Triton's models, the edge and the OpenAI API get it
        served = from_repository(args.model_repository)
    except Exception as e:  # noqa: BLE001 - unreadable or wrong: refused before anything starts, not when Triton loads it
        print(f"the served configuration ({args.model_repository / 'llm' / 'config.pbtxt'} and SPECSERVE_*) "
              f"cannot be served: {e}", file=sys.stderr, flush=True)
        return 2
    build_what_is_served(served, args.model_repository)
    ports = Ports(args.http_port, args.grpc_port, args.metrics_port)
    if stop_orphan_servers(ports):
        print("stopped a tritonserver a killed launcher left on these ports", flush=True)
    if reap_stubs():
        print("killed Python-backend stubs a crashed server left behind", flush=True)
    print(f"Starting Triton on {args.bind_address} — HTTP {ports.http}, gRPC {ports.grpc}, metrics {ports.metrics}; "
          f"model 'llm' (also 'ensemble', 'tensorrt_llm_bls'; unary 'llm_unary'; token-level 'tensorrt_llm'); OpenAI API at "
          f"http://127.0.0.1:{ports.http}/v1. Try:\n  curl -s -X POST 127.0.0.1:{ports.http}/v2/models/llm/generate "
          "-d '{\"text_input\": \"The capital of France is\", \"max_tokens\": 16}'", flush=True)
    return Supervisor(server_command(args.model_repository, ports, bind=args.bind_address), served,
                      ports, args.max_body_bytes, args.max_json_depth, admin_key=os.environ.get("SPECSERVE_ADMIN_KEY"),
                      bind=args.bind_address, read_timeout_s=args.http_read_timeout,
                      start_timeout_s=args.start_timeout)()


if __name__ == "__main__":
    sys.exit(main())
