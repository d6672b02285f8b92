"""The peer benchmark's pure parts (bench/bench_peer.py and its modules), without servers: the
figures it reports (percentiles, tokens in the window, ratios, greedy identity) and the multi-turn
sessions it sends (each turn resends the history with the server's own answers)."""
import math
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ scripts import their siblings

from bench_peer import CONTEXT, identities, peer_command  # noqa: E402
from peer_stats import (Request, geometric_mean, identity, levels, percentile, ratios, summarise,  # noqa: E402
                        tokens_in_window)
from peer_workloads import Feed, Session, conversations, mostly_ascii  # noqa: E402


@pytest.mark.parametrize("values", [[3.0], [1.0, 2.0], [5, 1, 4, 2, 3], list(np.random.default_rng(0).random(37))])
@pytest.mark.parametrize("q", [0, 10, 50, 90, 100])
def test_percentile_is_numpys(values, q):
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_nothing_is_nan():
    assert math.isnan(percentile([], 50))


def test_tokens_in_window_counts_the_share_inside():
    r = Request("k", start=0.0, first=1.0, last=11.0, tokens=11)  # one token at 1, ten over (1, 11]
    assert tokens_in_window(r, 0, 20) == pytest.approx(11)
    assert tokens_in_window(r, 6, 20) == pytest.approx(5)  # half the span, first token outside
    assert tokens_in_window(r, 0, 6) == pytest.approx(1 + 5)
    assert tokens_in_window(r, 12, 20) == 0
    assert tokens_in_window(Request("k", 0, 1.0, 1.0, 3), 0, 2) == 3  # everything in one chunk
    assert tokens_in_window(Request("k", 0, 1.0, 2.0, 5, error="HTTP 500"), 0, 10) == 0


def test_summarise_a_level():
    """Throughput counts every token inside the window; latencies and counts only the requests
    started inside it."""
    reqs = [Request("a", 0.5, 1.0, 3.0, 5),  # started before the window: its tokens count, not its latency
            Request("b", 1.0, 1.5, 2.5, 3), Request("c", 2.0, None, None, 0, error="x"),
            Request("d", 9.0, 9.5, 12.0, 6)]  # ends after the window: 1 + 5 x 0.5 / 2.5 tokens inside
    s = summarise(reqs, 1.0, 10.0)
    assert s["done"] == 2 and s["failed"] == 1 and s["errors"] == ["x"]
    assert s["tok_s"] == pytest.approx((5 + 3 + 2) / 9)
    assert s["ttft_p50_s"] == pytest.approx(0.5) and s["ttft_p90_s"] == pytest.approx(0.5)
    assert s["tpot_p50_ms"] == pytest.approx(500.0)  # 1 s / 2 and 2.5 s / 5


def test_ratios_pair_the_same_workload_and_load():
    row = lambda server, w, n, tok, ttft: {"server": server, "workload": w, "streams": n, "tok_s": tok, "ttft_p50_s": ttft}
    rows = [row("ours", "chat", 1, 50, 0.2), row("llama-server", "chat", 1, 40, 0.1),
            row("ours", "chat", 32, 70, 5.0), row("ours", "copy", 1, 10, 1.0)]
    assert ratios(rows) == [{"workload": "chat", "streams": 1, "tok_s": 1.25, "ttft_p50": 2.0, "rounds": [1.25]}]


def test_rounds_pair_within_a_round_and_average_geometrically():
    """bench_peer --rounds: each round's ours / peer, their geometric mean; a round one arm lacks is left out."""
    row = lambda server, n, tok, rnd: {"server": server, "workload": "chat", "streams": n, "tok_s": tok,
                                       "ttft_p50_s": 0.1, "round": rnd}
    rows = [row("ours", 8, 90, 0), row("ours-off", 8, 100, 0), row("ours-off", 8, 80, 1), row("ours", 8, 100, 1),
            row("ours", 8, 70, 2)]
    (x,) = ratios(rows, "ours", "ours-off")
    assert x["rounds"] == [0.9, 1.25] and x["tok_s"] == pytest.approx((0.9 * 1.25) ** 0.5)
    assert x["ttft_p50"] == pytest.approx(1.0)
    assert [(r["server"], r["tok_s"]) for r in levels(rows)] == [("ours", 260 / 3), ("ours-off", 90.0)]
    assert math.isnan(geometric_mean([])) and math.isnan(geometric_mean([1.0, math.nan]))


def test_identity_over_the_prompts_finished_at_both_loads():
    assert identity({"a": "x", "b": "y", "c": "z"}, {"a": "x", "b": "Y", "d": "w"}) == (1, 2, ["b"])
    answers = {("ours", "chat", 1): {"a": "x"}, ("ours", "chat", 8): {}, ("ours", "chat", 32): {"a": "x"},
               ("llama-server", "chat", 1): {"a": "x", "b": "y"}, ("llama-server", "chat", 32): {"a": "X", "b": "y"}}
    out = identities(answers, [1, 8, 32])
    assert [(x["server"], x["identical"], x["common"], x["differ"]) for x in out] == [
        ("ours", 1, 1, []), ("llama-server", 1, 2, ["a"])]


def test_a_multiturn_session_resends_the_history_with_the_answers():
    s = Session("multiturn/7", ["Hi", "And then?"])
    key, messages = s.next_request()
    assert key == "multiturn/7#0" and messages == [{"role": "user", "content": "Hi"}]
    s.answered("Hello!")
    key, messages = s.next_request()
    assert key == "multiturn/7#1"
    assert messages == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                        {"role": "user", "content": "And then?"}]
    s.answered("Then this.")
    assert s.next_request() is None
    single = Session("chat/3", ["One question"])
    assert single.next_request()[0] == "chat/3"


def test_conversations_keep_the_leading_usable_user_turns():
    turn = lambda who, text: {"from": who, "value": text}
    ok = "a user turn of fine length"
    records = [{"id": "one", "conversations": [turn("human", ok)]},  # no follow-up
               {"id": "two", "conversations": [turn("human", ok), turn("gpt", "x"), turn("human", ok + "2"),
                                               turn("gpt", "y"), turn("human", "short")]},
               {"id": "three", "conversations": [turn("human", ok)] + [turn("human", f"{ok} {i}") for i in range(9)]},
               {"id": "four", "conversations": [turn("human", ok), turn("human", ok)]},
               {"id": "five", "conversations": [turn("human", ok), turn("human", "中文的问题" * 5)]}]
    out = conversations(records, limit=2, max_turns=4, keep=lambda key: key != "four")
    assert out == [("multiturn/two", [ok, ok + "2"]), ("multiturn/three", [ok, f"{ok} 0", f"{ok} 1", f"{ok} 2"])]


def test_feed_starts_over_and_counts_repeats():
    feed = Feed([("a", ["x"]), ("b", ["y"])])
    assert [feed.next().key for _ in range(3)] == ["a", "b", "a"] and feed.repeats == 1


def test_peer_command_gives_each_slot_our_context():
    cmd = peer_command(Path("/bin/llama-server"), Path("m.gguf"), 8080, 32, 2, ["--no-cache-prompt"])
    assert cmd[cmd.index("-np") + 1] == "32" and cmd[cmd.index("-c") + 1] == str(32 * CONTEXT)
    assert cmd[-1] == "--no-cache-prompt" and "--no-webui" in cmd and cmd[cmd.index("-fa") + 1] == "on"


def test_mostly_ascii_bounds_tokens_by_characters():
    assert mostly_ascii("Plain English text, with one “quoted” word in it, as chat users write.") and not mostly_ascii("中文的问题 and some English")


def test_a_request_is_recorded_relative_to_the_window():
    d = Request("k", 9.0, 9.5, None, 0, error="HTTP 500").as_dict(10.0)
    assert (d["start"], d["first"], d["last"], d["error"]) == (-1.0, -0.5, None, "HTTP 500")


def test_the_peer_binary_comes_from_the_build_script_under_a_lock(monkeypatch, tmp_path):
    """on_demand llama-server runs scripts/build_llama_server.sh (which prints the cached binary's
    path last on stdout, its progress on stderr) holding the build lock."""
    from build_engines import on_demand
    calls = []

    def run(cmd, **kw):
        calls.append((cmd, kw, (tmp_path / ".llama-server.lock").exists()))
        return type("Done", (), {"stdout": "noise\n/x/llama-server\n"})()

    monkeypatch.setattr(on_demand, "CACHE", tmp_path)
    monkeypatch.setattr(on_demand.subprocess, "run", run)
    assert on_demand.llama_server() == Path("/x/llama-server")
    (cmd, kw, locked), = calls
    assert cmd[-1].endswith("scripts/build_llama_server.sh") and kw["check"] and locked


def test_a_level_starts_a_server_warms_it_up_and_records_its_requests(monkeypatch):
    import contextlib

    import bench_peer
    started = []

    @contextlib.contextmanager
    def start(stats):
        started.append(True)
        yield "http://127.0.0.1:1"
        stats["acceptance"] = 0.5  # what our server's metrics said at the level's end

    def closed_loop(url, feed, streams, ramp_s, seconds, max_tokens, extra=None):
        assert (streams, ramp_s, seconds, max_tokens) == (4, 4.0, 20, 64)
        keys = [feed.next().key for _ in range(3)]
        return [Request(keys[0], 100.0, 100.5, 101.5, 3, "a"), Request(keys[1], 101.0, None, None, 0, error="e"),
                Request(keys[2], 99.0, 99.5, 100.5, 2, "c")], 100.0, 120.0

    monkeypatch.setattr(bench_peer, "warm_up", lambda url: Request("w", 0, 0, 0, 1, "hi"))
    monkeypatch.setattr(bench_peer, "closed_loop", closed_loop)
    args = bench_peer.parse_args(["--streams", "4", "--seconds", "20"])
    row, requests = bench_peer.run_level("ours", start, "chat", [("chat/a", ["x"]), ("chat/b", ["y"])], 4, args)
    assert started and row["done"] == 1 and row["failed"] == 1 and row["repeats"] == 1 and row["sessions"] == 3
    assert row["policy"] == {"acceptance": 0.5}
    assert [(r["key"], r["start"], r["error"]) for r in requests] == [("chat/a", 0.0, ""), ("chat/b", 1.0, "e"),
                                                                      ("chat/a", -1.0, "")]


def test_policy_stats_read_our_metrics_endpoint():
    """What a level's speculation did, from the Prometheus text our server publishes (extra labels,
    such as Triton's model and version, do not matter); nothing when the endpoint does not answer."""
    import http.server
    import threading

    import bench_peer
    text = "\n".join([
        "# HELP specserve_steps_total speculative steps run", "specserve_steps_total 10",
        "specserve_step_sequences_total 80", "specserve_tokens_drafted_total 40",
        "specserve_tokens_accepted_total 10", "specserve_tokens_emitted_total 120",
        'specserve_gamma_played_total{gamma="0",model="llm"} 40', 'specserve_gamma_played_total{gamma="4",model="llm"} 40',
        'specserve_phase_seconds_total{phase="step"} 0.3', 'specserve_phase_seconds_total{phase="draft"} 0.1', ""])

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        got = bench_peer.policy_stats(f"http://127.0.0.1:{srv.server_port}/metrics")
    finally:
        srv.shutdown()
    assert got == pytest.approx({"steps": 10, "mean_batch": 8.0, "step_ms": 30.0, "drafting_share": 0.5,
                                 "drafted_per_seq_step": 0.5, "acceptance": 0.25, "emitted_per_seq_step": 1.5})
    assert bench_peer.policy_stats(f"http://127.0.0.1:{srv.server_port}/metrics") == {}  # shut down
