"""The vectorised paths (MetaSD's `UCBRows`, DSDE's `KlHistories` + `lengths_from_moments`),
kept because at 64 sequences a Python loop per sequence costs several times the
decision budget, must follow the scalar rules (`bandits.UCB` / `ucb1_index`,
`dsde.sequence_length`) up to float rounding, whatever the batches do: sequences
joining and leaving, batches changing order and membership, more sequences than the
initial capacity (the arrays grow), and the same batch repeating (its rows stay in a
block that is written back only when the batch changes). Discrete choices (arm, length)
must agree wherever the scalar rule is not within rounding of a tie or a boundary."""
import math
import random

import numpy as np
import pytest

from policy import make_policy
from policy.bandits import UCB, UCBRows, ucb1_index
from policy.dsde import moment_weights, sequence_length, stability_factor, wvir, wvir_from_moments
from policy.types import SequenceView, StepContext
from helpers import ctx, outcome, seq


def _episodes(seed: int, steps: int = 300, keys: int = 90):
    """Per step: the batch (ordered keys), plus keys that end before it."""
    rng = random.Random(seed)
    live: list = []
    nxt = 0
    for _ in range(steps):
        if live and rng.random() < 0.15:
            gone = rng.sample(live, rng.randint(1, min(4, len(live))))
            live = [k for k in live if k not in gone]
        else:
            gone = []
        while len(live) < rng.randint(1, 70) and nxt < 10 * keys:
            live.append(nxt)
            nxt += 1
        batch = rng.sample(live, len(live)) if rng.random() < 0.3 else list(live)  # sometimes reordered
        if rng.random() < 0.2:
            batch = batch[: max(1, len(batch) // 2)]  # sometimes a subset
        yield gone, batch


TOL = 1e-9


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("arms", [2, 3])
def test_ucb_rows_follow_one_ucb_per_key(seed, arms):
    rng = random.Random(seed)
    rows = UCBRows(arms, random.Random(99), beta=0.5, capacity=4)
    scalar: dict = {}
    for gone, batch in _episodes(seed):
        for k in gone:
            rows.remove(k)
            scalar.pop(k, None)
        for k in batch:
            if k not in scalar:
                scalar[k] = UCB(arms, random.Random(99), beta=0.5)
                rows.reset(k)
        index = rows.indices(batch)
        for k, row in zip(batch, index):
            u = scalar[k]
            want = [ucb1_index(u.mean(a), u.counts[a], u.t, u.beta) for a in range(arms)]
            assert row.tolist() == pytest.approx(want, rel=TOL, abs=TOL)
        picks = rows.select(batch)
        for k, row, pick in zip(batch, index, picks):
            top = sorted(row, reverse=True)
            if top[0] == np.inf or top[0] - top[1] > TOL:  # no tie within rounding: one right answer
                assert pick == scalar[k].select()
        rewards = [rng.random() for _ in batch]
        rows.update(batch, picks, rewards)
        for k, a, r in zip(batch, picks, rewards):
            scalar[k].update(a, r)
        k = rng.choice(batch)
        assert rows.mean(k, picks[0]) == pytest.approx(scalar[k].mean(picks[0]), rel=TOL)


@pytest.mark.parametrize("seed", [0, 1])
def test_dsde_lengths_follow_the_scalar_rule(seed):
    rng = random.Random(seed)
    pol = make_policy("dsde", drafter="draft", warmup_steps=0, batch_cap=False, rng=random.Random(0))
    c = pol.cfg
    hist: dict = {}
    for gone, batch in _episodes(seed, steps=200):
        for k in gone:
            pol.on_request_end(k)
            hist.pop(k, None)
        k_new = rng.randint(1, 5)
        seqs = []
        for i in batch:
            vals = [rng.choice([rng.uniform(0.0, 0.05), rng.uniform(0.0, 1.5)]) for _ in range(k_new)]
            hist[i] = (list(reversed(vals)) + hist.get(i, []))[: c.long_window]
            seqs.append(seq(i, gamma=k_new, accepted=0, kl=vals))
        pol.observe(outcome(seqs))
        # the continuous quantities, from the same history rows the policy keeps
        m = moment_weights(c.delta, c.short_window, c.long_window, k_new).T @ pol.kl.rows_of(batch).T
        got_wvir = wvir_from_moments(m)
        for i, w, two_mu in zip(batch, got_wvir, m[8]):
            h = hist[i]
            assert stability_factor(two_mu / 2) == pytest.approx(stability_factor(sum(h[:k_new]) / k_new), rel=TOL)
            if len(h) > 1:
                assert w == pytest.approx(wvir(h, c.delta, c.short_window, c.long_window), rel=1e-6, abs=1e-9)
        view = StepContext(0, [SequenceView(i, 128, 0, 128, 0.0) for i in batch], ctx().drafters)
        decided = pol.decide(view)
        for i in batch:
            h = hist[i]
            want = sequence_length(h, k_new, pol.sl_max, c.sl_min, c.delta, c.short_window, c.long_window)
            if len(h) > 1:
                x = stability_factor(sum(h[:k_new]) / k_new) * wvir(h, c.delta, c.short_window, c.long_window)
                line = (1 - x) * (pol.sl_max - c.sl_min) + c.sl_min
                if x <= 1 and abs(line - round(line)) < 1e-6:
                    continue  # on a boundary: rounding may put it either side
            assert pol.length_for(i) == decided.arm_for(i).gamma == want
    assert math.isfinite(float(np.sum(pol.kl.data)))
