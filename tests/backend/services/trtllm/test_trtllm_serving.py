"""Serving on TensorRT-LLM (backend/services/trtllm/serving.py) against the fake `tensorrt_llm`:
`build_llm` builds the LLM our config describes with our drafter in it, and `TrtllmService`
answers requests exactly as the CPU engine loop does (same text, streamed chunks joining to
it, stop words, max_tokens, finish_reason), cancels and refuses like it. The fake LLM runs
the fake executor (speculating through our hook, verifying on the torch engine)."""
import time
from pathlib import Path

import pytest

from backend.loop.offline import ListSink, make_loop, run_all
from backend.generation.request import GenerationRequest, RequestError
from backend.server_config import ServerConfig

ROOT = Path(__file__).resolve().parents[4]
MAX_CONTEXT = 128


@pytest.fixture
def served(fake_trtllm, trt_engine, checkpoint, monkeypatch, upstream_record):
    from tensorrt_llm import _fake

    from backend.services.trtllm.serving import TrtllmService
    from fake_executor import FakePyExecutor

    executors = []

    def factory(llm):
        executors.append(FakePyExecutor(trt_engine, llm.drafter, llm.args["speculative_config"].max_draft_len))
        return executors[-1]

    _fake.EXECUTOR_FACTORY = factory
    monkeypatch.setenv("TLLM_WORKER_USE_SINGLE_PROCESS", "1")
    # static n-gram drafting: what the served path does with drafts does not hang on what an
    # adaptive policy concludes from a handful of timed steps (the composite may switch
    # speculation off for a while after a few rejected drafts, as it should)
    cfg = ServerConfig(checkpoint=str(checkpoint), dtype="fp32", max_batch=3, max_context=MAX_CONTEXT,
                       max_tokens_limit=64, policy="static")
    svc = TrtllmService.from_config(cfg, ROOT, max_draft_len=4)
    svc.start()
    yield svc, executors[0]
    svc.stop()
    assert svc.llm.shut_down
    outside = sorted((k, n) for k, n in _fake.ACCESSES
                     if n not in set(upstream_record["classes"][k].get("attributes", []))
                     | set(upstream_record["classes"][k].get("methods", {})))
    assert not outside, f"serving touched names outside the upstream record: {outside}"


def wait(sinks, timeout=120.0):
    end = time.monotonic() + timeout
    while not all(s.done for s in sinks):
        assert time.monotonic() < end, "requests did not finish"
        time.sleep(0.01)


def serve(svc, requests):
    sinks = [ListSink() for _ in requests]
    for r, s in zip(requests, sinks):
        svc.submit(r, s)
    wait(sinks)
    return sinks


def cpu(engine, tokenizer, requests):
    return run_all(make_loop(engine, tokenizer, policy="off", max_context=MAX_CONTEXT), requests)


def test_build_llm_passes_our_config_and_drafter(served):
    svc, ex = served
    args = svc.llm.args
    spec = args["speculative_config"]
    assert spec.drafter is svc.drafter and spec.max_draft_len == 4 == spec.max_total_draft_tokens
    assert args["disable_overlap_scheduler"] is True
    # structured output: TensorRT-LLM's llguidance backend, which needs its tokenizer loaded
    assert args["guided_decoding_backend"] == "llguidance" and args["skip_tokenizer_init"] is False
    assert svc.drafter.guides is not None and svc.spec.trim == svc.drafter.guides.trim
    assert args["max_batch_size"] == 3 and args["max_seq_len"] == MAX_CONTEXT
    assert args["kv_cache_config"].max_tokens == 3 * MAX_CONTEXT
    assert ex.drafter is svc.drafter


def test_responses_are_those_of_the_cpu_path(served, trt_engine, tokenizer):
    svc, ex = served
    plain = cpu(trt_engine, tokenizer, [GenerationRequest(prompt="1, 2, 3, 4, 5, 6,", max_new_tokens=24,
                                                          exclude_input_in_output=True)])
    text = plain[0].chunks[-1].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert stop.strip(), f"no stop word to cut {text!r} with"
    reqs = [
        GenerationRequest(prompt="Repeat exactly: the river runs, the river runs, the river runs.", max_new_tokens=20,
                          stream=True),
        GenerationRequest(prompt="The capital of France is", max_new_tokens=12),  # echoes the prompt
        GenerationRequest(prompt="1, 2, 3, 4, 5, 6,", max_new_tokens=24, stop_words=[stop], stream=True),
        GenerationRequest(prompt="def add(a, b):\n    return a + b\n", max_new_tokens=1, stream=True),
    ]
    ours, theirs = serve(svc, reqs), cpu(trt_engine, tokenizer, reqs)
    for r, a, b in zip(reqs, ours, theirs):
        assert not a.errors and a.done
        assert a.text == b.text, r
        fa, fb = a.chunks[-1], b.chunks[-1]
        assert (fa.finish_reason, fa.num_input_tokens, fa.num_output_tokens) == \
               (fb.finish_reason, fb.num_input_tokens, fb.num_output_tokens), r
        assert all(c.finish_reason is None for c in a.chunks[:-1])
    assert ours[0].chunks[-1].finish_reason == "length" and ours[0].chunks[-1].num_output_tokens == 20
    assert ours[1].text.startswith("The capital of France is") and len(ours[1].chunks) == 1
    assert ours[2].chunks[-1].finish_reason == "stop" and stop not in ours[2].text
    assert ours[3].chunks[-1].num_output_tokens == 1
    assert sum(c.num_draft_tokens for c in (s.chunks[-1] for s in ours)) > 0, "no speculation was reported"
    for s in ours:
        last = s.chunks[-1]
        assert 0 <= last.num_accepted_tokens <= last.num_draft_tokens


def test_the_policys_queue_length_counts_the_services_requests_in_flight(served):
    """The drafter hook's waiting count is the service's in-flight requests minus TensorRT-LLM's
    active ones (AdaptiveDrafterLogic.get_draft_len_for_batch_size)."""
    svc, ex = served
    assert svc.drafter.in_flight is not None and svc.drafter.in_flight() == 0
    seen, speculates = [], svc.spec.policy.speculates_at

    def spy(batch_size, **load):
        seen.append(load["queue_len"])
        return speculates(batch_size, **load)

    svc.spec.policy.speculates_at = spy
    sinks = [ListSink() for _ in range(5)]
    for s in sinks:
        svc.submit(GenerationRequest(prompt="1, 2, 3, 4,", max_new_tokens=4), s)
    wait(sinks)
    assert svc.drafter.in_flight() == 0
    assert max(seen) >= 1, "five requests on three slots: some waited, the policy never heard"


def test_a_cancelled_request_stops_and_is_aborted(served):
    svc, ex = served

    class CancelAfterFirst(ListSink):
        def cancelled(self):
            return len(self.chunks) >= 1

    sink = CancelAfterFirst()
    svc.submit(GenerationRequest(prompt="1, 2, 3, 4, 5, 6,", max_new_tokens=60, stream=True), sink)
    wait([sink])
    assert sink.chunks[-1].finish_reason == "cancelled" and sink.chunks[-1].num_output_tokens < 60
    ex.step()  # 1.2 acts on the abort at the end of its next iteration (the fake steps when asked)
    (rid,) = [rid for rid, r in ex.done.items()]
    assert ex.done[rid].finish_reason == "cancelled"
    assert svc.cancelled == 1


def test_bad_requests_are_refused_like_on_the_cpu(served):
    svc, _ = served
    with pytest.raises(RequestError, match="context window"):
        svc.submit(GenerationRequest(prompt="word " * 200, max_new_tokens=4), ListSink())
    with pytest.raises(RequestError, match="outside the vocabulary"):
        svc.submit(GenerationRequest(prompt="hi", max_new_tokens=4, end_id=10**7), ListSink())
    with pytest.raises(RequestError, match="max_tokens"):
        svc.submit(GenerationRequest(prompt="hi", max_new_tokens=65), ListSink())


def test_the_engine_setting_selects_the_trtllm_service(monkeypatch, checkpoint):
    from backend.services.trtllm.serving import TrtllmService
    from backend.services.build import build_service

    built = []
    monkeypatch.setattr(TrtllmService, "from_config", classmethod(lambda cls, cfg, root: built.append(cfg) or "svc"))
    assert build_service(ServerConfig.load({"engine": "trtllm", "checkpoint": str(checkpoint)}, env={}), ROOT) == "svc"
    assert built and built[0].engine == "trtllm"
    with pytest.raises(ValueError, match="engine must be one of llama.cpp, torch, trtllm"):
        ServerConfig.load({"engine": "vllm"}, env={})


# -- metrics: the service feeds the same publisher as the CPU loop (backend/frontend/metrics.py) -------------------------
class RecordingPb:
    """The part of triton_python_backend_utils the publisher uses: every series' value by (name, labels)."""

    def __init__(self):
        self.values = {}
        pb = self

        class MetricFamily:
            COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

            def __init__(self, name, description, kind):
                self.name = name

            def Metric(self, labels, buckets=None):
                key = (self.name,) + tuple(sorted((k, v) for k, v in labels.items() if k not in ("model", "version")))
                return _Series(pb.values, key)
        self.MetricFamily = MetricFamily

    def __call__(self, name, **labels):
        return self.values[(name,) + tuple(sorted((k, str(v)) for k, v in labels.items()))]


class _Series:
    def __init__(self, values, key):
        self.values, self.key = values, key
        values[key] = 0.0

    def set(self, v):
        self.values[self.key] = v

    def increment(self, v):
        self.values[self.key] += v

    def observe(self, v):
        pass


def test_the_metrics_publisher_reads_the_service(served, tokenizer):
    from backend.services.trtllm.drafter import Iteration
    from backend.frontend.metrics import MetricsPublisher, RequestLog

    svc, ex = served
    pb = RecordingPb()
    pub = MetricsPublisher(svc, pb, "llm", "1", RequestLog(), start=False)
    pub.publish()  # before any request every fixed series exists
    assert pb("specserve_sequences", state="waiting") == 0 and pb("nv_trt_llm_request_metrics", request_type="max") == 3
    prompts = ["Repeat exactly: the river runs, the river runs, the river runs.", "1, 2, 3, 4, 5, 6,"]
    sinks = serve(svc, [GenerationRequest(prompt=p, max_new_tokens=32) for p in prompts])
    pub.publish()
    st = svc.stats
    assert pb("specserve_steps_total") == st.steps > 0
    assert pb("nv_trt_llm_general_metrics", general_type="iteration_counter") == st.steps
    assert pb("specserve_requests_finished_total") == 2 == st.finished
    assert pb("specserve_prefill_tokens_total") == sum(len(tokenizer(p).input_ids) for p in prompts)
    assert pb("specserve_tokens_drafted_total") == st.drafted >= pb("specserve_tokens_accepted_total") > 0
    assert pb("specserve_tokens_emitted_total") == st.emitted > 0
    # KV blocks as TensorRT-LLM's KV cache manager reported them to the hook
    stats = ex.kv_stats()
    assert pb("specserve_kv_blocks", state="total") == stats.max_num_blocks
    assert pb("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type="tokens_per") == stats.tokens_per_block
    assert pb("specserve_drafter_state", drafter="ngram", state="resident") == 1
    assert sum(s.chunks[-1].num_output_tokens for s in sinks) == 64
    # the autoscaler's gauge: requests in flight beyond what TensorRT-LLM scheduled last iteration
    svc.drafter.last = Iteration(context=1, generation=2, kv_free=10, kv_total=40, tokens_per_block=8)
    svc._tasks.update(object() for _ in range(5))
    try:
        pub.publish()
        assert pb("specserve_sequences", state="running") == 3 and pb("specserve_sequences", state="waiting") == 2
        assert pb("nv_trt_llm_request_metrics", request_type="waiting") == 2
        assert pb("specserve_kv_blocks", state="free") == 10
    finally:
        svc._tasks.clear()


def test_the_service_drains_like_the_engine_loop(served):
    from backend.generation.request import ShuttingDown
    svc, _ = served
    assert svc.idle
    sink = ListSink()
    svc.submit(GenerationRequest(prompt="1, 2, 3, 4, 5, 6,", max_new_tokens=60, stream=True), sink)
    svc.drain(0.0)
    with pytest.raises(ShuttingDown):
        svc.submit(GenerationRequest(prompt="hi", max_new_tokens=4), ListSink())
    wait([sink])
    assert svc.idle and sink.errors and "shutting down" in sink.errors[-1]
