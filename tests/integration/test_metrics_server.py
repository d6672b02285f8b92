"""Metrics on the real server's metrics port (default engine, llama.cpp): NVIDIA's TensorRT-LLM
families and ours exist with model/version labels, their values agree with each other, and a
refused request is counted (Triton itself counts it a success: checked here too)."""
import threading

NVIDIA = {  # family -> label key -> the values TensorRT-LLM's backend publishes
    "nv_trt_llm_request_metrics": ("request_type", {"active", "max", "scheduled", "context", "waiting"}),
    "nv_trt_llm_kv_cache_block_metrics": ("kv_cache_block_type", {"max", "free", "used", "tokens_per", "reused",
                                                                  "fraction"}),
    "nv_trt_llm_inflight_batcher_metrics": ("inflight_batcher_specific_metric",
                                            {"total_context_tokens", "generation_requests", "micro_batch_id",
                                             "paused_requests"}),
    "nv_trt_llm_general_metrics": ("general_type", {"iteration_counter", "timestamp"}),
    "nv_trt_llm_runtime_memory_metrics": ("memory_type", {"cpu", "gpu", "pinned"}),
}


def by_label(samples, family, key):
    return {labels[key]: v for name, labels, v in samples if name == family}


def test_families_labels_and_consistency(server):
    assert "target engine llama.cpp" in server.log_path.read_text()  # the default engine publishes them
    server.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    before = server.samples()
    failures_before = sum(v for n, lab, v in before if n == "nv_inference_request_failure" and lab["model"] == "llm")
    rejected_before = by_label(before, "specserve_requests_rejected_total", "reason")
    iterations_before = by_label(before, "nv_trt_llm_general_metrics", "general_type")["iteration_counter"]
    finished_before = server.metrics().get("specserve_requests_finished_total", 0)  # the server is shared

    # a few requests at once (one with a drafting-friendly repetitive prompt), and one refused
    prompts = ["a b c a b c a b c a b c", "The capital of France is", "1, 2, 3, 1, 2, 3, 1, 2, 3,"]
    results = []
    threads = [threading.Thread(target=lambda p=p: results.append(server.generate({"text_input": p, "max_tokens": 24})))
               for p in prompts]
    for t in threads:
        t.start()
    status, body = server.generate({"text_input": "Hello", "max_tokens": -1})
    assert status == 400 and "max_tokens" in body["error"]
    for t in threads:
        t.join(120)
    assert [s for s, _ in results] == [200] * 3
    server.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    # published by the metrics thread a moment after the requests end: wait for these three
    server.wait_metric("specserve_requests_finished_total", lambda v: v >= finished_before + 3)
    after = server.samples()

    # every family: NVIDIA's names and label keys, model and version on every series
    for family, (key, values) in NVIDIA.items():
        series = [lab for name, lab, _ in after if name == family]
        assert {lab[key] for lab in series} == values, family
        assert all(lab["model"] == "llm" and lab["version"] == "1" for lab in series), family
    ours = [(n, lab) for n, lab, _ in after if n.startswith(("specserve_", "nv_trt_llm_", "nv_llm_"))]
    assert ours and all(lab.get("model") == "llm" and lab.get("version") == "1" for _, lab in ours)

    kv = by_label(after, "nv_trt_llm_kv_cache_block_metrics", "kv_cache_block_type")
    assert kv["used"] + kv["free"] == kv["max"] > 0 and kv["tokens_per"] == 16
    assert abs(kv["fraction"] - kv["used"] / kv["max"]) < 1e-9
    assert kv["free"] == server.metrics()['specserve_kv_blocks{state="free"}']

    general = by_label(after, "nv_trt_llm_general_metrics", "general_type")
    assert general["iteration_counter"] > iterations_before
    assert general["iteration_counter"] == server.metrics()["specserve_steps_total"]
    assert general["timestamp"] > 1.6e15  # µs since the epoch, as TensorRT-LLM reports it

    requests = by_label(after, "nv_trt_llm_request_metrics", "request_type")
    assert requests["max"] == 8 and requests["active"] == requests["scheduled"] == requests["waiting"] == 0

    rejected = by_label(after, "specserve_requests_rejected_total", "reason")
    assert rejected["invalid"] == rejected_before.get("invalid", 0) + 1
    # Triton's own counter does not see a decoupled model's error response (why ours exists)
    failures_after = sum(v for n, lab, v in after if n == "nv_inference_request_failure" and lab["model"] == "llm")
    assert failures_after == failures_before

    m = server.metrics()
    decisions = sum(v for k, v in m.items() if k.startswith("specserve_decisions_total"))
    played = sum(v for k, v in m.items() if k.startswith("specserve_gamma_played_total"))
    assert decisions == played == m["specserve_step_sequences_total"]
    assert 0 <= m["specserve_acceptance_rate"] <= 1
    states = {k: v for k, v in m.items() if k.startswith("specserve_drafter_state")}
    assert states['specserve_drafter_state{drafter="ngram",state="resident"}'] == 1
    assert sum(states.values()) == len({k.split('"')[1] for k in states})  # one state per drafter

    out_len = [(lab, v) for n, lab, v in after if n == "nv_llm_output_token_len_count"]
    assert out_len and out_len[0][0]["response_metric_type"] == "total_output_tokens" and out_len[0][1] >= 3
    durations = [v for n, lab, v in after if n == "specserve_request_duration_seconds_count"]
    firsts = [v for n, lab, v in after if n == "specserve_time_to_first_response_seconds_count"]
    assert durations and firsts and durations[0] == firsts[0] == out_len[0][1]
