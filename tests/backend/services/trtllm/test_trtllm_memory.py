"""Model drafters beside TensorRT-LLM (backend/services/trtllm/gpu_drafters.py): the policy's park
and reload move a drafter's weights off and onto its device and free its KV cache, on the CPU here
with every move recorded (no GPU on this machine); through the fake `tensorrt_llm` the output stays
plain greedy while the drafter is parked and reloaded. What this cannot show: real GPU memory
returned by torch.cuda.empty_cache (docs/trtllm.md says what it can and cannot give TensorRT-LLM)."""
import dataclasses
import time
from pathlib import Path

import pytest
import torch

from backend.engines.torch_llama import TorchLlama
from backend.services.trtllm.gpu_drafters import DrafterMemory, GpuModelDrafter, Placement
from backend.loop.offline import ListSink
from backend.generation.request import GenerationRequest
from backend.server_config import ServerConfig
from policy.types import MemoryAction

ROOT = Path(__file__).resolve().parents[4]
DRAFTER_DIR = ROOT / ".cache" / "drafters"


class RecordingPlacement(Placement):
    """The CPU stands in for the GPU; what would cross the bus is recorded."""

    def __init__(self):
        super().__init__(device="cpu", host="cpu")
        self.moves, self.releases = [], 0

    def to_device(self, engine):
        self.moves.append("to_device")
        return super().to_device(engine)

    def to_host(self, engine):
        self.moves.append("to_host")
        return super().to_host(engine)

    def release(self):
        self.releases += 1
        super().release()


def tensors(engine):
    out = [engine.embed, engine.final_norm, engine.cos, engine.sin] + engine.k_cache + engine.v_cache
    for L in engine.layers:
        out += [L.attn_norm, L.mlp_norm] + [lin.weight for lin in (L.wqkv, L.wo, L.w_gate_up, L.w_down)]
    return out + [engine.lm_head.weight]


def test_the_engine_moves_whole_keeps_tied_weights_one_tensor_and_frees_its_cache(checkpoint):
    eng = TorchLlama(checkpoint, dtype="fp32", max_slots=2, max_context=64)
    before = eng.forward([0], [0], [[1, 2, 3, 4]])
    eng.to("cpu", cache=False)
    assert eng.k_cache == [] and eng.v_cache == []
    eng.to("cpu")
    assert len(eng.k_cache) == eng.shape.layers and not eng.k_cache[0].any()
    assert torch.equal(eng.forward([0], [0], [[1, 2, 3, 4]]), before)
    eng.to("meta")  # a real device move (no data): every tensor goes, ties stay ties
    assert all(t.device.type == "meta" for t in tensors(eng)) and eng.device.type == "meta"
    assert eng.shape.tie_embeddings and eng.lm_head.weight is eng.embed


@pytest.fixture
def chat_path(built_drafter):
    return built_drafter("chat")


def drafts(d, tokens):
    from policy.speculator import DraftRequest
    return d.propose_batch([DraftRequest(7, tokens, 4)])[0].tokens


def test_park_and_reload_move_the_weights_off_and_on_the_device(chat_path, tokenizer):
    place = RecordingPlacement()
    d = GpuModelDrafter("chat", chat_path, placement=place, dtype="fp32", max_slots=2, max_context=128)
    tokens = tokenizer("Repeat: one two three, one two three, one").input_ids
    first = drafts(d, tokens)
    memory = DrafterMemory({"chat": d})
    memory([MemoryAction("offload", "chat")])
    assert not d.resident and d._engine is None and memory.parks == 1
    assert place.moves == ["to_host"] and place.releases == 1
    assert d._host.k_cache == [] and d._host.device.type == "cpu"  # weights parked, cache freed
    assert d.slots == {} and d.fed == {}  # it forgot its sequences
    memory([MemoryAction("offload", "chat")])  # already parked: nothing
    memory([MemoryAction("reload", "chat")])
    assert d._ready.wait(60) and d.resident and memory.reloads == 1
    assert place.moves == ["to_host", "to_device"] and d._host is None
    assert drafts(d, tokens) == first  # the same weights came back


def test_feature_drafters_are_refused_on_this_path(model_drafters):
    from backend.services.trtllm.gpu_drafters import load_gpu_drafter
    cfg = ServerConfig(drafter_dir=str(model_drafters))
    with pytest.raises(ValueError, match="features"):
        load_gpu_drafter("chat-feature", cfg, ROOT, RecordingPlacement())
    with pytest.raises(ValueError, match="unknown drafter"):
        load_gpu_drafter("nosuch", cfg, ROOT, RecordingPlacement())


def test_served_through_the_fake_trtllm_the_policy_parks_and_reloads_and_output_stays_greedy(
        fake_trtllm, trt_engine, checkpoint, monkeypatch, chat_path):
    from tensorrt_llm import _fake

    from backend.services.trtllm.serving import TrtllmService
    from backend.loop.offline import make_loop, run_all
    from fake_executor import FakePyExecutor

    _fake.EXECUTOR_FACTORY = lambda llm: FakePyExecutor(trt_engine, llm.drafter, 4)
    monkeypatch.setenv("TLLM_WORKER_USE_SINGLE_PROCESS", "1")
    place = RecordingPlacement()
    cfg = ServerConfig(checkpoint=str(checkpoint), dtype="fp32", max_batch=3, max_context=128, max_tokens_limit=64,
                       drafters="chat,ngram", drafter_dir=str(DRAFTER_DIR), policy="static")
    svc = TrtllmService.from_config(cfg, ROOT, max_draft_len=4, placement=place)
    spec = svc.spec
    d = spec.drafters["chat"]
    assert isinstance(d, GpuModelDrafter) and place.moves == []  # built on the device directly
    from policy import make_policy
    policy = spec.policy = make_policy("static", drafter="chat", gamma=3)  # the model drafter drafts
    decide, steps = policy.decide, []

    def scripted(ctx):  # park at the 2nd step, reload at the 4th
        decision = decide(ctx)
        steps.append(ctx.step)
        action = {1: "offload", 3: "reload"}.get(len(steps) - 1)
        return dataclasses.replace(decision, memory_actions=(MemoryAction(action, "chat"),)) if action else decision
    policy.decide = scripted
    svc.start()
    try:
        req = GenerationRequest(prompt="Repeat exactly: the river runs, the river runs, the river runs.",
                                max_new_tokens=48, exclude_input_in_output=True)
        sink = ListSink()
        svc.submit(req, sink)
        end = time.monotonic() + 120
        while not sink.done:
            assert time.monotonic() < end
            time.sleep(0.01)
    finally:
        svc.stop()
    plain = run_all(make_loop(trt_engine, svc.tok, policy="off", max_context=128), [req])
    assert sink.text == plain[0].text and len(steps) > 3
    assert d._ready.wait(60) and d.resident
    assert place.moves == ["to_host", "to_device"] and place.releases == 1
    assert svc.stats.drafter_parks == 1 and svc.stats.drafter_reloads == 1
    assert svc.stats.drafted > 0  # the drafter drafted before it was parked (and after the reload)
