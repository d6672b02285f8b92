"""The contract every drafter keeps (n-gram, suffix, and a real model drafter with its own KV cache):
proposals are valid token ids within γ, q is a distribution, confidences match q, and
rolling back rejected drafts leaves the drafter as if they had never been proposed."""
import json

import pytest
import torch
from safetensors.torch import load_file

from backend.drafters import DraftRequest, make_drafter
from backend.drafters.model import ModelDrafter
from backend.engines.torch_llama import TorchLlama
from build_engines.student import StudentLlama

VOCAB = 49152
CTX = 256


@pytest.fixture(scope="module")
def drafter_dir(checkpoint, tmp_path_factory):
    """A real (untrained) 1-layer drafter artifact: the target's first layer + its embedding/head,
    written by the same code the distillation build uses."""
    cfg = json.loads((checkpoint / "config.json").read_text())
    w = {k.removeprefix("model."): v for k, v in load_file(str(checkpoint / "model.safetensors")).items()}
    out = tmp_path_factory.mktemp("drafter") / "tiny-drafter"
    vocab = torch.unique(torch.cat([torch.arange(8192), torch.tensor(TOKENS)]))  # a draft vocabulary
    StudentLlama(cfg, w, layers=1, vocab_ids=vocab).save(out, dtype=torch.float32)
    return out


@pytest.fixture(scope="module")
def target(checkpoint):
    return TorchLlama(checkpoint, dtype="fp32", max_slots=4, max_context=CTX)


def new_drafter(kind, drafter_dir, target=None):
    if kind == "model":
        return ModelDrafter("tiny", drafter_dir, dtype="fp32", max_slots=4, max_context=CTX, target=target)
    return make_drafter(kind)


KINDS = ["ngram", "suffix", "model"]
TOKENS = [1, 504, 3458, 314, 260, 1345, 28, 504, 3458, 314, 260, 1345, 28, 504, 3458]


@pytest.mark.parametrize("kind", KINDS)
def test_proposals_are_valid_tokens_and_q_is_a_distribution(kind, drafter_dir):
    draft = None
    d = new_drafter(kind, drafter_dir)
    for gamma in (1, 3, 6):
        draft = d.propose(7, TOKENS, gamma)
        assert len(draft) <= gamma
        assert all(isinstance(t, int) and 0 <= t < VOCAB for t in draft.tokens)
        assert len(draft.confidences) == len(draft.tokens)
        assert all(0.0 <= c <= 1.0 for c in draft.confidences)
        if draft.q is not None:
            assert draft.q.shape == (len(draft), VOCAB)
            assert torch.all(draft.q >= 0)
            assert torch.allclose(draft.q.sum(-1), torch.ones(len(draft)), atol=1e-4)
            for j, t in enumerate(draft.tokens):
                assert draft.confidences[j] == pytest.approx(float(draft.q[j, t]), rel=1e-5)
    if kind == "model":  # a draft-vocabulary head: proposals and q's support stay inside it
        vocab = d.draft_vocab
        assert set(draft.tokens) <= set(vocab.tolist())
        outside = torch.ones(VOCAB, dtype=torch.bool)
        outside[vocab] = False
        assert float(draft.q[:, outside].sum()) == 0.0
    if kind == "model":
        assert len(d.propose(7, TOKENS, 4)) == 4  # a model always drafts the full γ


@pytest.mark.parametrize("kind", KINDS)
def test_rollback_restores_state(kind, drafter_dir):
    """Propose, have every draft rejected (a different token committed), propose again:
    the same as a fresh drafter that only ever saw the committed tokens."""
    d, fresh = new_drafter(kind, drafter_dir), new_drafter(kind, drafter_dir)
    first = d.propose(1, TOKENS, 4)
    wrong = (first.tokens[0] + 1) % VOCAB if len(first) else 17
    committed = TOKENS + [wrong]
    d.commit(1, committed)
    again, ref = d.propose(1, committed, 4), fresh.propose(1, committed, 4)
    assert again.tokens == ref.tokens
    if again.q is not None:
        assert torch.allclose(again.q, ref.q, atol=1e-5)


def test_model_drafter_catches_up_on_tokens_it_did_not_draft(drafter_dir):
    """A drafter that saw the sequence grow step by step (with partial acceptance) drafts exactly
    like one that sees the whole sequence at once: catch-up and rollback keep its cache exact."""
    d, fresh = new_drafter("model", drafter_dir), new_drafter("model", drafter_dir)
    seq = list(TOKENS[:5])
    for step, extra in enumerate([[28, 504], [3458], [314, 260, 1345], [28]]):
        draft = d.propose(3, seq, 3)
        seq = seq + draft.tokens[: step % 2] + extra  # accept 0 or 1 drafts, then other tokens
        d.commit(3, seq)
    assert d.lag(3, seq) > 0
    a, b = d.propose(3, seq, 5), fresh.propose(3, seq, 5)
    assert a.tokens == b.tokens
    assert torch.allclose(a.q, b.q, atol=1e-4)


def test_model_drafter_batches_sequences_and_stops_when_told(drafter_dir):
    d = new_drafter("model", drafter_dir)
    reqs = [DraftRequest(1, TOKENS, 5), DraftRequest(2, TOKENS[:7], 2), DraftRequest(3, TOKENS[:3], 0)]
    asked = []

    def keep_going(seq_id, confidences):
        asked.append(seq_id)
        return not (seq_id == 1 and len(confidences) >= 3)

    out = d.propose_batch(reqs, keep_going)
    assert [len(x) for x in out] == [3, 2, 0]
    single = new_drafter("model", drafter_dir).propose(2, TOKENS[:7], 2)
    assert out[1].tokens == single.tokens  # batching does not change a sequence's draft
    assert 3 not in asked


def test_model_drafter_samples_from_the_q_it_reports(drafter_dir):
    d = new_drafter("model", drafter_dir)
    g = torch.Generator().manual_seed(0)
    draft = d.propose_batch([DraftRequest(1, TOKENS, 4, temperature=1.5, generator=g)])[0]
    greedy = new_drafter("model", drafter_dir).propose(1, TOKENS, 4)
    assert draft.q.shape == (4, VOCAB) and len(draft) == 4
    # Temperature flattens q: the reported q is the tempered one the draft was sampled from.
    assert draft.q[0].max() < greedy.q[0].max()


def test_park_and_reload_signal_completion(drafter_dir, target):
    d = new_drafter("model", drafter_dir, target)
    before = d.propose(1, TOKENS, 3).tokens
    d.park()
    assert not d.resident
    with pytest.raises(RuntimeError, match="not resident"):
        d.propose(1, TOKENS, 3)
    done = d.start_reload()
    assert done.wait(60) and d.resident and d.load_error is None
    assert d.lag(1, TOKENS) == len(TOKENS)  # the cache went with the weights: full catch-up
    assert d.propose(1, TOKENS, 3).tokens == before


def test_model_drafter_shares_the_targets_embedding(drafter_dir, target):
    shared = new_drafter("model", drafter_dir, target)
    alone = new_drafter("model", drafter_dir)
    assert shared._engine.embed is target.embed
    embedding = target.embed.numel() * target.embed.element_size()
    assert alone.weight_bytes - shared.weight_bytes == embedding  # the 49k x 576 table is held once
