"""Triton's Python-backend stubs, found through /proc: a stub ignores SIGTERM and outlives a
crashed server, and its shared-memory region (/dev/shm) outlives it. The supervisor finds a
server's stubs (alive, or dead and not reaped) and removes what a dead server left."""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from .processes import alive, proc_stat, read_proc

STUB = "triton_python_backend_stub"
SHM_PREFIX = "triton_python_backend_shm_region_"


def stub_processes() -> list:
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


def server_stubs(server_pid: int) -> tuple:
    """`server_pid`'s Python-backend stubs -> ([(pid, argv)] alive, [pid] dead and not reaped), in
    one pass over /proc that reads each process's `stat` alone (name, state, parent) and the
    command line of the server's stubs only. The supervisor runs it every 0.5 s while serving,
    on cores the engine's threads fill: reading every process's command line and stat through
    pathlib cost ~7 ms of CPU a pass (~0.2 ms an output token at one stream). A zombie has no
    command line any more: its name (15 characters) and parent tell."""
    live, zombies, parent = [], [], str(server_pid)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = proc_stat(entry.name)
        if fields is None:  # gone since the listing
            continue
        comm, state, ppid = fields
        if comm != STUB[:15].encode() or ppid.decode() != parent:
            continue
        if state == b"Z":
            zombies.append(int(entry.name))
            continue
        argv = [a.decode(errors="replace") for a in read_proc(f"/proc/{entry.name}/cmdline").split(b"\0")]
        if len(argv) > 5 and argv[5] == parent:
            live.append((int(entry.name), argv))
    return live, zombies


def reap_stubs(server_pid: int | None = None, shm_dir: Path = Path("/dev/shm"), min_age_s: float = 60.0) -> int:
    """Kill the Python-backend stubs of `server_pid` and of any tritonserver that is gone (a stub
    ignores SIGTERM and outlives a crashed server), remove their shared-memory regions, and remove
    regions no live stub names that are older than `min_age_s` (a starting server's are newer).
    Other live servers' stubs are left alone. -> the number of stubs killed."""
    killed, pids = 0, []
    for pid, argv in stub_processes():
        try:
            parent = int(argv[5])
        except ValueError:
            continue
        if parent == server_pid or not alive(parent):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
                pids.append(pid)
            except ProcessLookupError:
                pass
            (shm_dir / Path(argv[2]).name).unlink(missing_ok=True)
    deadline = time.monotonic() + 3.0
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    named = {Path(argv[2]).name for pid, argv in stub_processes() if alive(pid)}
    mapped, complete = mapped_regions()
    for region in shm_dir.glob(SHM_PREFIX + "*"):
        try:
            age = time.time() - region.stat().st_mtime
            # mapped by no process at all: stale once older than a starting server's creation race
            if region.name not in named and region.name not in mapped and age > (2.0 if complete else min_age_s):
                region.unlink()
        except OSError:
            pass
    return killed


def mapped_regions() -> tuple:
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
