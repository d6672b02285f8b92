"""The Supervisor: Triton run behind the HTTP edge, restarted when it dies or must be (triton_watch.py
says when, restarts.py how soon), drained and stopped on a signal; the package's docstring tells
the whole lifecycle."""
from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ...served import SERVED_ENV, write
from ...server_config import ServerConfig
from ...wire import INTERNAL_HEADER
from .errors import LaunchError
from .processes import TRITON_STOP_S, signal_name, spawn
from .restarts import MAX_RESTARTS, RESTART_WINDOW_S, RestartPolicy
from .server_secrets import (UpstreamKeys, argv_env_library, fill_placeholders, private_socket_path, server_secrets,
                             unix_http)
from .stubs import reap_stubs, server_stubs
from .triton_command import ARGV_ENV_DIR, EXIT_TIMEOUT_S, Ports, server_env
from .triton_watch import StartDeadlines, Stub, TritonWatch

DRAIN_S = float(os.environ.get("SPECSERVE_DRAIN_SECONDS") or 10)  # in-flight requests' time to finish


class Supervisor:
    """Runs Triton (`cmd`) behind the HTTP edge; restarts Triton when it dies (bounded, with
    backoff); on SIGTERM / SIGINT drains and stops both (the package's docstring)."""

    def __init__(self, cmd: list, served: ServerConfig, ports: Ports, max_body_bytes: int, max_depth: int, admin_key: str | None = None,
                 bind: str = "127.0.0.1", drain_s: float = DRAIN_S, max_restarts: int = MAX_RESTARTS,
                 restart_window_s: float = RESTART_WINDOW_S, read_timeout_s: float | None = None,
                 start_timeout_s: float | None = None):
        self.cmd, self.ports, self.bind = cmd, ports, bind
        self.limits = dict(max_body_bytes=max_body_bytes, max_depth=max_depth)
        if read_timeout_s:
            self.limits["read_timeout_s"] = read_timeout_s
        self.admin_key, self.keys = admin_key, UpstreamKeys.fresh()
        self.drain_s, self.restarts = drain_s, RestartPolicy(max_restarts, restart_window_s)
        self.deadlines = StartDeadlines(start_timeout_s)  # each start's time to become ready
        self.workdir = Path(tempfile.mkdtemp(prefix="specserve-"))  # mode 0700
        try:
            self.http_socket = private_socket_path(self.workdir)
        except LaunchError:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.drain_file = self.workdir / "drain"
        # The edge marks requests whose HTTP client left here; the model polls the marks
        # (backend/frontend/edge/cancel_marks.py). Removed with the workdir at exit.
        self.cancel_dir = self.workdir / "cancelled"
        self.cancel_dir.mkdir()
        self.refusals_file = self.workdir / "edge_refusals.json"  # the edge's counts, read by the model's metrics
        self.served = served  # what every model, the edge and the OpenAI API serve (backend/served.py)
        self.env = server_env({SERVED_ENV: str(write(served, self.workdir / "served.json")),
                               "SPECSERVE_DRAIN_FILE": str(self.drain_file),
                               "SPECSERVE_CANCEL_DIR": str(self.cancel_dir),
                               "SPECSERVE_EDGE_REFUSALS": str(self.refusals_file)})
        self.env.pop("SPECSERVE_ADMIN_KEY", None)  # Triton needs none of it
        values = server_secrets(self.http_socket, self.keys)
        library = argv_env_library(ARGV_ENV_DIR) or argv_env_library(self.workdir)  # .cache read-only: build here
        if library is None:
            print("warning: no C compiler to build backend/frontend/supervisor/argv_env.c: Triton's private HTTP "
                  "port and its API keys are on its command line, readable by every local user, and a "
                  "tritonserver outlives a killed supervisor until the next start stops it", flush=True)
            self.cmd = fill_placeholders(self.cmd, values)
        else:
            self.env.update(values, SPECSERVE_PARENT_PID=str(os.getpid()),
                            LD_PRELOAD=" ".join(filter(None, [str(library), self.env.get("LD_PRELOAD")])))
        self.proc: subprocess.Popen | None = None
        self.regions: set = set()  # shared-memory regions of the running Triton's stubs

    def _start(self) -> subprocess.Popen:
        # From the main thread: PR_SET_PDEATHSIG (argv_env.c) follows the thread that started it
        self.http_socket.unlink(missing_ok=True)  # a dead Triton's socket: Triton would not bind over it
        self.proc = spawn(self.cmd, self.env)
        return self.proc

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
        loads or serves (a stub that died, a start past its deadline: triton_watch.py):
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
            mine, zombies = server_stubs(self.proc.pid)
            self.regions.update(Path(argv[2]).name for _, argv in mine)  # removed when this server is gone
            loading = watch.ready_after is None
            ready = not loading or await loop.run_in_executor(None, self._ready)
            seen = [Stub.from_argv(pid, argv, False) for pid, argv in mine]
            reason = watch.check(ready, seen + [Stub(pid, None, True) for pid in zombies])
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
        from ..edge import proxy as edge

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
                print(f"tritonserver (pid {pid}) died unexpectedly ({signal_name(self.proc.returncode)})", flush=True)
            if reap_stubs(pid):
                print("killed the Python-backend stub it left behind", flush=True)
            for region in self.regions:  # a dead stub's region: no live process names it any more
                (Path("/dev/shm") / region).unlink(missing_ok=True)
            self.regions.clear()
            delay = self.restarts.delay()
            if delay is None:
                print(f"tritonserver died {self.restarts.max_restarts + 1} times within {self.restarts.window_s:.0f} s: "
                      "giving up", flush=True)
                failed = True
                break
            print(f"restarting tritonserver in {delay:.0f} s (restart {len(self.restarts.times)} within "
                  f"{self.restarts.window_s:.0f} s)", flush=True)
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
            print(f"tritonserver exited with {signal_name(self.proc.returncode)}", flush=True)
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
