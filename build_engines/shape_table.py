"""The target's step time by shape: T(context bucket, B sequences, t tokens each), measured within
the profile's budget (build_engines/profile_costs.py's BudgetedTable over (B, t) points).

Why by shape and not by token count: on llama.cpp, B sequences of t tokens do not cost what
another shape of the same B x t tokens does (2-core AMD EPYC, AVX2, one profile, 2026-11-27, 1,536
cached tokens: 32 x 1 tokens 262 ms where 8 x 4 took 209; 32 x 2 446 where 16 x 4 took 383: each
sequence reads its own cache), and a table by token count, measured as n / 4 sequences of 4
tokens, read one stream's 1 x 8 as 2 x 4 and 32 streams' decoding as 8 x 4. The policy reads this
table by the iteration's shape (policy/profiles.py `target_step`). The token-batch table every
policy can read (token_batch, target_s) is read off it at profile_costs.shape_for(n), the shapes
it was measured in before, so it costs no time of its own.
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from .profile_costs import TOKEN_BATCH, BudgetedTable, interpolate_row, shape_for

SHAPE_BATCH = (1, 2, 4, 8, 16, 32)  # up to the profiled engine's slots (TargetTimer fills 32)
SHAPE_TOKENS = (1, 2, 3, 4, 6, 8)  # 1 + gamma: decoding, then verifying 1..7 drafts
# shapes of more tokens are not measured but extended along t (near linear there: 32 x 1..6 on
# llama.cpp, 2-core EPYC), as the token-batch table stopped at 128: 32 x 6, 32 x 8 and 16 x 8
# took 16 of a profile's 63 s (2026-11-27)
SHAPE_MAX_TOKENS = 128
# measurement order inside a context bucket: batch-1 speculation and the decode anchors first,
# then verifying at load and the token-batch table's shapes (shape_for), then the rest
SHAPE_PRIORITY = (((1, 1), (1, 2), (1, 4), (1, 8), (8, 1), (32, 1)),
                  ((8, 2), (32, 2), (32, 4), (8, 4), (2, 4), (4, 4), (16, 4)),
                  ((2, 1), (4, 1), (16, 1), (1, 3), (1, 6), (16, 2), (8, 8)))

Shape = Tuple[int, int]


def interpolate_shapes(points: Sequence[Shape], known: Dict[Shape, float]) -> List[float]:
    """A time for every (B, t): measured where known; else linear in t through its B's measured
    points when it has two, else linear in B through its t's when that has two, else from all the
    measured points by token count B x t (where two share a count, the slower).

    >>> known = {(1, 1): 1.0, (1, 3): 3.0, (4, 1): 2.0, (4, 2): 3.0}
    >>> interpolate_shapes([(1, 1), (1, 2), (2, 1), (2, 2), (8, 2)], known)
    [1.0, 2.0, 1.3333333333333333, 2.0, 5.0]
    """
    by_b: Dict[int, Dict[int, float]] = {}
    by_t: Dict[int, Dict[int, float]] = {}
    by_n: Dict[int, float] = {}
    for (b, t), s in known.items():
        by_b.setdefault(b, {})[t] = s
        by_t.setdefault(t, {})[b] = s
        by_n[b * t] = max(s, by_n.get(b * t, 0.0))
    out = []
    for b, t in points:
        if (b, t) in known:
            out.append(known[b, t])
        elif len(by_b.get(b, ())) >= 2:
            out.append(interpolate_row([t], by_b[b])[0])
        elif len(by_t.get(t, ())) >= 2:
            out.append(interpolate_row([b], by_t[t])[0])
        else:
            out.append(interpolate_row([b * t], by_n)[0])
    return out


class ShapeTable(BudgetedTable):
    """BudgetedTable over (B, t) points: SHAPE_PRIORITY's order up to SHAPE_MAX_TOKENS tokens,
    `interpolate_shapes`, and a point bounded by every point with at least its B and its t."""

    point_s = 0.3  # 36 points a context where the token-batch table had 8: fewer repeats each

    def __init__(self, rows: Sequence[int], budget_s: float, repeats: int, label: str,
                 batches: Sequence[int] = SHAPE_BATCH, tokens: Sequence[int] = SHAPE_TOKENS):
        super().__init__(rows, [(b, t) for b in batches for t in tokens], budget_s, repeats, label)
        self.batches, self.tokens = tuple(batches), tuple(tokens)

    def order(self) -> list:
        named = [x for level in SHAPE_PRIORITY for x in level if x in self.xs]
        return [x for x in named + [x for x in self.xs if x not in named] if x[0] * x[1] <= SHAPE_MAX_TOKENS]

    def interpolate(self, xs: Sequence, known: dict) -> List[float]:
        return interpolate_shapes(xs, known)

    @staticmethod
    def dominates(y, x) -> bool:
        return y != x and y[0] >= x[0] and y[1] >= x[1]

    @staticmethod
    def size(x) -> tuple:
        return x[0] * x[1], x[0]

    @staticmethod
    def name(x) -> str:
        return f"B={x[0]:2d} t={x[1]}"

    def profile_fields(self) -> dict:
        """The profile's target part (policy/profiles.py): the (B, t) table with its `measured`
        marks, and the token-batch table read off it at shape_for(n)."""
        per_t = len(self.tokens)

        def nest(rows):  # [bucket][B x t] -> [bucket][B][t]
            return [[row[i:i + per_t] for i in range(0, len(row), per_t)] for row in rows]

        shapes = [shape_for(n) for n in TOKEN_BATCH]
        return {"ctx_buckets": list(self.rows), "verify": "ragged", "batch": list(self.batches),
                "tokens_per_seq": list(self.tokens),
                "shape_target_s": nest(self.table()), "shape_measured": nest(self.measured()),
                "token_batch": list(TOKEN_BATCH),
                "target_s": [self.interpolate(shapes, self.known[r]) for r in self.rows],
                "measured": [[s in self.known[r] for s in shapes] for r in self.rows]}
