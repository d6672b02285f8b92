"""verifier.row_argmax: numpy's argmax for fp32 CPU rows (the loop's every step) must pick what
torch's picks, ties and NaNs included."""
import numpy as np
import pytest
import torch

from backend.loop.verifier import row_argmax


@pytest.mark.parametrize("rows", [1, 9, 32])
def test_it_picks_what_torch_picks(rows):
    logits = torch.from_numpy(np.random.default_rng(rows).standard_normal((rows, 49152)).astype(np.float32))
    logits[0, 7] = logits[0, 4000] = logits[0].max() + 1  # a tie: the first index wins
    if rows > 1:
        logits[1, 123] = float("nan")  # a NaN counts as the maximum
        logits[1, 9] = float("inf")
    got = row_argmax(logits)
    assert got == logits.argmax(dim=-1).tolist()
    assert got[0] == 7
    assert rows == 1 or got[1] == 123
    assert all(isinstance(i, int) for i in got)


def test_other_dtypes_and_views_go_through_torch():
    logits = torch.randn(3, 50).to(torch.bfloat16)
    assert row_argmax(logits) == logits.argmax(dim=-1).tolist()
    wide = torch.randn(4, 64)
    assert row_argmax(wide[1:3, :50]) == wide[1:3, :50].argmax(dim=-1).tolist()  # a strided view
