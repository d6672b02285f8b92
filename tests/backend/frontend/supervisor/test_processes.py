"""Processes as the supervisor starts and watches them (backend/frontend/supervisor/processes.py):
Triton started with no fork handler run in the child and dying with its supervisor."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from backend.frontend.supervisor.lifecycle import Supervisor
from backend.frontend.supervisor.processes import alive, signal_name
from backend.frontend.supervisor.server_secrets import argv_env_library
from backend.frontend.supervisor.triton_command import Ports
from backend.server_config import ServerConfig


def test_triton_is_started_without_fork_handlers(tmp_path):
    """No fork handler (gRPC's are C-level pthread_atfork ones) and no Python runs in the child
    when the supervisor starts Triton: it used fork + a preexec_fn."""
    import ctypes

    source = tmp_path / "atfork.c"
    source.write_text("#include <pthread.h>\nint prepared;\nstatic void prepare(void) { prepared++; }\n"
                      "__attribute__((constructor)) static void init(void) { pthread_atfork(prepare, 0, 0); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(tmp_path / "atfork.so"), str(source)], check=True)
    counter = ctypes.c_int.in_dll(ctypes.CDLL(str(tmp_path / "atfork.so")), "prepared")
    python_hooks, watching = [], [True]
    os.register_at_fork(before=lambda: watching[0] and python_hooks.append(1))  # (cannot be unregistered)
    sup = Supervisor(["/bin/sh", "-c", "exit 7"], ServerConfig(), Ports(1, 2, 3), 1 << 20, 32)
    try:
        for _ in range(3):
            assert sup._start().wait(10) == 7
    finally:
        watching[0] = False
        shutil.rmtree(sup.workdir)
    assert (counter.value, python_hooks) == (0, [])


def test_triton_dies_with_its_supervisor(tmp_path):
    """argv_env.c's PR_SET_PDEATHSIG: Triton (here a sleep started the same way) is killed when the
    process that started it dies however it dies, and at once if that one died before it ran."""
    library = argv_env_library(tmp_path)
    code = ("import os, sys, time; from backend.frontend.supervisor.processes import spawn; "
            "env = dict(os.environ, LD_PRELOAD=sys.argv[1], SPECSERVE_PARENT_PID=sys.argv[2] or str(os.getpid())); "
            "print(spawn(['sleep', '60'], env).pid, flush=True); time.sleep(60)")
    for named in ("", "1"):  # its real parent; a pid that is not its parent (that one died first)
        starter = subprocess.Popen([sys.executable, "-c", code, str(library), named], stdout=subprocess.PIPE,
                                   text=True, cwd=Path(__file__).resolve().parents[4])
        try:
            child = int(starter.stdout.readline())
            if not named:
                time.sleep(0.5)
                assert alive(child)
                starter.kill()
                starter.wait()
            deadline = time.monotonic() + 5
            while alive(child) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not alive(child), f"the child outlived its parent (SPECSERVE_PARENT_PID={named or 'its parent'})"
        finally:
            starter.kill()
            starter.wait()


def test_exit_statuses_in_words():
    assert (signal_name(-9), signal_name(1), signal_name(-999)) == ("signal SIGKILL", "code 1", "code -999")
