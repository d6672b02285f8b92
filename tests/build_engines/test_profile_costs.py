"""The step-time profile is measured within its time budget: what does not fit is interpolated,
and what the policies read first is measured first."""
import json

import pytest

from build_engines import profile_costs
from build_engines.profile_costs import BudgetedTable, interpolate_row
from policy.profiles import StepTimeProfile


class FakeClock:
    """time.monotonic for the profiler, advanced by the simulated calls it times."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def engine_cost(ctx, n):
    """A slow engine's step: 50 ms + 40 ms a token + attention over the cache."""
    return 0.05 + 0.04 * n + 1e-5 * ctx * n


@pytest.fixture
def clock(monkeypatch):
    c = FakeClock()
    monkeypatch.setattr(profile_costs.time, "monotonic", c)
    return c


def simulated(clock, calls):
    def measure(ctx, n, repeats):
        calls.append((ctx, n, repeats))
        clock.now += (repeats + 1) * engine_cost(ctx, n)  # the warm-up call too
        return engine_cost(ctx, n)
    return measure


def test_a_budget_that_fits_everything_measures_every_point(clock):
    calls = []
    table = BudgetedTable((128, 512), (1, 2, 4, 8), budget_s=1000, repeats=3, label="t")
    table.run(simulated(clock, calls))
    assert table.measured() == [[True] * 4, [True] * 4]
    assert table.table() == [[engine_cost(c, n) for n in (1, 2, 4, 8)] for c in (128, 512)]


def test_a_slow_engine_gets_fewer_wider_points_within_the_budget(clock):
    calls = []
    xs = profile_costs.TOKEN_BATCH
    table = BudgetedTable(profile_costs.CTX_BUCKETS, xs, budget_s=60, repeats=5, label="t")
    table.run(simulated(clock, calls))
    first_points = sum((r + 1) * engine_cost(c, n) for c, n, r in calls if n == 1)
    assert clock.now <= 60 + first_points  # only each context's first point may exceed its share
    measured = table.measured()
    assert all(row[0] for row in measured)  # n=1 in every context bucket
    assert not all(all(row) for row in measured)  # some points did not fit: interpolated
    assert sum(map(sum, measured)) >= 2 * len(measured)  # but more than one point a context
    # PRIORITY's order: within a context, the token batches policies read most come first
    for row in measured:
        assert all(m for x, m in zip(xs, row) if x in profile_costs.PRIORITY[0])
    # slow points get fewer repeats
    assert max(r for c, n, r in calls if engine_cost(c, n) > 0.5) < 5
    # the filled table is the measured points joined by straight lines, as the policies read them
    for c, row in zip(profile_costs.CTX_BUCKETS, table.table()):
        assert len(row) == len(xs) and all(b >= a for a, b in zip(row, row[1:]))
        assert row[0] == pytest.approx(engine_cost(c, 1))
        assert row[-1] == pytest.approx(engine_cost(c, xs[-1]), rel=0.05)  # linear engine: exact within noise


def test_interpolation_joins_measured_points_and_extends_the_last_segment():
    assert interpolate_row([1, 2, 4, 8, 16], {1: 1.0, 4: 4.0, 8: 6.0}) == [1.0, 2.0, 4.0, 6.0, 10.0]


def test_a_real_llama_cpp_profile_within_a_tight_budget(checkpoint, tmp_path, built_drafter):
    """The served engine, measured for real within 5 s: every point the policies read is filled,
    each context's first point is measured, and the policy loads the file. A model drafter built
    later gets its tables measured; the target's are kept."""
    assert profile_costs.main(["--engine", "llama.cpp", "--checkpoint", str(checkpoint), "--out-dir", str(tmp_path),
                               "--drafter-dir", str(tmp_path / "no-drafters"), "--repeats", "2",
                               "--budget-s", "5"]) == 0
    (path,) = [p for p in tmp_path.glob("*.json") if not p.name.endswith(".switch.json")]
    prof = json.loads(path.read_text())
    assert prof["profile_version"] == profile_costs.PROFILE_VERSION and prof["drafter"] == "ngram"
    assert prof["elapsed_s"] < 5 + 20  # the budget, plus the mandatory first points and fills
    assert all(row[0] for row in prof["measured"])
    assert all(len(row) == len(prof["token_batch"]) and min(row) > 0 for row in prof["target_s"])
    p = StepTimeProfile.load(str(path))
    assert p.target(100, 1) > 0 and p.target(1000, 64) > p.target(1000, 1)
    # up to date: a second run measures nothing
    before = path.stat().st_mtime_ns
    profile_costs.main(["--engine", "llama.cpp", "--checkpoint", str(checkpoint), "--out-dir", str(tmp_path),
                        "--drafter-dir", str(tmp_path / "no-drafters")])
    assert path.stat().st_mtime_ns == before
    chat = built_drafter("chat")
    profile_costs.main(["--engine", "llama.cpp", "--checkpoint", str(checkpoint), "--out-dir", str(tmp_path),
                        "--drafter-dir", str(chat.parent), "--repeats", "2", "--budget-s", "3"])
    again = json.loads(path.read_text())
    assert again["drafter"].startswith(chat.name + "@") and again["target_s"] == prof["target_s"]
    assert all(row[0] for row in again["draft_measured"]) and again["switch_cost"]["seconds"][0][0] > 0


@pytest.mark.parametrize("module", ["build_engines.profile_costs", "build_engines.shape_table"])
def test_docstring_examples(module):
    import doctest
    import importlib
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0


def test_a_point_slower_than_a_larger_one_is_measured_again_then_bounded():
    """A busy neighbour during the first measurements (once: 260 ms for one token, 1.3 s for two,
    against 6 and 14 ms) must not leave a table in which fewer tokens cost more."""
    calls = []

    def measure(row, n, repeats):
        calls.append(n)
        if n == 1:
            return 0.26 if calls.count(1) == 1 else 0.006  # busy once, fine when measured again
        if n == 2:
            return 1.3  # busy both times: bounded by n=4's time
        return 0.005 * n

    table = BudgetedTable((128,), (1, 2, 4, 8), budget_s=1000, repeats=3, label="t")
    table.run(measure)
    assert table.table() == [[0.006, 0.02, 0.02, 0.04]]
    assert calls.count(1) == 2 and calls.count(2) >= 2 and calls.count(4) == 2  # each with its bound


def test_a_larger_point_measured_in_a_fast_moment_is_measured_again_with_the_smaller():
    """The host's speed moves between points: a larger point timed in a fast minute (8 tokens as
    cheap as 4) is measured again beside the smaller one, not kept as the smaller one's bound."""
    calls = []

    def measure(row, n, repeats):
        calls.append(n)
        if n == 8 and calls.count(8) == 1:
            return 0.018  # a fast moment: as cheap as n=4 would be at that speed
        return 0.005 * n

    table = BudgetedTable((128,), (1, 2, 4, 8), budget_s=1000, repeats=3, label="t")
    table.run(measure)
    assert table.table() == [[0.005, 0.01, 0.02, 0.04]]
    assert calls.count(8) == 2 and calls.count(4) == 2
