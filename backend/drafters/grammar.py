"""The grammar drafter: proposes the tokens a request's grammar forces next (structured output).

In JSON that follows a schema, the keys, the punctuation around them and single-choice values
are forced: `{"name": "` before a string, `", "age": ` after it. Those tokens are drafts the
target can hardly refuse (it verifies them as any draft, so output stays the constrained
target's), and they cost one verification position each instead of one step each. llguidance
computes them (backend/generation/guided.py, GuideState.forced). A sequence without a grammar,
or at a point where the grammar forces nothing, gets an empty draft: with lookahead the policy
sees that and picks another drafter for it.

Example: a schema with required keys name, age; after `{"name": "Ada` the drafter proposes
nothing (the string may go on); after `{"name": "Ada",` it proposes ` "`, `age`, `":`, ` `.
"""
from __future__ import annotations

from typing import Dict, Sequence

from .base import Draft, Drafter, register


@register
class GrammarDrafter(Drafter):
    name = "grammar"
    is_model = False
    wants_guides = True  # the engine loop shares its guided sequences' grammar states (`guides`)

    def __init__(self):
        self.guides: Dict[int, object] = {}  # seq_id -> GuideState; the engine loop's own dict once bound

    def propose(self, seq_id: int, tokens: Sequence[int], gamma: int) -> Draft:
        state = self.guides.get(seq_id)
        if state is None or gamma <= 0:
            return Draft(tokens=[])
        out = state.forced(tokens, gamma)
        return Draft(tokens=out, confidences=[1.0] * len(out))
