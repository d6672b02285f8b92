"""The real thing: TensorRT-LLM 1.2.x on a GPU, inside the TensorRT-LLM container. Skipped
wherever no real `tensorrt_llm` is importable (tests/backend/services/conftest.py), i.e. on
every machine this project has had so far. Inside the container:

    SPECSERVE_TRTLLM_MODEL=/models/<hf-llama-dir> python -m pytest -m gpu tests/backend/services/trtllm

What it checks, as upstream's own test_user_provided.py does for its drafter: greedy output
with our drafter in TensorRT-LLM equals TensorRT-LLM's greedy output without speculation,
the hook ran without errors and drafts were accepted; and that parking a model drafter frees
its GPU memory and reloading restores it."""
import os
import time
from pathlib import Path

import pytest

from backend.loop.offline import ListSink
from backend.generation.request import GenerationRequest
from backend.server_config import ServerConfig

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[4]
PROMPTS = ["Repeat exactly: the river runs, the river runs, the river runs.",
           "1, 2, 3, 4, 5, 6, 7, 8,",
           "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"]
MAX_NEW = 48


def model_dir(checkpoint_default: Path) -> Path:
    return Path(os.environ.get("SPECSERVE_TRTLLM_MODEL", str(checkpoint_default)))


def test_greedy_with_our_drafter_equals_tensorrt_llm_greedy_without_speculation():
    from backend.services.trtllm import _api
    from backend.services.trtllm.serving import TrtllmService, sampling_params

    ckpt = model_dir(ROOT / ".cache" / "models" / "smollm2-135m-instruct")
    cfg = ServerConfig(checkpoint=str(ckpt), max_batch=4, max_context=512, max_tokens_limit=256)
    svc = TrtllmService.from_config(cfg, ROOT, max_draft_len=4, free_gpu_memory_fraction=0.3)
    svc.start()
    try:
        reqs = [GenerationRequest(prompt=p, max_new_tokens=MAX_NEW, exclude_input_in_output=True) for p in PROMPTS]
        sinks = [ListSink() for _ in reqs]
        for r, s in zip(reqs, sinks):
            svc.submit(r, s)
        end = time.monotonic() + 600
        while not all(s.done for s in sinks):
            assert time.monotonic() < end
            time.sleep(0.05)
        assert not any(s.errors for s in sinks)
        ours = [s.text for s in sinks]
        assert svc.drafter.hook_errors == 0
        assert sum(s.chunks[-1].num_accepted_tokens for s in sinks) > 0, "nothing drafted was accepted"
    finally:
        svc.stop()

    ref = _api.llm_class()(model=str(ckpt), backend="pytorch", skip_tokenizer_init=True, max_batch_size=4,
                           max_seq_len=512, disable_overlap_scheduler=True,
                           kv_cache_config=_api.kv_cache_config()(free_gpu_memory_fraction=0.3))
    try:
        theirs = []
        for r in reqs:
            ids = svc.tokenize(r)
            out = ref.generate_async(ids, sampling_params=sampling_params(r, min(svc.default_eos))).result()
            toks = [t for t in out.outputs[0].token_ids if t not in svc.default_eos]
            theirs.append(svc.tok.decode(toks, skip_special_tokens=True))
    finally:
        ref.shutdown()
    assert ours == theirs


def test_parking_a_model_drafter_frees_its_gpu_memory_and_reloading_restores_it():
    """What docs/trtllm.md says parking gives back: the drafter's weights and cache leave the GPU
    (torch's allocator, then the driver), and come back on reload with the same drafts."""
    import torch

    from backend.drafters.artifacts import find_artifact
    from backend.services.trtllm.gpu_drafters import DrafterMemory, GpuModelDrafter, Placement
    from policy.speculator import DraftRequest
    from policy.types import MemoryAction

    path = find_artifact(ROOT / ".cache" / "drafters", "chat")
    if path is None:
        pytest.skip("no 'chat' model drafter in .cache/drafters (python -m build_engines.distill_drafter)")
    d = GpuModelDrafter("chat", path, placement=Placement("cuda"), max_slots=4, max_context=512)
    tokens = list(range(100, 140))
    first = d.propose_batch([DraftRequest(1, tokens, 4)])[0].tokens
    torch.cuda.synchronize()
    resident, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    memory = DrafterMemory({"chat": d})
    memory([MemoryAction("offload", "chat")])
    assert resident - torch.cuda.memory_allocated() >= d.weight_bytes
    assert torch.cuda.memory_reserved() < reserved  # empty_cache handed the blocks to the driver
    memory([MemoryAction("reload", "chat")])
    assert d._ready.wait(120) and d.resident
    assert d.propose_batch([DraftRequest(1, tokens, 4)])[0].tokens == first
