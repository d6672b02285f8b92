"""The drafter build: seeded and reproducible, versioned artifacts the engine loads."""
import hashlib
import json

import torch

from backend.drafters.model import ModelDrafter
from build_engines.distill_drafter import ARTIFACT_VERSION, build, epoch_batches


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_quick_build_is_reproducible_and_loads(checkpoint, tmp_path):
    a = build("chat", "quick", 0, checkpoint, tmp_path / "a", force=True)
    b = build("chat", "quick", 0, checkpoint, tmp_path / "b", force=True)
    assert _digest(a) == _digest(b), "same seed, same data: the weights must be identical"
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["artifact_version"] == ARTIFACT_VERSION and manifest["seed"] == 0
    assert manifest["heldout_agreement"] > manifest["heldout_agreement_untrained"]  # training helped
    assert build("chat", "quick", 0, checkpoint, tmp_path / "a") == a  # up to date: not rebuilt
    d = ModelDrafter("chat", a, dtype="fp32", max_slots=2, max_context=128)
    draft = d.propose(1, [1, 2, 3, 4], 3)
    assert len(draft) == 3 and torch.isin(torch.tensor(draft.tokens), d.draft_vocab).all()


def test_teacher_forced_chat_samples_label_the_answer_only(checkpoint):
    from transformers import AutoTokenizer

    from build_engines.drafter_data import Sample, answer_mask, assistant_header_ids, chat_answer_ids, chat_ids
    tok = AutoTokenizer.from_pretrained(str(checkpoint))
    turns = [("a", "What is a list in Python?", "A list is an ordered, mutable collection of items. " * 4),
             ("b", "x" * 30, "too short"),  # no usable answer: skipped
             ("c", "Name three colours, please.", "Red, green and blue are three colours that people name often.")]
    ids = chat_answer_ids(tok, turns, n=5, max_prompt=64, max_len=40, seed=0)
    assert len(ids) == 2 and all(len(x) <= 40 for x in ids)
    prompts = {tuple(chat_ids(tok, t[1])) for t in turns}
    header = assistant_header_ids(tok)
    for x in ids:
        start = next(len(p) for p in prompts if tuple(x[:len(p)]) == p)  # the templated prompt comes first
        assert x[start - len(header):start] == header
        s = Sample(torch.tensor(x), torch.ones(len(x), dtype=torch.bool), torch.zeros(len(x), 1, dtype=torch.long),
                   torch.ones(len(x), 1))
        m = answer_mask(s, header)
        assert not m[: start - 1].any() and m[start - 1:].all()  # from the last header token on: the answer


def test_code_requests_ask_for_stdlib_functions_by_signature_and_docstring():
    from build_engines.drafter_data import code_requests
    docs = [("m.py", 'def parse_pair(line, sep):\n    """Split a line into a (key, value) pair at sep."""\n'
                     '    return tuple(line.split(sep, 1))\n\n'
                     'def _private(x):\n    """Hidden helpers are not requested."""\n\n'
                     'def short(x):\n    """Too short."""\n'),
            ("broken.py", "def (:\n")]  # unparsable sources are skipped
    reqs = code_requests(docs, limit=10, seed=0)
    assert reqs == [("m.py:1", "Write a Python function `parse_pair(line, sep)`: "
                               "Split a line into a (key, value) pair at sep.")]
    many = [(f"f{i}.py", f'def fn{i}(a):\n    """Return the value number {i} of the table."""\n') for i in range(20)]
    assert code_requests(many, 5, seed=1) == code_requests(many, 5, seed=1) and len(code_requests(many, 5, 1)) == 5


def test_epoch_batches_cover_every_sample_once_and_pad_less():
    import random
    rng = random.Random(3)
    lengths = [rng.randint(40, 300) for _ in range(203)]  # not a multiple of the batch

    def padding(batches):
        return sum(max(lengths[j] for j in b) * len(b) for b in batches) - sum(lengths)

    plain = epoch_batches(lengths, 8, 1, random.Random(0))
    pooled = epoch_batches(lengths, 8, 16, random.Random(0))
    for batches in (plain, pooled):
        assert sorted(j for b in batches for j in b) == list(range(len(lengths)))
        assert all(1 <= len(b) <= 8 for b in batches)
    assert padding(pooled) < padding(plain) / 4
    assert epoch_batches(lengths, 8, 16, random.Random(0)) == pooled  # seeded


def test_quick_feature_build_is_reproducible_and_serves(checkpoint, tmp_path):
    from backend.drafters.feature import FeatureDrafter, load_model_drafter
    a = build("chat", "quick", 0, checkpoint, tmp_path / "a", force=True, kind="feature")
    b = build("chat", "quick", 0, checkpoint, tmp_path / "b", force=True, kind="feature")
    assert a.name == "chat-feature-drafter-quick" and _digest(a) == _digest(b)
    manifest = json.loads((a / "manifest.json").read_text())
    assert manifest["kind"] == "feature" and manifest["heldout_agreement"] > manifest["heldout_agreement_untrained"]
    assert 0.0 <= manifest["heldout_agreement_second_token"] <= 1.0
    d = load_model_drafter("chat-feature", a, dtype="fp32", max_slots=2, max_context=128)
    assert isinstance(d, FeatureDrafter) and float(d.fc.abs().sum()) > 0  # fc learnt to read the features
