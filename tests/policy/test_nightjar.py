import random

import pytest

from policy import make_policy
from policy.nightjar import BinSchedule, exploit_gamma
from policy.profiles import SwitchCostTable
from helpers import ctx, outcome, seq


def test_bin_block_schedule_worked_example():
    # H_B = 2^(j-1); a bin lasts sqrt(H) rounds, a block sqrt(H) bins.
    # H=1: 1 bin x 1 round; H=2: 1 x 1; H=4: 2 bins x 2; H=8: 2 x 2 (sqrt 8 = 2.83); H=16: 4 x 4
    s = BinSchedule()
    starts, trace = [], []
    for t in range(1, 27):
        if s.bin_start:
            starts.append(t)
        trace.append((s.j, s.H))
        s.advance()
    assert starts == [1, 2, 3, 5, 7, 9, 11, 15, 19, 23]
    assert trace[10] == (5, 16) and trace[25] == (5, 16)
    assert (s.j, s.H, s.b, s.tau) == (6, 32, 1, 1) and s.explore_prob == 1.0  # a new block starts at 27


def test_exploitation_prices_switching_cost():
    means = {0: 0.040, 1: 0.036, 4: 0.030}
    assert exploit_gamma(means, prev_gamma=3, c_switch_s=1.0) == 4  # no switch: best mean
    assert exploit_gamma(means, prev_gamma=0, c_switch_s=0.02) == 4  # 0.030 + 0.005 < 0.040
    assert exploit_gamma(means, prev_gamma=0, c_switch_s=0.05) == 0  # 0.0425, 0.086 > 0.040
    assert exploit_gamma({}, 0, 0.0) is None


def test_switch_cost_table_default_and_file(tmp_path):
    t = SwitchCostTable.default()
    assert t(0, 8) == 0.0
    assert t(64, 1) < t(64, 8) < t(256, 8)
    p = tmp_path / "c.json"
    p.write_text('{"l_max": [10, 100], "batch": [1, 4], "seconds": [[0.01, 0.02], [0.05, 0.11]]}')
    f = SwitchCostTable.load(str(p))
    assert f(10, 1) == pytest.approx(0.01) and f(100, 4) == pytest.approx(0.11)
    assert f(55, 1) == pytest.approx(0.03)  # linear in L_max


def test_locks_gamma_within_a_bin():
    pol = make_policy("nightjar", drafter="draft", gamma_max=4, elastic=False, rng=random.Random(3))
    gammas = []
    for t in range(40):
        d = pol.decide(ctx(batch=2, step=t))
        g = d.arm_for(0).gamma
        gammas.append(g)
        pol.observe(outcome([seq(0, gamma=g, accepted=min(g, 1)), seq(1, gamma=g, accepted=0)], total=0.05))
    # block j=5 (H=16) runs steps 11..26 as 4 bins of 4 locked steps
    for start in (10, 14, 18, 22):
        assert len(set(gammas[start:start + 4])) == 1


def test_loss_is_averaged_per_emitted_token():
    # two steps at (B=1, gamma=2): 50 ms for 1 token, 60 ms for 3 tokens
    # per token: (0.05 + 0.06) / 4 = 27.5 ms; per step: (0.05/1 + 0.06/3) / 2 = 35 ms
    for average, expected in (("token", 0.0275), ("step", 0.035)):
        pol = make_policy("nightjar", drafter="draft", elastic=False, loss_average=average, rng=random.Random(0))
        for accepted, total in ((0, 0.05), (2, 0.06)):
            pol.observe(outcome([seq(0, gamma=2, accepted=accepted)], total=total))
        assert pol._means(1)[2] == pytest.approx(expected)
