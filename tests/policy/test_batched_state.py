"""The batched per-sequence state (MetaSD's `UCBRows`, DSDE's `KlHistories`) must give
exactly what the scalar rules give, whatever the batches do: sequences joining and
leaving, batches changing order and membership, more sequences than the initial
capacity (the arrays grow), and the same batch repeating (its rows stay in a block
that is written back only when the batch changes)."""
import math
import random

import numpy as np
import pytest

from policy import make_policy
from policy.bandits import UCB, UCBRows
from policy.dsde import predicted_length, stability_factor, wvir
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


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("arms", [2, 3])
def test_ucb_rows_equal_one_ucb_per_key(seed, arms):
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
        picks = rows.select(batch)
        assert picks == [scalar[k].select() for k in batch]
        rewards = [rng.random() for _ in batch]  # continuous: exact ties do not happen
        rows.update(batch, picks, rewards)
        for k, a, r in zip(batch, picks, rewards):
            scalar[k].update(a, r)
        k = rng.choice(batch)
        assert rows.mean(k, picks[0]) == pytest.approx(scalar[k].mean(picks[0]))


def _scalar_length(history_newest_first, k, pol):
    c = pol.cfg
    if len(history_newest_first) == 1:
        return pol.sl_max
    sf = stability_factor(sum(history_newest_first[:k]) / k)
    return predicted_length(sf, wvir(history_newest_first, c.delta, c.short_window, c.long_window),
                            pol.sl_max, c.sl_min)


@pytest.mark.parametrize("seed", [0, 1])
def test_dsde_lengths_equal_the_scalar_rule(seed):
    rng = random.Random(seed)
    pol = make_policy("dsde", drafter="draft", warmup_steps=0, batch_cap=False, rng=random.Random(0))
    hist: dict = {}
    for gone, batch in _episodes(seed, steps=200):
        for k in gone:
            pol.on_request_end(k)
            hist.pop(k, None)
        k_new = rng.randint(1, 5)
        seqs = []
        for i in batch:
            vals = [rng.choice([rng.uniform(0.0, 0.05), rng.uniform(0.0, 1.5)]) for _ in range(k_new)]
            hist[i] = list(reversed(vals)) + hist.get(i, [])
            seqs.append(seq(i, gamma=k_new, accepted=0, kl=vals))
        pol.observe(outcome(seqs))
        want = [_scalar_length(hist[i][: pol.cfg.long_window], k_new, pol) for i in batch]
        got = [pol.length_for(i) for i in batch]
        assert got == want
        view = StepContext(0, [SequenceView(i, 128, 0, 128, 0.0) for i in batch], ctx().drafters)
        assert [pol.decide(view).arm_for(i).gamma for i in batch] == want
    assert math.isfinite(float(np.sum(pol.kl.data)))
