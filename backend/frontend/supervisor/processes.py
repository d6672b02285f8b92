"""Processes as the supervisor sees them through /proc: starting Triton with no Python code run
in the child, whether a process lives, and stopping a tritonserver a killed supervisor left on
our ports."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from .triton_command import Ports

TRITON_STOP_S = 5  # after the drain, Triton's time to exit before it is killed (an open client gRPC
# stream keeps Triton from unloading the model even with nothing in flight)
COMMAND = __package__  # python -m backend.frontend.supervisor: how a live supervisor is recognised


def spawn(cmd: list, env: dict) -> subprocess.Popen:
    """Start `cmd` with no Python code run in the child: without a preexec_fn CPython's subprocess
    starts it by vfork + exec, which runs no fork handlers. This process holds gRPC client threads
    (the OpenAI layer's), and running Python or gRPC's fork handlers in a forked copy of it can
    abort the child (gRPC: "Other threads are currently calling into gRPC, skipping fork()
    handlers"). In a process group of its own: a terminal's Ctrl-C reaches only this supervisor,
    which drains first. That it dies with this process is argv_env.c's (SPECSERVE_PARENT_PID)."""
    return subprocess.Popen(cmd, env=env, process_group=0, close_fds=True)


def state(pid: int) -> str | None:
    """The process's state letter (R, S, Z for a zombie, ...), None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z")


def proc_argv(pid: int) -> list:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def signal_name(code: int) -> str:
    """An exit status in words: 'signal SIGKILL' or 'code 1'."""
    try:
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
    except ValueError:
        return f"code {code}"


def stop_orphan_servers(ports: Ports, timeout_s: float = TRITON_STOP_S) -> int:
    """A tritonserver whose supervisor was killed (SIGKILL: no cleanup ran) keeps our gRPC or
    metrics port while it shuts down (it got SIGTERM from PR_SET_PDEATHSIG). Stop those that use
    one of `ports` and whose parent is no supervisor: SIGTERM, then SIGKILL after `timeout_s`.
    -> how many were found."""
    flags = {f"--grpc-port={ports.grpc}", f"--metrics-port={ports.metrics}"}
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        argv = proc_argv(int(d.name))
        if argv and Path(argv[0]).name == "tritonserver" and flags & set(argv) and \
                COMMAND not in proc_argv(ppid(int(d.name))):
            found.append(int(d.name))
    for pid in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout_s
    while any(alive(p) for p in found) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in found:
        if alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return len(found)
