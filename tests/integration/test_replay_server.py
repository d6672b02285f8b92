"""A trace written by the real server, replayed through the same policy (built from the
served model's own configuration, same seed), reproduces every decision it made."""
import json
import threading
import urllib.request
from pathlib import Path

from backend.server_config import ServerConfig
from backend.served_policy import load_policy
from conftest import SERVER_ENV
from policy.replay import reproduce
from policy.types import StepOutcome

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Repeat this list: apples, pears, plums, apples, pears, plums.",
           "Write a haiku about the sea.", "1, 2, 3, 4, 5, 6,", "def square(x):\n"]


def served_policy(server):
    """The policy exactly as the server built it: its config.pbtxt parameters and env."""
    with urllib.request.urlopen(f"http://{server.http}/v2/models/llm/config", timeout=10) as r:
        params = {k: v["string_value"] for k, v in json.load(r).get("parameters", {}).items()}
    return load_policy(ServerConfig.load(params, env=SERVER_ENV), ROOT)


def complete_steps(path):
    lines = path.read_text().split("\n")[:-1]  # the last piece may be a line still being written
    return [StepOutcome.from_dict(json.loads(line)) for line in lines if line.strip()]


def test_server_trace_replays_the_policy_exactly(server):
    threads = [threading.Thread(target=server.generate,
                                args=({"text_input": p, "max_tokens": 24, "apply_chat_template": True},))
               for p in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    trace = complete_steps(server.trace_file)
    assert sum(o.batch_size > 1 for o in trace) > 0  # continuous batching was exercised
    assert sum(o.drafted for o in trace) > 0  # and speculation
    check = reproduce(served_policy(server), trace)
    assert check.steps == len(trace)
    assert check.exact, check.mismatches
