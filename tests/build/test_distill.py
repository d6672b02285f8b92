"""The drafter build: seeded and reproducible, versioned artifacts the engine loads."""
import hashlib
import json

import torch

from backend.drafters.model import ModelDrafter
from build_engines.distill_drafter import ARTIFACT_VERSION, build


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
