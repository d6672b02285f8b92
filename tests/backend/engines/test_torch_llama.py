"""What is particular to the torch engine: its forward against transformers' reference
implementation (fp32), any Llama-family checkpoint, the bf16 kernels. What every engine
must do (ragged batches, logit rows, truncation, slot moves, limits) is checked by
the engine contract suite, tests/backend/engines/test_engine_contract.py."""
import pytest
import torch

from backend.engines.torch_llama import TorchLlama


@pytest.fixture(scope="module")
def engines(checkpoint):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    return hf, TorchLlama(checkpoint, dtype="fp32", max_slots=1, max_context=64)


def test_prefill_matches_transformers(engines, tokenizer):
    hf, eng = engines
    ids = tokenizer("The capital of France is Paris. The capital of Germany is").input_ids
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    out = eng.forward([0], [0], [ids])
    assert torch.allclose(out, ref, atol=1e-3), (out - ref).abs().max()


def test_any_llama_checkpoint_directory(tmp_path):
    """A different Llama-family shape (untied head, no GQA folding needed, other RoPE
    base) loads from a plain Hugging Face directory and matches transformers."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
                      max_position_embeddings=128, rope_theta=5000.0)
    hf = LlamaForCausalLM(cfg).eval()
    hf.save_pretrained(tmp_path)
    eng = TorchLlama(tmp_path, dtype="fp32", max_slots=2, max_context=64)
    ids = torch.randint(0, 300, (1, 20))
    with torch.no_grad():
        ref = hf(ids).logits[0]
    assert torch.allclose(eng.forward([0], [0], [ids[0].tolist()]), ref, atol=1e-4)


@pytest.mark.parametrize("dtype, size", [("fp32", 4), ("bf16", 2)])
def test_name_and_kv_size_follow_the_dtype(tmp_path, dtype, size):
    """The contract's metadata on this engine: the name a cost profile records, one cached
    position = K and V of every layer, every slot preallocated (plus one scratch position)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    eng = TorchLlama(tmp_path, dtype=dtype, max_slots=3, max_context=40)
    assert eng.name == f"torch/{dtype}"
    assert eng.kv_bytes_per_token == 2 * 3 * 2 * 16 * size
    assert eng.kv_capacity_tokens == 3 * 40
    real = sum(t.numel() * t.element_size() for t in eng.k_cache + eng.v_cache)
    assert real == eng.kv_bytes_per_token * 3 * 41


def test_fp32_linear_is_prepacked_once_and_multiplies_as_f_linear():
    """fp32 weights are packed for oneDNN when the layer is built (F.linear's MKL path packs the
    whole weight again on every call of 2+ rows: verifying cost 2-2.3x a decode step), the plain
    weight kept beside them (counted) so the layer can still leave the CPU; the products are
    F.linear's to fp32 rounding, for 1 row and many, 2-D and 3-D."""
    from backend.engines import torch_llama as tl
    torch.manual_seed(0)
    w = torch.randn(96, 64)
    lin = tl.Linear(w)
    assert lin.packed is not None and lin.weight is not None and lin.wide is None
    assert lin.nbytes == w.numel() * 4 * 2
    for shape in ((1, 64), (3, 64), (2, 5, 64), (40, 64)):
        x = torch.randn(*shape)
        y = lin(x)
        assert y.dtype == torch.float32 and y.shape == (*shape[:-1], 96)
        assert torch.allclose(y, torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-4)
    lin.to(torch.device("meta"), {})
    assert lin.packed is None and lin.weight.device.type == "meta"


@pytest.mark.parametrize("native", [False, True])
def test_bf16_linear_gives_the_same_products_on_either_kernel(monkeypatch, native):
    """Without native bf16 a layer multiplies WIDE_ROWS+ rows with an fp32 copy of the same
    bf16 weight (emulated bf16 slows linearly with rows) and fewer rows with the bf16 weight:
    both are the exact bf16 products summed in fp32, so they agree to bf16 rounding; the
    resident size counts both copies. With native bf16 there is one (packed) copy."""
    from backend.engines import torch_llama as tl
    monkeypatch.setattr(tl, "_NATIVE_BF16", native)
    torch.manual_seed(0)
    w = torch.randn(96, 64).bfloat16()
    lin = tl.Linear(w)
    assert (lin.wide is None) == native
    assert lin.nbytes == w.numel() * (2 if native else 6)
    for rows in (1, tl.Linear.WIDE_ROWS - 1, tl.Linear.WIDE_ROWS, 3 * tl.Linear.WIDE_ROWS):
        x = torch.randn(1, rows, 64).bfloat16()
        y = lin(x)
        assert y.dtype == torch.bfloat16 and y.shape == (1, rows, 96)
        ref = x.float() @ w.float().T
        assert torch.allclose(y.float(), ref, rtol=1e-2, atol=1e-2), (y.float() - ref).abs().max()
