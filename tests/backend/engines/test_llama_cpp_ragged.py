"""llama.cpp: a ragged verification step gives the same logits whether the engine pads it to
one micro-batch or lets llama.cpp split it (backend/engines/llama_cpp.py `_pad_pays` picks the
cheaper per step, so both must be exact), and the split's micro-batch count is what the
engine's cost rule assumes."""
import pytest
import torch

from backend.engines.llama_cpp import LlamaCpp, _pad_pays, served_gguf, ubatches

CTX = 40
SHAPES = {"one drafts": [3, 1, 1, 1], "alternating": [3, 1, 3, 1], "all but one": [1, 4, 4, 4]}


@pytest.fixture(scope="module")
def engine(checkpoint):
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=4, max_context=128)
    yield eng
    eng.close()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_padded_and_split_steps_give_identical_logits(engine, shape, monkeypatch):
    import backend.engines.llama_cpp as llama_cpp
    monkeypatch.setattr(llama_cpp, "_pad_pays", lambda slots, lens: True)  # pad_ragged: pad whenever ragged
    lens = SHAPES[shape]
    prompts = [[(7 * s + 3 * i) % 500 + 10 for i in range(CTX)] for s in range(4)]
    steps = [[(11 * s + j) % 300 + 20 for j in range(n)] for s, n in enumerate(lens)]
    out = {}
    for pad in (True, False):
        engine.pad_ragged = pad
        engine.forward([0, 1, 2, 3], [0] * 4, prompts, logit_rows=[[CTX - 1]] * 4)
        out[pad] = engine.forward([0, 1, 2, 3], [CTX] * 4, steps, logit_rows=[list(range(n)) for n in lens])
    engine.pad_ragged = True
    assert torch.equal(out[True], out[False])


def test_the_cost_rule_pads_only_where_splitting_costs_more_passes():
    assert ubatches([0, 1, 2, 3], [3, 1, 3, 1]) == 3
    assert not _pad_pays(list(range(32)), [3] + [1] * 31)  # one extra pass beats 62 throw-away tokens
    assert _pad_pays(list(range(8)), [3, 1] * 4)  # four extra passes cost more than 8 throw-away tokens
