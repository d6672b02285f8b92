"""backend/frontend/metrics.py over the real engine loop, with a stand-in for Triton's metric API.

The real server's exposition is checked in tests/integration/test_metrics_server.py; here the
values are checked against the loop's own state, step by step."""
import pytest

from backend.engines.torch_llama import TorchLlama
from backend.frontend.metrics import MetricsPublisher, RequestLog, arm_labels
from loop_helpers import greedy, make_loop, run_all


class FakeMetric:
    def __init__(self, labels, buckets=None):
        self.labels, self.buckets, self.value, self.observed = labels, buckets, 0.0, []

    def set(self, v):
        self.value = v

    def increment(self, v):
        assert v > 0, "Triton refuses a counter increment <= 0"
        self.value += v

    def observe(self, v):
        self.observed.append(v)


class FakePb:
    """The part of triton_python_backend_utils the publisher uses; records every series."""
    series = {}

    class MetricFamily:
        COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

        def __init__(self, name, description, kind):
            self.name, self.kind = name, kind

        def Metric(self, labels, buckets=None):
            assert (buckets is not None) == (self.kind == "histogram")
            m = FakeMetric(labels, buckets)
            key = (self.name,) + tuple(sorted((k, v) for k, v in labels.items() if k not in ("model", "version")))
            assert key not in FakePb.series, f"series created twice: {key}"
            FakePb.series[key] = m
            return m


def value(name, **labels):
    return FakePb.series[(name,) + tuple(sorted((k, str(v)) for k, v in labels.items()))].value


@pytest.fixture(scope="module")
def engine(checkpoint):
    return TorchLlama(checkpoint, dtype="bf16", max_slots=4, max_context=256)


def test_families_follow_the_loop(engine, tokenizer):
    FakePb.series = {}
    loop = make_loop(engine, tokenizer, "static", max_batch=4, drafter="ngram", gamma=3)
    requests = RequestLog()
    pub = MetricsPublisher(loop, FakePb, "llm", "1", requests, start=False)
    pub.publish()  # before any request: every fixed series exists
    assert value("nv_trt_llm_general_metrics", general_type="iteration_counter") == 0
    assert value("nv_trt_llm_request_metrics", request_type="max") == 4
    assert value("specserve_requests_rejected_total", reason="invalid") == 0
    assert all(m.labels["model"] == "llm" and m.labels["version"] == "1" for m in FakePb.series.values())

    prompts = ["a b c a b c a b c a b", "The capital of France is", "1 2 3 1 2 3 1 2 3"]
    sinks = run_all(loop, [greedy(p, 12) for p in prompts])
    for s in sinks:
        last = s.chunks[-1]
        requests.answered(last.num_input_tokens, last.num_output_tokens)
    requests.error("INVALID_ARG")
    pub.publish()
    st = loop.stats
    assert value("nv_trt_llm_general_metrics", general_type="iteration_counter") == st.steps > 0
    assert value("specserve_steps_total") == st.steps
    kv = {t: value("nv_trt_llm_kv_cache_block_metrics", kv_cache_block_type=t)
          for t in ("max", "free", "used", "tokens_per", "fraction")}
    assert kv["used"] + kv["free"] == kv["max"] == loop.pool.num_blocks and kv["tokens_per"] == 16
    assert kv["fraction"] == pytest.approx(kv["used"] / kv["max"])
    assert value("specserve_prefill_tokens_total") == st.prefill_tokens > 0
    # every sequence-step has one decision; the static policy always plans (ngram, 3)
    decisions = {k[1:]: m.value for k, m in FakePb.series.items() if k[0] == "specserve_decisions_total"}
    assert sum(decisions.values()) == st.sequence_steps
    assert set(decisions) == {(("drafter", "ngram"), ("gamma", "3"))}
    played = {k: m.value for k, m in FakePb.series.items() if k[0] == "specserve_gamma_played_total"}
    assert sum(played.values()) == st.sequence_steps
    rate = value("specserve_acceptance_rate")
    assert rate == pytest.approx(st.accepted / st.drafted) and 0 < rate <= 1
    assert value("specserve_drafter_state", drafter="ngram", state="resident") == 1
    assert value("specserve_drafter_state", drafter="ngram", state="parked") == 0
    assert value("specserve_requests_rejected_total", reason="invalid") == 1
    hist = FakePb.series[("nv_llm_output_token_len", ("response_metric_type", "total_output_tokens"))]
    assert hist.observed == [12.0] * 3 and hist.buckets == [10.0, 50.0, 100.0, 500.0, 1000.0]
    # idle: no iteration in progress, nothing active
    assert value("nv_trt_llm_request_metrics", request_type="active") == 0
    assert value("nv_trt_llm_request_metrics", request_type="scheduled") == 0
    pub.publish()  # republishing the same totals increments nothing (FakeMetric refuses <= 0)
    assert value("specserve_steps_total") == st.steps


def test_iteration_figures_while_running(engine, tokenizer):
    """Mid-run, the per-iteration gauges describe the last iteration: prefills, batch, tokens."""
    FakePb.series = {}
    loop = make_loop(engine, tokenizer, "off", max_batch=4)
    pub = MetricsPublisher(loop, FakePb, "llm", "1", start=False)
    from backend.loop.offline import ListSink
    reqs = [greedy("Hello there, how are", 20), greedy("One two three four", 20)]
    for r in reqs:
        loop.submit(r, ListSink())
    loop.step()  # admits and prefills both, then one step with both
    pub.publish()
    ifb = {t: value("nv_trt_llm_inflight_batcher_metrics", inflight_batcher_specific_metric=t)
           for t in ("total_context_tokens", "generation_requests", "micro_batch_id", "paused_requests")}
    assert ifb == {"total_context_tokens": loop.stats.prefill_tokens, "generation_requests": 2,
                   "micro_batch_id": 0, "paused_requests": 0}
    assert value("nv_trt_llm_request_metrics", request_type="context") == 2
    assert value("nv_trt_llm_request_metrics", request_type="active") == 2
    assert value("specserve_decisions_total", drafter="none", gamma=0) == 2
    loop.step()  # a plain step: nothing prefilled this iteration
    pub.publish()
    assert value("nv_trt_llm_request_metrics", request_type="context") == 0
    assert value("nv_trt_llm_inflight_batcher_metrics", inflight_batcher_specific_metric="total_context_tokens") == 0


def test_arm_labels():
    assert arm_labels(None, 0) == arm_labels("ngram", 0) == ("none", 0)
    assert arm_labels("suffix", 4) == ("suffix", 4)


def test_edge_refusals_reach_the_publisher(engine, tokenizer, tmp_path):
    """The edge (the launcher's process) writes its refusal totals to a file; the model's publisher
    publishes them as specserve_edge_requests_refused_total{api,status,reason}, only their growth."""
    import asyncio
    import json

    from backend.frontend.metrics import EdgeRefusals
    FakePb.series = {}
    path = tmp_path / "edge_refusals.json"
    pub = MetricsPublisher(make_loop(engine, tokenizer, "off", max_batch=4), FakePb, "llm", "1", start=False,
                           edge_refusals=str(path))
    pub.publish()  # no file yet: nothing refused, nothing published
    assert not [k for k in FakePb.series if k[0] == "specserve_edge_requests_refused_total"]
    edge = EdgeRefusals(str(path))
    edge.count("openai", 400)
    edge.count("openai", 404, "model_not_found")
    edge.count("triton", 413)
    pub.publish()
    name = "specserve_edge_requests_refused_total"
    assert value(name, api="openai", status=400, reason="invalid_request") == 1
    assert value(name, api="openai", status=404, reason="model_not_found") == 1
    assert value(name, api="triton", status=413, reason="body_too_large") == 1

    async def burst():  # in the edge's event loop: one write after a burst, not one per refusal
        for _ in range(5):
            edge.count("openai", 400)
        assert ["openai", "400", "invalid_request", 1] in json.loads(path.read_text())  # not yet written
        await asyncio.sleep(edge.flush_s * 2)
    asyncio.run(burst())
    pub.publish()
    assert value(name, api="openai", status=400, reason="invalid_request") == 6
