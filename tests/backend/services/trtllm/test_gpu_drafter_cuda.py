"""Model drafters on a CUDA device (backend/services/trtllm/gpu_drafters.py) without TensorRT-LLM:
torch's CUDA is all they use, so this runs wherever torch sees a GPU (a device machine of this
workplace: torch with CUDA, no TensorRT-LLM) and is skipped elsewhere. The drafter is a small
random-weight checkpoint written here, so nothing needs building first.

What docs/trtllm.md says parking gives back: the drafter's weights and cache leave the GPU
(torch's allocator, then the driver), and come back on reload with the same drafts."""
import json

import pytest
import torch
from safetensors.torch import save_file

from backend.engines.torch_llama import LlamaShape, random_weights

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (torch)")]
CONFIG = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=4096, hidden_size=256,
              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, intermediate_size=512,
              rms_norm_eps=1e-5, max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=2)


@pytest.fixture
def drafter_dir(tmp_path):
    shape = LlamaShape.from_config(CONFIG)
    w = random_weights(shape, torch.bfloat16, "cpu", seed=1)
    save_file({"model." + k: v.contiguous() for k, v in w.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    return tmp_path


def test_parking_a_model_drafter_frees_its_gpu_memory_and_reloading_restores_it(drafter_dir):
    from backend.services.trtllm.gpu_drafters import DrafterMemory, GpuModelDrafter, Placement
    from policy.speculator import DraftRequest
    from policy.types import MemoryAction

    d = GpuModelDrafter("chat", drafter_dir, placement=Placement("cuda"), max_slots=4, max_context=512)
    assert d._engine.embed.is_cuda and d._engine.k_cache[0].is_cuda
    tokens = list(range(100, 140))
    first = d.propose_batch([DraftRequest(1, tokens, 4)])[0].tokens
    assert len(first) == 4
    torch.cuda.synchronize()
    resident, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    memory = DrafterMemory({"chat": d})
    memory([MemoryAction("offload", "chat")])
    assert not d.resident
    assert resident - torch.cuda.memory_allocated() >= d.weight_bytes
    assert torch.cuda.memory_reserved() < reserved  # empty_cache handed the blocks to the driver
    memory([MemoryAction("reload", "chat")])
    assert d._ready.wait(120) and d.resident and d._engine.embed.is_cuda
    assert d.propose_batch([DraftRequest(1, tokens, 4)])[0].tokens == first


def test_torch_engine_on_cuda_verifies_what_it_decodes_greedily():
    """The engine's ragged forward on the GPU: a sequence's greedy continuation decoded one token a
    step and the same tokens verified in one forward pick the same argmax at (almost) every
    position. Not batch-invariant (cuBLAS picks kernels by shape), so a near-tie may flip: at
    most one position in the 32 may differ."""
    from backend.engines.torch_llama import TorchLlama
    shape = LlamaShape.from_config(CONFIG)
    eng = TorchLlama(None, device="cuda", max_slots=2, max_context=256, batch_invariant=False,
                     weights=(shape, random_weights(shape, torch.bfloat16, "cuda", seed=2)))
    prompt = list(range(10, 42))
    logits = eng.forward([0], [0], [prompt], logit_rows=[[len(prompt) - 1]])
    out = [int(logits[-1].argmax())]
    for i in range(31):
        out.append(int(eng.forward([0], [len(prompt) + i], [[out[-1]]])[-1].argmax()))
    verify = eng.forward([1], [0], [prompt + out[:-1]], logit_rows=[list(range(len(prompt) - 1, len(prompt) + 31))])
    same = sum(int(a) == b for a, b in zip(verify.argmax(-1).tolist(), out))
    assert same >= 31, (same, out)


def test_a_cpu_built_fp32_engine_moves_to_cuda_and_computes_what_it_computed_on_the_cpu():
    """On a CPU an fp32 engine multiplies with oneDNN-packed weights (backend/engines/torch_llama.py,
    Linear): the packed copy cannot leave the CPU, so moving the engine must drop it and multiply
    the plain weight on the GPU: the same logits to fp32 rounding, the tied head still the embedding."""
    from backend.engines.torch_llama import TorchLlama
    shape = LlamaShape.from_config(CONFIG)
    eng = TorchLlama(None, dtype="fp32", max_slots=2, max_context=256,
                     weights=(shape, random_weights(shape, torch.float32, "cpu", seed=3)))
    tokens = [list(range(10, 42))]
    rows = [list(range(32))]
    on_cpu = eng.forward([0], [0], tokens, logit_rows=rows)
    eng.to("cuda")
    assert eng.lm_head.weight is eng.embed and eng.embed.is_cuda
    assert all(L.wqkv.packed is None for L in eng.layers)
    on_gpu = eng.forward([0], [0], tokens, logit_rows=rows)
    assert on_gpu.is_cuda
    torch.testing.assert_close(on_gpu.cpu(), on_cpu, rtol=1e-3, atol=1e-3)
