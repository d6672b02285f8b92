"""Structured output in the loop's step (backend/loop/forced_rows.py) with stand-in grammar
states: the states are shared with the grammar drafter, drafts are cut to the grammar, and a step
computes the logits of every row but those of forced draft tokens (never its last row); then the
left-out rows become a point mass on their draft token. With llguidance and the served engine,
lossless: tests/backend/generation/test_guided.py."""
import doctest
import logging

import torch

from backend.drafters import make_drafter
from backend.generation.request import GenerationRequest
from backend.generation.sequence import Sequence
from backend.loop import forced_rows
from backend.loop.forced_rows import GuidedSequences
from policy.speculator import Draft


class State:
    """A grammar that allows `allowed` tokens of a draft and forces the draft tokens `forced` says."""

    def __init__(self, allowed=99, forced=(), fails=False):
        self.allowed, self.forced, self.fails = allowed, list(forced), fails

    def valid_prefix(self, tokens, draft):
        return min(self.allowed, len(draft))

    def forced_rows(self, tokens, drafts):
        if self.fails:
            raise RuntimeError("the grammar's masks failed")
        return (self.forced + [False] * len(drafts))[: len(drafts)]


def seq(seq_id, guide=None):
    return Sequence(seq_id=seq_id, request=GenerationRequest("x", max_new_tokens=16), sink=None, prompt_ids=[1], tokens=[1, 2],
                    detok=None, eos_ids=frozenset(), guide=guide)


def test_the_states_are_shared_with_the_drafters_that_want_them():
    grammar, ngram = make_drafter("grammar"), make_drafter("ngram")
    guides = GuidedSequences([grammar, ngram])
    guided, plain = seq(1, State()), seq(2)
    guides.add(guided)
    guides.add(plain)
    assert grammar.guides is guides.states and list(guides.states) == [1] and len(guides) == 1
    assert not hasattr(ngram, "guides") or ngram.guides is not guides.states
    guides.remove(1)
    guides.remove(2)  # a sequence without a grammar: nothing to forget
    assert not guides and grammar.guides == {}


def test_drafts_are_cut_where_they_leave_the_grammar():
    guides = GuidedSequences([])
    guides.add(seq(1, State(allowed=2)))
    assert guides.trim(1, [1, 2], [5, 6, 7]) == 2
    assert guides.trim(2, [1, 2], [5, 6, 7]) == 3  # no grammar: the whole draft


def test_every_row_but_forced_draft_tokens_and_always_the_last():
    guides = GuidedSequences([])
    batch = [seq(1), seq(2, State(forced=[True, False, True])), seq(3, State(forced=[True])), seq(4, State())]
    for s in batch:
        guides.add(s)
    drafts = [Draft([5, 6]), Draft([5, 6, 7]), Draft([]), Draft([8])]
    # seq 1: no grammar; seq 2: draft tokens 0 and 2 forced; seq 3: no draft; seq 4: nothing forced
    assert guides.logit_rows(batch, drafts) == [[0, 1, 2], [1, 3], [0], [0, 1]]
    last_forced = [seq(5, State(forced=[True, True]))]
    guides.add(last_forced[0])
    assert guides.logit_rows(last_forced, [Draft([5, 6])]) == [[2]]  # the bonus row is computed


def test_none_when_every_row_is_needed():
    batch, drafts = [seq(1, State(forced=[True]))], [Draft([5])]
    assert GuidedSequences([]).logit_rows(batch, drafts) is None  # no guided sequence running
    off = GuidedSequences([], skip_forced=False)
    off.add(batch[0])
    assert off.logit_rows(batch, drafts) is None
    guides = GuidedSequences([])
    guides.add(seq(2, State(forced=[False])))
    assert guides.logit_rows([seq(2, State(forced=[False]))], drafts) is None  # nothing forced


def test_a_grammar_whose_masks_fail_gets_every_row(caplog):
    guides = GuidedSequences([])
    broken, forced = seq(1, State(fails=True)), seq(2, State(forced=[True, True]))
    guides.add(broken)
    guides.add(forced)
    with caplog.at_level(logging.ERROR, logger="specserve.loop"):
        rows = guides.logit_rows([broken, forced], [Draft([5, 6]), Draft([5, 6])])
    assert rows == [[0, 1, 2], [2]] and "masks failed" in caplog.text


def test_left_out_rows_become_a_point_mass_on_their_draft_token():
    assert doctest.testmod(forced_rows).failed == 0
    computed = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
    full = forced_rows.with_forced_rows(computed, [[2], [1, 0]], [[0, 1], [2]])  # b's rows 0, 1 left out
    assert torch.equal(full[:2], computed[:2]) and torch.equal(full[4], computed[2])
    assert full[2].tolist() == [float("-inf"), 0.0, float("-inf")]
    assert full[3].tolist() == [0.0, float("-inf"), float("-inf")]
