"""The overhead work (vectorised DSDE, cached MetaSD/composite/AdaSpec state) must not
change what any policy decides. Each case runs a seeded simulator episode that visits
batch sizes 1, 64, 8 and 2 (request starts/ends, model and model-free drafters, KL, TV
and confidences all exercised) and compares a digest of every step's decision —
(seq_id, drafter, gamma) per sequence, memory actions, the lengths actually verified —
with the digest recorded from the straightforward implementation before the speed-up.

Changed on purpose (and re-recorded): nightjar's default loss average (per emitted
token; the old per-step mean is kept as loss_average="step" and still matches its
old digest) and the composite policy (drafting stop rule; then the fallback from
a model drafter's gamma-0 plan to the model-free drafters'; then the cost-aware
choice between the model and the model-free plan, see policy/composite.py: _choose;
with model-free drafters only, as served by default, its decisions did not change).

Regenerate (only when a policy's behaviour is changed on purpose):
    .venv/bin/python tests/policy/test_decisions_unchanged.py
"""
import hashlib
import os
import random
import sys
from dataclasses import replace

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from policy import make_policy  # noqa: E402
from policy.environments import Phase, mixed  # noqa: E402
from policy.simulator import simulate  # noqa: E402

CASES = {
    "adaspec": ("adaspec", dict(drafter="draft")),
    "composite": ("composite", dict(drafters=["draft", "ngram"])),
    "composite-model-free": ("composite", dict(drafters=["ngram"])),  # the server's default kind of set
    "dsde": ("dsde", dict(drafter="draft")),
    "dsde-short": ("dsde", dict(drafter="draft", sl_a_max=3, warmup_steps=2, short_window=4, long_window=12)),
    "hf_heuristic": ("hf_heuristic", dict(drafter="draft")),
    "metasd": ("metasd", dict(drafters=["draft", "ngram"], gamma=4)),
    "metasd-exp3": ("metasd", dict(drafters=["draft", "ngram"], gamma=4, algorithm="exp3")),
    "metasd-sh": ("metasd", dict(drafters=["draft", "ngram"], gamma=4, algorithm="sh")),
    "metasd-ducb": ("metasd", dict(drafters=["draft", "ngram"], gamma=4, algorithm="ducb")),
    "metasd-swucb": ("metasd", dict(drafters=["draft", "ngram"], gamma=4, algorithm="swucb")),
    "nightjar": ("nightjar", dict(drafter="draft", loss_average="step")),  # the pre-change loss
    "nightjar-token": ("nightjar", dict(drafter="draft")),
    "banditspec": ("banditspec", dict(drafters=["draft"], gammas=[0, 1, 2, 3, 4])),
}

EXPECTED = {
    'adaspec': 'f0e224586055f035',
    'banditspec': '7f49a58942dbf6fc',
    'composite': 'f57bf0d6b92c0ca7',
    'composite-model-free': '70df8c7e95cdf539',
    'dsde': '055ebe09bf4d2420',
    'dsde-short': '69d527a073cf910e',
    'hf_heuristic': 'a1ce8170d0c32a8b',
    'metasd': 'ba0f0f9e451e7914',
    'metasd-ducb': 'ba0f0f9e451e7914',
    'metasd-exp3': '4c697aa7da7672fd',
    'metasd-sh': '4e2153959f061001',
    'metasd-swucb': 'ba0f0f9e451e7914',
    'nightjar': '5ddad49f9b801757',
    'nightjar-token': '0add376b23ba25df',
}


def episode_env():
    """mixed() requests (two drafters, drifting requests) under short load phases."""
    return replace(mixed(), phases=(Phase(2.0, 1), Phase(15.0, 64, queue=8), Phase(5.0, 8), Phase(3.0, 2)),
                   new_tokens=(24, 64))


def decision_digest(name, params, seed=0):
    pol = make_policy(name, rng=random.Random(seed), **params)
    h = hashlib.sha256()
    decide = pol.decide

    def recording_decide(ctx):
        d = decide(ctx)
        arms = sorted((i, a.drafter or "", a.gamma) for i, a in d.arms.items())
        h.update(repr((ctx.step, arms, [(m.kind, m.drafter) for m in d.memory_actions])).encode())
        return d

    pol.decide = recording_decide
    observe = pol.observe

    def recording_observe(outcome):
        h.update(repr([(s.seq_id, s.gamma, s.accepted) for s in outcome.sequences]).encode())
        observe(outcome)

    pol.observe = recording_observe
    r = simulate(pol, episode_env(), steps=400, seed=seed)
    h.update(repr((r.steps, r.tokens)).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("label", sorted(CASES))
def test_decisions_unchanged_on_seeded_episode(label):
    name, params = CASES[label]
    assert decision_digest(name, params) == EXPECTED[label]


if __name__ == "__main__":
    for label in sorted(CASES):
        print(f"    {label!r}: {decision_digest(*CASES[label])!r},")


def test_composite_fast_paths_match_the_straightforward_formulas():
    """The composite's caches (one global alpha per drafter per step, one answer for all
    sequences without their own evidence, one E-table per distinct alpha, memoised time
    corrections and bucket pull counts) against the plain formulas, on two seeded episodes."""
    import math
    from policy.composite import Composite, shrunk_rate
    from policy.goodput import expected_tokens

    class Reference(Composite):
        def _drafter_for(self, v, usable, a_glob):
            def optimistic(d):
                st = self.seq.get(v.seq_id, {}).get(d)
                return self.alpha(v.seq_id, d) + self.cfg.explore / math.sqrt(1.0 + (st[1] if st else 0.0))
            if len(usable) == 1:
                return usable[0], self.alpha(v.seq_id, usable[0]), optimistic(usable[0])
            best = max(usable, key=optimistic)
            if v.last_drafter in usable and v.last_drafter != best:
                if optimistic(best) - optimistic(v.last_drafter) < self.cfg.switch_margin:
                    best = v.last_drafter
            return best, self.alpha(v.seq_id, best), optimistic(best)

        def _correction(self, bucket, kind, gamma):
            r = self.ratio.get((bucket, kind, gamma))
            if r is None:
                seen = [(abs(g - gamma), v[0], v[1]) for (b, k, g), v in self.ratio.items()
                        if b == bucket and k == kind]
                if not seen:
                    return 1.0
                r = min(seen)[1:]
            ratio, n = r
            return (ratio * n + 1.0) / (n + 1.0)

        def _bonus(self, bucket, gamma, total):
            n = self.pulls.get((bucket, gamma), 0)
            assert total == sum(n for (bk, _), n in self.pulls.items() if bk == bucket) + 1
            return self.cfg.optimism * math.sqrt(math.log(total + 1) / (1 + n))

        @staticmethod
        def _expected_sums(alphas, gamma_max):
            return [sum(expected_tokens(a, g) for a in alphas) for g in range(gamma_max + 1)]

    assert shrunk_rate(3, 4, 0.5, 4) == 0.625
    from policy import base
    base.POLICIES["composite-reference"] = type("R", (Reference,), {"name": "composite-reference"})
    try:
        params = dict(drafters=["draft", "ngram"])
        assert decision_digest("composite", params) == decision_digest("composite-reference", params)
        assert decision_digest("composite", params, seed=3) == decision_digest("composite-reference", params, seed=3)
    finally:
        del base.POLICIES["composite-reference"]
