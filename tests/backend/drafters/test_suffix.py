import random
import threading

import pytest

from backend.drafters import make_drafter
from backend.drafters.suffix import _SEP, SuffixStore, vote

a, b, c, d, e, x, y = 1, 2, 3, 4, 5, 6, 7


def finish(drafter, seq_id, prompt, output):
    """A request the drafter first sees at its prompt, then commits its output and leaves."""
    drafter.propose(seq_id, prompt, 1)
    drafter.commit(seq_id, prompt + output)
    drafter.release(seq_id)


def test_suffix_worked_example():
    # The module docstring's example.
    s = make_drafter("suffix")
    finish(s, 1, [9, 9, 8], [a, b, c, d, e])
    assert len(s.store) == 5  # the output only, not the prompt
    assert s.propose(2, [x, y, a, b], 3).tokens == [c, d, e]

    s = make_drafter("suffix", confidence="frequency")
    for i, out in enumerate([[a, b, c], [a, b, c], [a, b, d]]):
        finish(s, 10 + i, [x], out)
    draft = s.propose(2, [y, a, b], 3)
    assert draft.tokens == [c] and draft.confidences == [pytest.approx(2 / 3)]
    assert draft.q is None


def test_vote_worked_example():
    assert vote([[3, 4], [3, 5], [3, 5], [6]], 2) == ([3, 5], [0.75, pytest.approx(2 / 3)])
    assert vote([], 3) == ([], [])


def test_own_context_like_prompt_lookup():
    s = make_drafter("suffix")
    assert s.propose(0, [a, b, c, d, a, b], 3).tokens == [c, d, a]
    assert s.propose(0, [a, b, c], 3).tokens == []  # shorter than seen: index rebuilt, no match


def test_prefers_longer_match_over_more_frequent():
    s = make_drafter("suffix")
    finish(s, 1, [9], [x, a, b, c])
    finish(s, 2, [9], [y, a, b, d])
    finish(s, 3, [9], [y, a, b, d])
    assert s.propose(4, [8, x, a, b], 2).tokens == [c]  # "x a b" (3) beats "a b" -> d (2 of 3)
    assert s.propose(5, [8, 8, a, b], 2).tokens == [d]  # only "a b": the most frequent wins


def test_match_longer_than_anchor_is_extended():
    s = make_drafter("suffix", anchor=2, max_match=8)
    finish(s, 1, [9], [5, 6, 1, 2, 3, 7])
    finish(s, 2, [9], [4, 6, 1, 2, 3, 8])
    finish(s, 3, [9], [4, 4, 1, 2, 3, 8])
    # anchor "2 3" hits all three; backward extension finds "5 6 1 2 3" only in the first
    assert s.propose(4, [5, 6, 1, 2, 3], 1).tokens == [7]


def test_continuations_stop_at_output_boundary_and_min_match():
    s = make_drafter("suffix", min_match=2)
    finish(s, 1, [9], [a, b, c])
    finish(s, 2, [9], [d, e])
    assert s.propose(3, [x, a, b], 5).tokens == [c]  # not [c, <sep>, d, e]
    assert s.propose(4, [x, y, c], 5).tokens == []  # a 1-token match is below min_match


def test_spec_factor_limits_draft_to_match_length():
    s = make_drafter("suffix", spec_factor=1.0)
    finish(s, 1, [9], [a, b, c, d, e, x, y])
    assert s.propose(2, [8, a, b], 6).tokens == [c, d]  # match length 2 -> at most 2


def generate(drafter, seq_id, prompt, text, gamma):
    """Greedy loop with an oracle target that emits `text`: returns verification steps used."""
    tokens, steps = list(prompt), 0
    while len(tokens) < len(prompt) + len(text):
        draft = drafter.propose(seq_id, tokens, gamma).tokens
        truth = text[len(tokens) - len(prompt):]
        n = 0
        while n < len(draft) and n < len(truth) and draft[n] == truth[n]:
            n += 1
        tokens += truth[: n + 1]  # accepted drafts + the target's token
        drafter.commit(seq_id, tokens)
        steps += 1
    drafter.release(seq_id)
    return steps


def test_cross_request_reuse_gives_long_drafts():
    rng = random.Random(0)
    text = [rng.randrange(100, 10_000) for _ in range(60)]  # no repeats within the text
    s = make_drafter("suffix")
    first = generate(s, 1, [11, 12, 13], text, gamma=8)
    assert first == len(text)  # nothing to match the first time
    assert len(s.store) == len(text)
    second = generate(s, 2, [21, 22, 23], text, gamma=8)
    # one plain step to get 1 token, another for a 2-token suffix, then 9 tokens per step
    assert second <= 2 + -(-(len(text) - 2) // 9)
    draft = s.propose(3, [31] + text[:10], 8)
    assert draft.tokens == text[10:18]


def test_shared_store_between_drafters():
    store = SuffixStore(max_store_tokens=100)
    s1, s2 = make_drafter("suffix", store=store), make_drafter("suffix", store=store)
    finish(s1, 1, [9], [a, b, c, d])
    assert s2.propose(1, [x, a, b], 2).tokens == [c, d]


def test_memory_cap_evicts_oldest_output():
    s = make_drafter("suffix", max_store_tokens=8)
    finish(s, 1, [9], [a, b, c])
    finish(s, 2, [9], [x, y, d, e])
    assert len(s.store) == 7 and s.store.num_outputs == 2
    assert s.propose(3, [8, a, b], 1).tokens == [c]
    finish(s, 4, [9], [30, 31, 32])  # 10 > 8: the oldest output goes
    assert len(s.store) == 7 and s.store.num_outputs == 2
    assert s.propose(3, [8, a, b], 1).tokens == []
    assert s.propose(5, [8, x, y], 2).tokens == [d, e]
    finish(s, 6, [9], list(range(40, 60)))  # longer than the cap: its tail is kept
    assert len(s.store) == 8 and s.store.num_outputs == 1
    assert s.propose(7, [8, 52, 53], 2).tokens == [54, 55]
    assert s.propose(7, [8, 40, 41], 2).tokens == []
    assert_store_consistent(s.store)


def assert_store_consistent(store: SuffixStore):
    """Every indexed position is live, follows its n-gram, and the index equals a rebuild."""
    idx = store._index
    live = idx.buf[idx.start - idx.base:]
    assert sum(t != _SEP for t in live) == len(store) <= store.max_store_tokens
    assert live.count(_SEP) == store.num_outputs
    fresh = SuffixStore(store.max_store_tokens, idx.ns.start, idx.ns.stop - 1, idx.per_key)
    doc: list = []
    for t in live:
        if t == _SEP:
            fresh.add(doc)
            doc = []
        else:
            doc.append(t)
    shift = idx.start - fresh._index.start
    assert {k: [p - shift for p in v] for k, v in idx.table.items()} == fresh._index.table


def test_thread_safety_smoke():
    rng = random.Random(1)
    texts = [[rng.randrange(50) for _ in range(40)] for _ in range(6)]
    s = make_drafter("suffix", max_store_tokens=150)
    errors = []

    def worker(w):
        try:
            r = random.Random(w)
            for i in range(25):
                text = texts[r.randrange(len(texts))]
                generate(s, w * 1000 + i, [r.randrange(50)], text, gamma=r.randrange(1, 6))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert not s._seqs  # every sequence released
    assert 0 < len(s.store) <= 150
    assert_store_consistent(s.store)


def test_bad_params():
    with pytest.raises(ValueError, match="min_match"):
        make_drafter("suffix", min_match=5, anchor=4)
    with pytest.raises(ValueError, match="confidence"):
        make_drafter("suffix", confidence="p")
