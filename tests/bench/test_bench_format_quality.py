"""bench/bench_format_quality.py: the formats' rounding, and a small run on the served checkpoint."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # bench/ scripts import their siblings

from bench_format_quality import CHECKPOINT, fake_int8  # noqa: E402


def test_q8_0_rounding_is_ggmls_block_of_32_with_a_half_scale():
    x = torch.randn(3, 64) * torch.tensor([1e-3, 1.0, 50.0])[:, None]
    y = fake_int8(x, 32)
    blocks, got = x.reshape(3, 2, 32), y.reshape(3, 2, 32)
    d = (blocks.abs().amax(-1, keepdim=True) / 127).half().float()
    q = got / d
    assert torch.allclose(q, q.round(), atol=1e-3) and q.abs().max() <= 127  # multiples of the block's scale
    assert torch.equal(fake_int8(y, 32), y)  # representable values stay put
    assert (got - blocks).abs().le(d / 2 * 1.01).all()  # nearest multiple


def test_coarser_blocks_share_one_scale():
    x = torch.randn(2, 384)
    for block, per in ((192, 2), (0, 1)):  # a scale every 192, or one a row
        y = fake_int8(x, block).reshape(2, per, -1)
        d = x.reshape(2, per, -1).abs().amax(-1, keepdim=True) / 127
        if block:
            d = d.half().float()
        assert torch.allclose(y / d, (y / d).round(), atol=1e-3)
    assert torch.equal(fake_int8(torch.zeros(1, 32), 32), torch.zeros(1, 32))  # no division by a zero scale


@pytest.mark.skipif(not (CHECKPOINT / "model.safetensors").exists(), reason="the set-up's checkpoint is not here")
def test_a_small_run_scores_every_format(tmp_path):
    out = tmp_path / "q.json"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_format_quality.py"), "--tokens", "257", "--window", "128",
                        "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    info = json.loads(out.read_text())
    assert info["tokens"] == 257 and set(info["formats"]) == {"bf16", "q8_0", "b192", "row"}
    q8 = info["formats"]["q8_0"]
    assert q8["vs_q8_0"] == 0 and q8["top1_agrees_with_q8_0"] == 1.0
    assert all(1 < f["perplexity"] < 1000 and 0.5 < f["top1_agrees_with_q8_0"] <= 1 for f in info["formats"].values())
    assert out.with_suffix(".png").stat().st_size > 10_000
