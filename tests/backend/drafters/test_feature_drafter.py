"""The feature drafter (EAGLE-style): it drafts exactly what its training computes, keeps its
cache exact across catch-up and rollback, and needs the target's features to draft."""
import json

import pytest
import torch
from safetensors.torch import load_file

from backend.drafters import DraftRequest
from backend.drafters.feature import FeatureDrafter, FeatureLog, is_feature_drafter
from backend.drafters.model import ModelDrafter
from backend.engines.torch_llama import TorchLlama
from build_engines.feature_student import FeatureStudent

VOCAB = 49152
CTX = 128
TOKENS = [1, 504, 3458, 314, 260, 1345, 28, 504, 3458, 314, 260, 1345, 28, 504, 3458]


@pytest.fixture(scope="module")
def target(checkpoint):
    return TorchLlama(checkpoint, dtype="fp32", max_slots=4, max_context=CTX)


def _student(checkpoint, fc_scale: float) -> FeatureStudent:
    cfg = json.loads((checkpoint / "config.json").read_text())
    w = {k.removeprefix("model."): v for k, v in load_file(str(checkpoint / "model.safetensors")).items()}
    vocab = torch.unique(torch.cat([torch.arange(8192), torch.tensor(TOKENS)]))
    s = FeatureStudent(cfg, w, vocab, layers=1)
    with torch.no_grad():  # an untrained fc is zero; a non-zero one makes the features matter
        s.fc.copy_(torch.randn(s.fc.shape, generator=torch.Generator().manual_seed(0)) * fc_scale)
    return s


@pytest.fixture(scope="module")
def student(checkpoint):
    return _student(checkpoint, 0.5)


@pytest.fixture(scope="module")
def artifact(student, tmp_path_factory):
    out = tmp_path_factory.mktemp("feature") / "tiny-feature-drafter"
    student.save(out, dtype=torch.float32)
    return out


@pytest.fixture(scope="module")
def zero_fc_artifact(checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("feature0") / "zero-feature-drafter"
    _student(checkpoint, 0.0).save(out, dtype=torch.float32)
    return out


def target_features(target, tokens):
    """The target's features of every position of `tokens` (what the engine loop hands over)."""
    _, f = target.forward([3], [0], [list(tokens)], logit_rows=[[len(tokens) - 1]], return_hidden=True)
    return f


def drafter(path, target=None):
    return FeatureDrafter("tiny", path, dtype="fp32", max_slots=4, max_context=CTX, target=target)


def fed(d, seq_id, tokens, target):
    """Hand the drafter the features the loop would have: every committed position but the last."""
    d.observe_features(seq_id, 0, target_features(target, tokens[:-1]))


def test_feature_log_grows_truncates_and_reads_position_minus_one_as_zeros():
    log = FeatureLog(4, torch.float32)
    log.write(0, torch.ones(50, 4))
    log.write(50, 2 * torch.ones(100, 4))  # past the initial 64 rows
    assert log.length == 150 and torch.equal(log.read(49, 51)[:, 0], torch.tensor([1.0, 2.0]))
    assert torch.equal(log.read(-1, 2)[0], torch.zeros(4)) and log.read(-1, 2).shape == (3, 4)
    log.write(10, 3 * torch.ones(1, 4))  # a recompute from position 10 forgets what followed
    assert log.length == 11
    with pytest.raises(RuntimeError, match="11 positions"):
        log.read(0, 12)
    with pytest.raises(ValueError):
        log.write(20, torch.ones(1, 4))


def test_drafts_are_what_training_computes(student, artifact, target):
    """First draft token: the student's pass 1 (true features) at the last position; second: its
    pass 2 (its own output as the feature) at the drafted token. Same weights, same numbers."""
    d = drafter(artifact, target)
    assert is_feature_drafter(artifact)
    fed(d, 1, TOKENS, target)
    draft = d.propose(1, TOKENS, 2)
    ext = TOKENS + [draft.tokens[0]]
    feats = torch.cat([target_features(target, TOKENS), torch.zeros(1, student.hidden)])  # f of the draft: unused
    with torch.no_grad():
        o1, o2 = student.two_passes(torch.tensor([ext]), feats[None])
        q1 = torch.softmax(student.logits(o1[0, len(TOKENS) - 1]), -1)
        q2 = torch.softmax(student.logits(o2[0, len(TOKENS)]), -1)
    assert torch.allclose(draft.q[0, student.vocab_ids], q1, atol=1e-4)
    assert torch.allclose(draft.q[1, student.vocab_ids], q2, atol=1e-4)
    assert draft.tokens[0] == int(student.vocab_ids[q1.argmax()])


def test_with_a_zero_fc_it_is_the_token_drafter_of_the_same_layers(zero_fc_artifact, target):
    feature, token = drafter(zero_fc_artifact, target), ModelDrafter("tok", zero_fc_artifact, dtype="fp32",
                                                                      max_slots=4, max_context=CTX, target=target)
    fed(feature, 1, TOKENS, target)
    a, b = feature.propose(1, TOKENS, 4), token.propose(1, TOKENS, 4)
    assert a.tokens == b.tokens and torch.allclose(a.q, b.q, atol=1e-5)


def test_catch_up_and_rollback_keep_the_cache_exact(artifact, target):
    """Grown step by step (drafts partly accepted, other tokens committed, features arriving as the
    loop sends them) it drafts exactly like a drafter that sees the whole sequence at once."""
    d, fresh = drafter(artifact, target), drafter(artifact, target)
    seq = list(TOKENS[:5])
    fed(d, 3, seq, target)
    for step, extra in enumerate([[28, 504], [3458], [314, 260, 1345], [28]]):
        draft = d.propose(3, seq, 3)
        grown = seq + draft.tokens[: step % 2] + extra  # accept 0 or 1 drafts, then other tokens
        d.observe_features(3, len(seq) - 1, target_features(target, grown[:-1])[len(seq) - 1:])
        seq = grown
        d.commit(3, seq)
    fed(fresh, 3, seq, target)
    a, b = d.propose(3, seq, 4), fresh.propose(3, seq, 4)
    assert a.tokens == b.tokens and torch.allclose(a.q, b.q, atol=1e-4)


def test_batched_proposals_equal_single_ones_and_park_keeps_the_features(artifact, target):
    d = drafter(artifact, target)
    fed(d, 1, TOKENS, target)
    fed(d, 2, TOKENS[:7], target)
    out = d.propose_batch([DraftRequest(1, TOKENS, 3), DraftRequest(2, TOKENS[:7], 2)])
    single = drafter(artifact, target)
    fed(single, 2, TOKENS[:7], target)
    assert out[1].tokens == single.propose(2, TOKENS[:7], 2).tokens
    d.park()
    assert d.start_reload().wait(60) and d.resident
    assert d.propose(1, TOKENS, 3).tokens == out[0].tokens  # caught up from the kept features


def test_without_features_it_raises_a_clear_error(artifact):
    with pytest.raises(RuntimeError, match="no target features"):
        drafter(artifact).propose(9, TOKENS, 2)
