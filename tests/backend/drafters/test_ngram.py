import pytest

from backend.drafters import DRAFTERS, make_drafter


def test_ngram_worked_example():
    d = make_drafter("ngram", min_n=2, max_n=2)
    a, b, c, e = 1, 2, 3, 4
    assert d.propose(0, [a, b, c, e, a, b], 3).tokens == [c, e, a]


def test_ngram_prefers_longest_and_latest_match():
    d = make_drafter("ngram", min_n=1, max_n=3)
    toks = [7, 1, 2, 3, 9, 1, 2, 8, 5, 1, 2]
    # 3-gram [5,1,2] no earlier match; 2-gram [1,2] latest earlier occurrence is followed by 8
    assert d.propose(0, toks, 2).tokens == [8, 5]


def test_ngram_incremental_index_matches_fresh_index():
    d1, d2 = make_drafter("ngram"), make_drafter("ngram")
    seq = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    for n in range(3, len(seq)):
        assert d1.propose(0, seq[:n], 4).tokens == d2.propose(n, seq[:n], 4).tokens


def test_ngram_no_match_and_release():
    d = make_drafter("ngram")
    assert d.propose(0, [1, 2, 3], 4).tokens == []
    d.release(0)
    assert 0 not in d.index


@pytest.mark.parametrize("name", sorted(DRAFTERS))
def test_drafter_contract(name):
    """Every drafter: valid ids from the context's vocabulary, at most gamma, q one-hot or a distribution."""
    d = make_drafter(name)
    seq = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    for gamma in (0, 1, 3, 8):
        draft = d.propose(1, seq, gamma)
        assert len(draft) <= gamma
        assert all(isinstance(t, int) and t >= 0 for t in draft.tokens)
        assert len(draft.confidences) == len(draft)
        if draft.q is not None:
            assert draft.q.shape[0] == len(draft)
            assert abs(float(draft.q.sum(-1).mean()) - 1) < 1e-4
    d.commit(1, seq + [7])
    d.release(1)


def test_unknown_drafter():
    with pytest.raises(ValueError, match="unknown drafter"):
        make_drafter("nope")
