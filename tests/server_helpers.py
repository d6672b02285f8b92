"""A real Triton server started for tests, and a small client for it."""
import json
import time
import urllib.request
from contextlib import contextmanager

from backend.frontend import prometheus_text
from backend.frontend.supervisor.launch import start_server


class Server:
    def __init__(self, proc, ports, log_path):
        self.proc, self.ports, self.log_path = proc, ports, log_path
        self.http = f"127.0.0.1:{ports.http}"
        self.grpc = f"127.0.0.1:{ports.grpc}"

    def generate(self, payload: dict, stream: bool = False, timeout: float = 120):
        """POST /generate (or /generate_stream); returns (status, parsed body or list of events)."""
        url = f"http://{self.http}/v2/models/llm/generate" + ("_stream" if stream else "")
        req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                body = r.read().decode()
                status = r.status
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read().decode())
        if stream:
            return status, [json.loads(line[5:]) for line in body.splitlines() if line.startswith("data:")]
        return status, json.loads(body)

    def samples(self) -> list:
        """Every sample on the metrics port: (name, {label: value}, value)."""
        return prometheus_text.samples(prometheus_text.scrape(f"127.0.0.1:{self.ports.metrics}"))

    def metrics(self) -> dict:
        """The specserve_* samples keyed `name{label="value",...}` without the model / version labels."""
        return prometheus_text.specserve_series(prometheus_text.scrape(f"127.0.0.1:{self.ports.metrics}"))

    def wait_metric(self, name: str, predicate, timeout: float = 30.0) -> float:
        deadline = time.time() + timeout
        while True:
            value = self.metrics().get(name)
            if value is not None and predicate(value):
                return value
            if time.time() > deadline:
                raise AssertionError(f"metric {name} = {value} never satisfied the condition")
            time.sleep(0.2)


@contextmanager
def running_server(env: dict, log_dir, ready_timeout_s: float = 180.0):
    """Start the project's server with these SPECSERVE_* settings; stop it afterwards."""
    log_path = log_dir / "server.log"
    with open(log_path, "w") as log:
        proc, ports = start_server(env=env, log_file=log, ready_timeout_s=ready_timeout_s)
    try:
        yield Server(proc, ports, log_path)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except Exception:
            proc.kill()
