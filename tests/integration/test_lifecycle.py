"""The server's lifecycle under the launcher (issue 20): a clean stop under load, a restart
after Triton dies (503 with Retry-After meanwhile, and never giving up), a clean start after the
launcher itself was killed, and no key or private port on any command line. Each test starts its
own server (backend/frontend/supervisor/) with small limits."""
import http.client
import json
import os
import re
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from backend.frontend.supervisor.launch import launch_server, start_server
from backend.frontend.supervisor.processes import TRITON_STOP_S, alive
from backend.frontend.supervisor.stubs import SHM_PREFIX, stub_processes
from backend.frontend.supervisor.triton_command import Ports
from test_server import Stream, grpc_generate

DRAIN_S = 3
ENV = dict(SPECSERVE_MAX_CONTEXT="512", SPECSERVE_MAX_TOKENS_LIMIT="256", SPECSERVE_MAX_BATCH="4",
           OMP_NUM_THREADS="1", SPECSERVE_POLICY="off",
           SPECSERVE_DRAIN_SECONDS=str(DRAIN_S),
           # restarts after 1 s each: the growing wait (1, 2, 4 ... 30 s) is test_restarts.py's; here
           # it would only add 31 s of sleep to the five restarts of test_many_restarts_under_client_traffic
           SPECSERVE_RESTART_BACKOFF_MAX_S="1")
COUNT = "1, 2, 3, 4, 5, 6, 7, 8,"  # counts on for its whole budget


class Grpc:
    def __init__(self, ports):
        self.grpc = f"127.0.0.1:{ports.grpc}"


def triton_pid(launcher_pid: int) -> int:
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if d.name.isdigit() and "(tritonserver)" in stat and int(stat.rsplit(")", 1)[1].split()[1]) == launcher_pid:
            return int(d.name)
    raise AssertionError(f"no tritonserver under launcher {launcher_pid}")


def stubs_of(server_pid: int) -> dict:
    """pid -> shared-memory region of each Python-backend stub of this tritonserver."""
    return {pid: Path(argv[2]).name for pid, argv in stub_processes() if argv[5] == str(server_pid)}


def assert_gone(server_pid: int, stubs: dict, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (alive(server_pid) or any(alive(p) for p in stubs)):
        time.sleep(0.2)
    assert not alive(server_pid), "tritonserver outlived its launcher"
    assert not [p for p in stubs if alive(p)], "an orphaned Python-backend stub is left"
    left = [r for r in stubs.values() if (Path("/dev/shm") / r).exists()]
    assert not left, f"shared-memory regions left: {left}"


def http_status(ports, path="/v2/health/ready", headers=None, method="GET", body=None):
    c = http.client.HTTPConnection("127.0.0.1", ports.http, timeout=30)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def wait_ready(ports, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if http_status(ports)[0] == 200:
                return time.monotonic() - t0
        except OSError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"not ready again within {timeout} s")


@pytest.fixture
def log_path():
    return Path(tempfile.mkdtemp(prefix="specserve-lifecycle-")) / "server.log"


def stop(proc) -> None:
    """Test cleanup: a clean stop (SIGKILL of the launcher would leave Triton to the next start)."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(DRAIN_S + TRITON_STOP_S + 10)
        except Exception:
            proc.kill()
            proc.wait()


def test_sigterm_under_load_drains_refuses_new_work_and_exits_clean(log_path):
    with open(log_path, "w") as log:
        proc, ports = start_server(env=ENV, log_file=log)
    streams = []
    try:
        server = triton_pid(proc.pid)
        stubs = stubs_of(server)
        assert stubs
        streams += [Stream(f"127.0.0.1:{ports.grpc}") for _ in range(4)]
        for i, s in enumerate(streams):  # two that finish within the drain, two that cannot
            s.infer(COUNT, max_tokens=6 if i < 2 else 250, stream=True)
        deadline = time.monotonic() + 60
        while not all(s.q.qsize() for s in streams[2:]) and time.monotonic() < deadline:
            time.sleep(0.02)  # the long ones are streaming
        results = [None] * 4
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, streams[i].collect(timeout=60)))
                   for i in range(4)]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        out, err = grpc_generate(Grpc(ports), "hi", max_tokens=4, stream=True)  # a new gRPC request: refused
        assert out is None and "shutting down" in err, err
        status, text = http_status(ports, "/v2/models/llm/generate", method="POST",
                                   body=json.dumps({"text_input": "hi", "max_tokens": 4}))
        assert status == 503 and "shutting down" in text, (status, text)
        assert http_status(ports)[0] == 503  # not ready: load balancers stop sending
        for t in threads:
            t.join(60)
            assert not t.is_alive(), "a stream hangs"
        for i, (out, err) in enumerate(results):  # finished, or failed with a clear error
            if err is None:
                assert out[1].as_numpy("finish_reason").reshape(-1)[0] in (b"length", b"stop")
            else:
                assert "server shutting down" in err and i >= 2, err
        assert results[0][1] is None and results[1][1] is None  # short ones finished
        assert proc.wait(DRAIN_S + TRITON_STOP_S + 10) == 0
        elapsed = time.monotonic() - t0
        assert elapsed < DRAIN_S + TRITON_STOP_S + 5, elapsed
        assert_gone(server, stubs)
        text = log_path.read_text()
        assert "Signal (11)" not in text and "Signal (6)" not in text and "Exit timeout expired" not in text, text[-3000:]
    finally:
        for s in streams:
            s.close()
        stop(proc)


def test_supervisor_restarts_a_dead_tritonserver(log_path):
    """kill -9 of tritonserver, then of the model's stub (Triton itself would stay up, failing
    every request with 'Stub process is not healthy'): each time the launcher cleans up and
    restarts Triton, and the server answers again."""
    with open(log_path, "w") as log:
        proc, ports = start_server(env=ENV, log_file=log)
    try:
        for victim in ("tritonserver", "stub"):
            server = triton_pid(proc.pid)
            stubs = stubs_of(server)
            if victim == "tritonserver":
                os.kill(server, signal.SIGKILL)
                time.sleep(0.3)  # while it is down the edge says when to come back
                c = http.client.HTTPConnection("127.0.0.1", ports.http, timeout=30)
                c.request("POST", "/v2/models/llm/generate", body=json.dumps({"text_input": "hi", "max_tokens": 2}))
                r = c.getresponse()
                assert (r.status, r.getheader("Retry-After")) == (503, "1"), r.read()
                c.close()
            else:
                os.kill(next(p for p in stubs if is_llm_stub(p)), signal.SIGKILL)
            t0, new = time.monotonic(), server
            while new == server and time.monotonic() - t0 < 90:  # (Triton stays "ready" with a dead stub)
                time.sleep(0.2)
                try:
                    new = triton_pid(proc.pid)
                except AssertionError:
                    pass
            assert new != server, "not restarted"
            took = wait_ready(ports, 90) + time.monotonic() - t0  # restarts after 1 s (ENV), plus loading
            assert_gone(server, stubs)
            assert_serves(ports)
            print(f"{victim} killed: ready again in {took:.1f} s")
        text = log_path.read_text()
        assert "died unexpectedly (signal SIGKILL)" in text and "restarting tritonserver in 1 s" in text
        assert "stub of model 'llm' died" in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DRAIN_S + TRITON_STOP_S + 10) == 0
        assert_gone(new, stubs_of(new))
    finally:
        stop(proc)


def _argv(pid: int) -> list:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def test_after_sigkill_of_the_launcher_the_next_start_is_clean():
    """SIGKILL of the whole launcher runs no cleanup: the next start on the same ports stops the
    orphaned tritonserver, kills its stubs, removes their shared memory and serves."""
    tmp_path = Path(tempfile.mkdtemp(prefix="specserve-lifecycle-"))
    with open(tmp_path / "a.log", "w") as log:
        proc, ports = start_server(env=ENV, log_file=log)
    second = None
    try:
        server = triton_pid(proc.pid)
        stubs = stubs_of(server)
        stream = Stream(f"127.0.0.1:{ports.grpc}")
        stream.infer(COUNT, max_tokens=250, stream=True)  # in flight when the launcher dies
        time.sleep(1)
        proc.kill()
        proc.wait()
        with open(tmp_path / "b.log", "w") as log:
            second, _ = start_server(ports=Ports(ports.http, ports.grpc, ports.metrics), env=ENV, log_file=log)
        assert_gone(server, stubs)
        out, err = stream.collect(timeout=30)  # the old stream ended, one way or another
        stream.close()
        (text, _), err = grpc_generate(Grpc(ports), "The capital of France is", max_tokens=4, stream=True)
        assert err is None and text, err
        second.send_signal(signal.SIGTERM)
        new = triton_pid(second.pid)
        new_stubs = stubs_of(new)
        assert second.wait(DRAIN_S + TRITON_STOP_S + 10) == 0
        assert_gone(new, new_stubs)
        assert not [r for r in Path("/dev/shm").glob(SHM_PREFIX + "*") if r.name in stubs.values()]
    finally:
        stop(proc)
        stop(second)


def test_admin_key_is_on_no_command_line(log_path):
    """Nor Triton's internal keys or its private HTTP socket (read from its log here)."""
    key = "adm1n-" + os.urandom(8).hex()
    with open(log_path, "w") as log:
        proc, ports = start_server(env=dict(ENV, SPECSERVE_ADMIN_KEY=key), log_file=log)
    try:
        private = re.findall(r"Started HTTPService at unix:(\S+):0", log_path.read_text())[-1]
        triton = _argv(triton_pid(proc.pid))
        assert "--http-address=unix:@SPECSERVE_ARG_HTTP_SOCKET@" in triton and not any(private in a for a in triton), \
            triton
        assert any(a.endswith("specserve-internal-key=@SPECSERVE_ARG_INTERNAL_KEY@") for a in triton), triton
        for d in Path("/proc").iterdir():
            if d.name.isdigit():
                try:
                    assert key.encode() not in (d / "cmdline").read_bytes(), f"pid {d.name} shows the admin key"
                except OSError:
                    pass
        # the key still opens the restricted APIs over HTTP (checked at the edge), a wrong one does not
        assert http_status(ports, "/v2/logging", headers={"specserve-admin-key": key})[0] == 200
        assert http_status(ports, "/v2/logging", headers={"specserve-admin-key": key + "x"})[0] == 403
        assert http_status(ports, "/v2/logging")[0] == 403
        # gRPC's restricted protocols are closed to everyone, key or not
        import tritonclient.grpc as grpcclient
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{ports.grpc}")
        try:
            with pytest.raises(Exception, match="restricted"):
                client.get_log_settings(headers={"specserve-admin-key": key})
            assert client.is_model_ready("llm")
        finally:
            client.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(DRAIN_S + TRITON_STOP_S + 10)


# -- a crash at any moment (issue 42) -------------------------------------------------------------
def llm_stub_of(launcher_pid: int, old_server: int | None = None, timeout: float = 120.0) -> tuple:
    """(tritonserver pid, pid of its `llm` model's stub) as soon as that stub exists: while Triton
    is still loading the model (`pgrep -f model_repository/llm/1/model.py`); not old_server's."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid, argv in stub_processes():
            server = int(argv[5]) if argv[5].isdigit() else 0
            if server != old_server and LLM_MODEL_PY in argv[1] and alive(pid) \
                    and alive(server) and _ppid(server) == launcher_pid:
                return server, pid
        time.sleep(0.02)
    raise AssertionError("no stub of the llm model appeared")


LLM_MODEL_PY = "model_repository/llm/1/model.py"  # in the argv of the stub running model llm


def is_llm_stub(pid: int) -> bool:
    """The stub running model `llm` (its model.py path: "llm/1" alone also names tensorrt_llm's)."""
    return any(LLM_MODEL_PY in a for a in _argv(pid))


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def assert_serves(ports) -> None:
    """A restarted server answers a streamed gRPC request and an HTTP /generate."""
    (text, _), err = grpc_generate(Grpc(ports), "The capital of France is", max_tokens=4, stream=True)
    assert err is None and text, err
    status, body = http_status(ports, "/v2/models/llm/generate", method="POST",
                               body=json.dumps({"text_input": "hi", "max_tokens": 2}))
    assert status == 200, body


def assert_loading(ports) -> None:
    status, text = http_status(ports)
    assert status == 503, (status, text)  # not ready yet: the stub was caught during the load


def wait_log(log_path: Path, words: str, timeout: float, after: int = 0) -> None:
    """Wait until the log holds `words` past its first `after` characters."""
    deadline = time.monotonic() + timeout
    while words not in log_path.read_text()[after:]:
        assert time.monotonic() < deadline, f"the launcher never logged {words!r}: {log_path.read_text()[-3000:]}"
        time.sleep(0.2)


def test_a_stub_that_hangs_or_dies_while_triton_loads_is_restarted(log_path):
    """A stub that hangs (SIGSTOP) while Triton loads: Triton is restarted when its start deadline
    (SPECSERVE_START_TIMEOUT_S, 20 s here) passes. Then the issue's reproducer: kill -9 of the llm
    stub as soon as it exists, while a restart loads; Triton 2.51 waits for it forever (readiness
    503 for good, the stub a zombie): the launcher restarts it at once. A load slower than the
    deadline on a busy machine only doubles it (40, 80 s ...): the server is ready in the end."""
    start_timeout = 20
    with open(log_path, "w") as log:
        proc, ports = launch_server(env=dict(ENV, SPECSERVE_START_TIMEOUT_S=str(start_timeout)), log_file=log)
    try:
        server, stub = llm_stub_of(proc.pid)
        os.kill(stub, signal.SIGSTOP)
        assert_loading(ports)
        wait_log(log_path, f"tritonserver was not ready {start_timeout} s after it started", start_timeout + 30)
        took = wait_ready(ports, 300)
        assert triton_pid(proc.pid) != server and not alive(stub)
        print(f"llm stub stopped while loading: ready {took:.1f} s after the deadline")

        old = triton_pid(proc.pid)
        logged = len(log_path.read_text())
        os.kill(old, signal.SIGKILL)  # a restart, whose llm stub dies while it loads
        server, stub = llm_stub_of(proc.pid, old)
        os.kill(stub, signal.SIGKILL)
        assert_loading(ports)
        # "of model 'llm'" when the watch saw the stub alive first, else "(pid N)": killed that fast,
        # it may never have been seen (test_triton_watch.py holds both namings)
        wait_log(log_path, "died while tritonserver was loading", 30, after=logged)
        took = wait_ready(ports, 300)
        assert triton_pid(proc.pid) != server
        assert_serves(ports)
        print(f"llm stub killed while loading: ready {took:.1f} s later")
    finally:
        stop(proc)


def read_sse(c: http.client.HTTPConnection) -> list:
    """The data of every event of a streamed response read to its end: IncompleteRead (a chunked
    body cut without its last chunk) fails the test."""
    r = c.getresponse()
    assert r.status == 200, r.read()
    body = r.read()  # http.client raises IncompleteRead for a chunked body cut short
    return [line[len(b"data: "):].decode() for line in body.split(b"\n") if line.startswith(b"data: ")]


def start_stream(ports, path: str, body: dict) -> http.client.HTTPConnection:
    c = http.client.HTTPConnection("127.0.0.1", ports.http, timeout=120)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    return c


STREAMS = {  # long enough to be cut: counting on for 250 tokens
    "/v2/models/llm/generate_stream": {"text_input": COUNT, "max_tokens": 250, "stream": True},
    "/v1/completions": {"model": "llm", "prompt": COUNT, "max_tokens": 250, "stream": True, "ignore_eos": True},
    "/v1/chat/completions": {"model": "llm", "messages": [{"role": "user", "content": "Count to 300."}],
                             "max_tokens": 250, "stream": True, "ignore_eos": True},
}


@pytest.mark.parametrize("victim", ["tritonserver", "stub"])
def test_streams_cut_by_a_crash_end_with_an_error_event(log_path, victim):
    """A stream Triton stops sending (it, or the stub it runs the model in, was killed) ends with an
    error event, Triton's shape on /generate_stream and an OpenAI error chunk on /v1, and a complete
    response; it was cut (an incomplete chunked body, no event)."""
    with open(log_path, "w") as log:
        proc, ports = start_server(env=ENV, log_file=log)
    try:
        server = triton_pid(proc.pid)
        conns = {path: start_stream(ports, path, body) for path, body in STREAMS.items()}
        results, threads = {}, []
        for path, c in conns.items():
            threads.append(threading.Thread(target=lambda p=path, c=c: results.__setitem__(p, read_sse(c))))
            threads[-1].start()
        streaming = time.monotonic() + 60
        while time.monotonic() < streaming and server_tokens(ports) < 3 * 8:  # each is streaming
            time.sleep(0.1)
        if victim == "tritonserver":
            os.kill(server, signal.SIGKILL)
        else:
            os.kill(next(p for p in stubs_of(server) if is_llm_stub(p)), signal.SIGKILL)
        for t in threads:
            t.join(60)
            assert not t.is_alive(), "a stream hangs"
        for path, events in results.items():
            last = json.loads(events[-1]) if not path.startswith("/v1") else json.loads(events[-2])
            if path.startswith("/v1"):
                assert events[-1] == "[DONE]", events[-3:]
                assert set(last["error"]) == {"message", "type", "param", "code"}, last
                message = last["error"]["message"]
            else:
                message = last["error"]
            if victim == "tritonserver":  # (a dead stub: Triton may say so itself before it is restarted)
                assert "stopped while running this request" in message and "retry" in message, last
            assert len(events) > 3, (path, events)  # it had streamed before the crash
        wait_ready(ports, 120)
    finally:
        for c in conns.values():
            c.close()
        stop(proc)


def server_tokens(ports) -> float:
    from backend.frontend import prometheus_text
    try:
        return prometheus_text.specserve_series(prometheus_text.scrape(f"127.0.0.1:{ports.metrics}")).get(
            "specserve_tokens_emitted_total", 0)
    except OSError:
        return 0


def test_many_restarts_under_client_traffic(log_path):
    """The launcher holds gRPC client threads (the OpenAI layer's). Starting Triton by fork with
    Python run in the child (preexec_fn) let gRPC's fork handlers run while those threads were
    busy: a restart died with SIGABRT before it became Triton ("skipping fork() handlers", then
    "epoll_wait error: Bad file descriptor"). Triton killed 5 times while OpenAI streams keep the
    launcher's gRPC threads busy: every restart becomes Triton and serves."""
    restarts = 5
    with open(log_path, "w") as log:
        proc, ports = start_server(env=ENV, log_file=log)
    stopping, served, failed = threading.Event(), [0], []

    def traffic():  # the launcher's own gRPC client, busy throughout
        while not stopping.is_set():
            try:
                c = start_stream(ports, "/v1/completions", dict(STREAMS["/v1/completions"], max_tokens=40))
                r = c.getresponse()
                r.read()
                served[0] += r.status == 200
                c.close()
                if r.status != 200:  # 503 while Triton restarts
                    time.sleep(0.2)
            except Exception as e:  # noqa: BLE001 - a restart cuts streams; only the server's fate counts here
                failed.append(repr(e))
                time.sleep(0.05)

    clients = [threading.Thread(target=traffic) for _ in range(3)]
    for t in clients:
        t.start()
    try:
        for i in range(restarts):
            server = triton_pid(proc.pid)
            os.kill(server, signal.SIGKILL)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # a new tritonserver, ready
                try:
                    if triton_pid(proc.pid) != server and http_status(ports)[0] == 200:
                        break
                except (AssertionError, OSError):
                    pass
                time.sleep(0.2)
            else:
                raise AssertionError(f"restart {i + 1} never became ready: {log_path.read_text()[-3000:]}")
            before = served[0]
            wait = time.monotonic() + 60
            while served[0] == before and time.monotonic() < wait:  # traffic is served again
                time.sleep(0.1)
            assert served[0] > before, f"nothing served after restart {i + 1}"
        text = log_path.read_text()
        assert text.count("died unexpectedly (signal SIGKILL)") == restarts, text[-3000:]
        for words in ("SIGABRT", "Signal (6)", "skipping fork() handlers", "epoll_wait error"):
            assert words not in text, text[-3000:]
    finally:
        stopping.set()
        for t in clients:
            t.join(120)
        stop(proc)
