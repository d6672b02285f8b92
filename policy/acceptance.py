"""Per-token acceptance rate alpha per drafter, as the composite policy estimates it
(docs/algorithms.md, `## composite`), and the per-sequence drafter pick built on it."""
from __future__ import annotations

import math
from typing import Dict, List, NamedTuple, Optional, Sequence


def shrunk_rate(s: float, n: float, prior: float, strength: float) -> float:
    """(s + m * prior) / (n + m): a rate estimate shrunk towards `prior`.

    >>> shrunk_rate(3, 4, 0.5, 4)
    0.625
    """
    return (s + strength * prior) / (n + strength)


class AcceptanceEstimator:
    """Discounted (successes, trials) per drafter over all sequences, and per sequence.

    The global rate is shrunk towards `prior` and discounted slowly (`global_discount`
    per trial batch): it serves every sequence and every gamma. A sequence's own rate is
    shrunk towards the global one and discounted fast (`seq_discount` per step it
    drafts, for all its drafters at once), so drift inside a request is followed within
    a few steps while one step of evidence moves it only a little.

    >>> a = AcceptanceEstimator(["d"], prior=0.5, global_discount=1.0, seq_discount=1.0, shrink=4.0)
    >>> a.observe(7, "d", 3, 4)
    >>> a.global_alpha("d"), a.alpha(7, "d"), a.alpha(8, "d")   # 5/8; (3 + 4 * 5/8) / 8
    (0.625, 0.6875, 0.625)
    """

    def __init__(self, drafters: Sequence[str], prior: float, global_discount: float, seq_discount: float,
                 shrink: float):
        self.prior, self.global_discount, self.seq_discount, self.shrink = prior, global_discount, seq_discount, shrink
        self.glob: Dict[str, List[float]] = {d: [0.0, 0.0] for d in drafters}  # drafter -> [successes, trials]
        self.seq: Dict[int, Dict[str, List[float]]] = {}  # seq_id -> drafter -> [successes, trials]

    def knows(self, drafter: Optional[str]) -> bool:
        return drafter in self.glob

    def global_alpha(self, drafter: str) -> float:
        g = self.glob[drafter]
        return shrunk_rate(g[0], g[1], self.prior, self.shrink)

    def alpha(self, seq_id: int, drafter: str) -> float:
        a_glob = self.global_alpha(drafter)
        s = self.seq.get(seq_id, {}).get(drafter)
        return a_glob if s is None else shrunk_rate(s[0], s[1], a_glob, self.shrink)

    def observe(self, seq_id: int, drafter: str, successes: float, trials: float) -> None:
        self.observe_step(seq_id, ((drafter, successes, trials),))

    def observe_step(self, seq_id: int, evidence) -> None:
        """One step's evidence of a sequence, [(drafter, successes, trials)]: its own
        evidence ages once, however many drafters the step tells about."""
        per = self.seq.setdefault(seq_id, {})
        for st in per.values():  # the sequence moved on: its evidence of every drafter ages
            st[0] *= self.seq_discount
            st[1] *= self.seq_discount
        for drafter, successes, trials in evidence:
            g = self.glob[drafter]
            g[0], g[1] = g[0] * self.global_discount + successes, g[1] * self.global_discount + trials
            st = per.setdefault(drafter, [0.0, 0.0])
            st[0] += successes
            st[1] += trials

    def forget(self, seq_id: int) -> None:
        self.seq.pop(seq_id, None)


class Pick(NamedTuple):
    drafter: str
    alpha: float  # the sequence's estimate for that drafter
    optimistic: float  # alpha + exploration bonus: what the pick was made on


def pick_drafter(stats: Optional[Dict[str, List[float]]], usable: Sequence[str], a_glob: Dict[str, float],
                 last: Optional[str], shrink: float, explore: float, margin: float) -> Pick:
    """The drafter with the best optimistic alpha, alpha + explore / sqrt(1 + n_d) (n_d: the
    sequence's discounted trials of d), staying with the drafter it used last unless
    another is better by at least `margin` (switching flaps otherwise, and a model
    drafter that is left has to catch up when it comes back). `stats`: the sequence's
    own [successes, trials] per drafter (None: no evidence yet: global alphas);
    `a_glob`: this step's global alpha per drafter.

    >>> pick_drafter(None, ["a", "b"], {"a": 0.5, "b": 0.6}, last=None, shrink=4, explore=0.3, margin=0.05)
    Pick(drafter='b', alpha=0.6, optimistic=0.8999999999999999)
    >>> pick_drafter(None, ["a", "b"], {"a": 0.5, "b": 0.52}, last="a", shrink=4, explore=0.3, margin=0.05).drafter
    'a'
    >>> p = pick_drafter({"a": [8.0, 8.0]}, ["a", "b"], {"a": 0.5, "b": 0.6}, None, 4, 0.3, 0.05)
    >>> p.drafter, round(p.alpha, 4), round(p.optimistic, 4)   # (8 + 4 * .5) / 12, + .3 / sqrt(9)
    ('a', 0.8333, 0.9333)
    """
    alpha: Dict[str, float] = {}
    opt: Dict[str, float] = {}
    for d in usable:
        st = stats.get(d) if stats else None
        if st is None:
            alpha[d] = a = a_glob[d]
            opt[d] = a + explore
        else:
            alpha[d] = a = shrunk_rate(st[0], st[1], a_glob[d], shrink)
            opt[d] = a + explore / math.sqrt(1.0 + st[1])
    if len(usable) == 1:
        d = usable[0]
        return Pick(d, alpha[d], opt[d])
    best = max(usable, key=opt.__getitem__)
    if last in opt and last != best and opt[best] - opt[last] < margin:
        best = last
    return Pick(best, alpha[best], opt[best])
