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


def read_proc(path: str) -> bytes:
    """A small /proc file's bytes, b"" if its process is gone (os-level: the supervisor's watch
    reads one per process every 0.5 s, on cores the engine fills)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return b""
    try:
        return os.read(fd, 1 << 16)
    except OSError:
        return b""
    finally:
        os.close(fd)


def parse_stat(raw: bytes):
    """A /proc/<pid>/stat's (name, state, parent pid) as bytes, or None when it is not one (empty:
    the process is gone). The name sits in parentheses and may itself hold spaces or ") "."""
    head, sep, rest = raw.rpartition(b") ")
    if not sep or b" (" not in head:
        return None
    fields = rest.split(b" ", 2)
    if len(fields) < 2:
        return None
    return head.split(b" (", 1)[1], fields[0], fields[1]


def proc_stat(pid) -> tuple | None:
    """(name, state, parent pid) of a process, as bytes; None if there is no such process."""
    return parse_stat(read_proc(f"/proc/{pid}/stat"))


def state(pid: int) -> str | None:
    """The process's state letter (R, S, Z for a zombie, ...), None if there is no such process."""
    fields = proc_stat(pid)
    return None if fields is None else fields[1].decode()


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z")


def proc_argv(pid: int) -> list:
    try:
        return [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []


def ppid(pid: int) -> int:
    fields = proc_stat(pid)
    try:
        return int(fields[2]) if fields else 0
    except ValueError:
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
