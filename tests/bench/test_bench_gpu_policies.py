"""bench/bench_gpu_policies.py, the benchmark scripts/gpu_check.sh runs in the GPU container, run here
against our CPU server: an arm's settings make the server serve that arm, `measure` adds a level
per call to one JSON, `report` prints bench_speculation.py's Part B table from it. Plus its pure
parts (the table, ratios, the counters it checks the served arm with, the request feed)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from server_helpers import running_server

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_gpu_policies.py"
sys.path.insert(0, str(ROOT / "bench"))  # bench/ scripts import their siblings

import bench_gpu_policies  # noqa: E402
from bench_gpu_policies import ARMS, STATIC_CONFIG, Feed, arm_env, check_arm, counter_deltas  # noqa: E402
from bench_speculation import add_ratios, server_table  # noqa: E402


def row(arm, conc, tok_s, **kw):
    return {"arm": arm, "concurrency": conc, "tok_s": tok_s, "round": 0, "requests": 3, "drafted": 0, "accepted": 0,
            "decisions": {}, **kw}


def test_the_table_has_plain_first_and_each_arms_ratio_to_plain():
    rows = add_ratios([row("ngram γ=4", 1, 45.0), row("plain", 1, 50.0), row("composite", 1, 60.0),
                       row("plain", 8, 100.0), row("composite", 8, 150.0)])
    assert [r["ratio"] for r in rows] == [0.9, 1.0, 1.2, 1.0, 1.5]
    assert server_table(rows).splitlines() == [
        "| streams | plain (tok/s) | ngram γ=4 | composite |",
        "|---|---|---|---|",
        "| 1 | 50.0 | 45.0 (0.90×) | 60.0 (1.20×) |",
        "| 8 | 100.0 | - | 150.0 (1.50×) |"]


def test_a_level_without_plain_has_no_ratio():
    assert math.isnan(add_ratios([row("composite", 32, 10.0)])[0]["ratio"])


def test_with_rounds_the_table_lists_each_rounds_ratio():
    rows = [row("plain", 1, 50.0, ratio=1.0, round_ratios=[1.0, 1.0]),
            row("composite", 1, 55.0, ratio=1.1, round_ratios=[1.05, 1.15])]
    assert server_table(rows).splitlines()[-1] == "| 1 | 50.0 | 55.0 (1.10× (1.05, 1.15)) |"


def test_the_static_arm_is_the_cpu_benchmarks_ngram_gamma_4():
    cfg = yaml.safe_load((ROOT / STATIC_CONFIG).read_text())
    assert cfg == {"policy": "static", "params": {"drafter": "ngram", "gamma": ARMS["static"][1]["gamma"]}}
    assert ARMS["static"] == ("static", {"gamma": 4}) and ARMS["plain"][0] == "off"
    assert arm_env("composite") == {"SPECSERVE_POLICY": "composite"}


def test_the_env_command_prints_an_arms_settings():
    out = subprocess.run([sys.executable, str(BENCH), "env", "--arm", "plain"], capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines() == ["SPECSERVE_POLICY=off"]


def test_counter_deltas_read_drafts_and_decisions():
    before = {"specserve_tokens_drafted_total": 10, "specserve_tokens_accepted_total": 5,
              'specserve_decisions_total{drafter="ngram",gamma="4"}': 7}
    after = {"specserve_tokens_drafted_total": 30, "specserve_tokens_accepted_total": 15,
             'specserve_decisions_total{drafter="ngram",gamma="4"}': 12,
             'specserve_decisions_total{drafter="none",gamma="0"}': 2,
             'specserve_decisions_total{drafter="suffix",gamma="6"}': 0}
    assert counter_deltas(before, after) == {"drafted": 20, "accepted": 10, "acceptance": 0.5,
                                             "decisions": {"ngram/4": 5, "none/0": 2}}
    assert math.isnan(counter_deltas({}, {})["acceptance"])


def test_check_arm_warns_when_the_server_serves_another_arm_or_counts_nothing():
    assert check_arm("plain", row("plain", 1, 50.0, decisions={"none/0": 9})) == []
    assert "does not serve SPECSERVE_POLICY=off" in check_arm("plain", row("plain", 1, 5.0, drafted=4,
                                                                          decisions={"ngram/4": 1}))[0]
    assert check_arm("static", row("ngram γ=4", 1, 5.0, decisions={"ngram/4": 9, "none/0": 1})) == []
    assert STATIC_CONFIG in check_arm("static", row("ngram γ=4", 1, 5.0, decisions={"suffix/6": 9}))[0]
    assert "token counter" in check_arm("composite", row("composite", 8, 0.0))[0]
    assert "sent again" in check_arm("composite", row("composite", 8, 9.0, repeats=3))[0]


def test_the_feed_starts_over_and_counts_what_it_repeats():
    feed = Feed(["a", "b"])
    assert iter(feed) is feed and [next(feed) for _ in range(5)] == ["a", "b", "a", "b", "a"] and feed.repeats == 3
    with pytest.raises(ValueError):
        Feed([])


def test_measure_each_arm_against_a_server_started_with_its_settings_then_report(tmp_path, capsys):
    """The GPU container's sequence, on our CPU server: a server per arm, one short level each
    (in this process: the script's command line is the same, `env` above runs it as a script)."""
    out = tmp_path / "gpu_policies.json"
    for arm in ("plain", "static"):
        with running_server({**arm_env(arm), "SPECSERVE_MAX_BATCH": "4"}, tmp_path) as server:
            for attempt in range(2):  # once more where the server stalled the whole window (a loaded 2-core host)
                assert bench_gpu_policies.main(["measure", "--arm", arm, "--streams", "1", "--seconds", "4",
                                                "--max-tokens", "16", "--prompts", "300", "--device", "test CPU",
                                                "--grpc-port", str(server.ports.grpc),
                                                "--metrics-port", str(server.ports.metrics), "--out", str(out)]) == 0
                shown = capsys.readouterr().out
                assert "concurrency   1:" in shown and "WARNING" not in shown, shown
                if json.loads(out.read_text())["rows"][-1]["tok_s"] > 0:
                    break
    rows = json.loads(out.read_text())["rows"]
    assert [(r["arm"], r["concurrency"], r["device"]) for r in rows] == [("plain", 1, "test CPU"),
                                                                         ("ngram γ=4", 1, "test CPU")]
    plain, static = rows
    assert plain["tok_s"] > 0 and plain["drafted"] == 0 and set(plain["decisions"]) <= {"none/0"}
    assert static["tok_s"] > 0 and static["drafted"] > 0 and set(static["decisions"]) - {"none/0"} == {"ngram/4"}

    assert bench_gpu_policies.main(["report", "--out", str(out)]) == 0
    shown = capsys.readouterr().out
    table = shown[shown.index("| streams"):].splitlines()
    assert table[0] == "| streams | plain (tok/s) | ngram γ=4 |"
    ratio = static["tok_s"] / plain["tok_s"]
    assert table[2] == f"| 1 | {plain['tok_s']:.1f} | {static['tok_s']:.1f} ({ratio:.2f}×) |"
    saved = json.loads(out.read_text())
    assert saved["table"].splitlines() == table[:3] and saved["devices"] == ["test CPU"]
    assert saved["rows"][1]["ratio"] == pytest.approx(ratio)
    assert out.with_suffix(".png").stat().st_size > 0
