"""Finding a server's Python-backend stubs through /proc (backend/frontend/supervisor/stubs.py),
with real processes: `sleep` started under the stub's name, this test process as their server."""
import os
import signal
import subprocess
import time

from backend.frontend.supervisor.processes import proc_stat
from backend.frontend.supervisor.stubs import STUB, server_stubs, stub_processes


def _fake_stub(tmp_path, server_pid: int) -> subprocess.Popen:
    """A process named like a stub whose argv[5] names `server_pid` (GNU sleep adds its arguments)."""
    exe = tmp_path / STUB
    if not exe.exists():
        exe.symlink_to("/bin/sleep")
    return subprocess.Popen([str(exe), "600", "0", "0", "0", str(server_pid)])


def _wait_state(pid: int, state: bytes, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc_stat(pid)[1] == state:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached state {state!r}")


def test_a_servers_live_and_dead_stubs_are_found_and_no_other_process(tmp_path):
    stub = _fake_stub(tmp_path, os.getpid())
    stranger = subprocess.Popen(["/bin/sleep", "600", "0", "0", "0", str(os.getpid())])  # another name
    try:
        live, zombies = server_stubs(os.getpid())
        assert [pid for pid, _ in live] == [stub.pid] and zombies == []
        assert live[0][1][1:6] == ["600", "0", "0", "0", str(os.getpid())]
        assert stub.pid in [pid for pid, _ in stub_processes()]  # the slower full scan agrees
        assert server_stubs(os.getpid() + 1_000_000) == ([], [])  # another server's: none
        os.kill(stub.pid, signal.SIGKILL)
        _wait_state(stub.pid, b"Z")  # dead, not reaped (by us, its "server")
        live, zombies = server_stubs(os.getpid())
        assert live == [] and zombies == [stub.pid]
    finally:
        for p in (stub, stranger):
            p.kill()
            p.wait()
    assert server_stubs(os.getpid()) == ([], [])


def test_a_stat_line_is_parsed_whatever_its_name_holds_and_a_gone_process_is_skipped():
    from backend.frontend.supervisor.processes import parse_stat

    assert parse_stat(b"42 (triton_python_b) S 7 42 42 0 -1") == (b"triton_python_b", b"S", b"7")
    assert parse_stat(b"42 (a) b (c) d) Z 9 1 2") == (b"a) b (c) d", b"Z", b"9")  # a name with ") " in it
    assert parse_stat(b"") is None  # the process left between the listing and the read
    assert parse_stat(b"42 (x)") is None and parse_stat(b"garbage") is None
    with open(f"/proc/{os.getpid()}/stat", "rb") as f:
        name, state, parent = parse_stat(f.read())
    assert state in (b"R", b"S") and int(parent) == os.getppid()


def test_processes_coming_and_going_during_the_pass_never_break_it():
    """The supervisor's watch crashed (IndexError) when a process left between the listing of
    /proc and the read of its stat: the pass now runs while short-lived processes churn."""
    import threading

    stop = threading.Event()

    def churn():
        while not stop.is_set():
            subprocess.run(["/bin/true"])

    threads = [threading.Thread(target=churn) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            assert server_stubs(os.getpid()) == ([], [])
    finally:
        stop.set()
        for t in threads:
            t.join()
