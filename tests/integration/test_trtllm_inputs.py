"""TensorRT-LLM's sampling inputs and extra outputs against the real server, with requests shaped
as NVIDIA's end_to_end_grpc_client.py sends them ([1, 1] tensors; --batch-inputs stacks prompts
into [B, 1]): repetition / presence / frequency penalties, min_tokens / min_length, bad_words,
return_log_probs (cum_log_probs, output_log_probs, output_token_ids), return_top_log_probs
(output_top_token_ids, output_top_log_probs), return_perf_metrics, num_return_sequences
(sequence_index) and batch inputs (batch_index); invalid values get an error naming the input."""
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from test_unary_and_names import (PROMPT, batch1, http_generate, nvidia_e2e_request, stream_like_nvidia, tensors,
                                  text_of)

PERF = ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", "kv_cache_alloc_new_blocks",
        "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns", "first_scheduled_time_ns",
        "first_token_time_ns", "last_token_time_ns")


def extra(**kw):
    kinds = {"repetition_penalty": np.float32, "presence_penalty": np.float32, "frequency_penalty": np.float32,
             "min_tokens": np.int32, "min_length": np.int32, "return_log_probs": bool, "return_perf_metrics": bool,
             "return_top_log_probs": np.int32,
             "num_return_sequences": np.int32, "random_seed": np.uint64}
    return {k: batch1(v, kinds[k]) for k, v in kw.items()}


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls", "llm"])
def test_nvidia_client_request_with_penalties_log_probs_and_perf_metrics(server, model):
    values = nvidia_e2e_request(PROMPT, output_len=12, temperature=0.0, bad_words=["fox"],
                                **extra(repetition_penalty=1.2, presence_penalty=0.3, frequency_penalty=0.2,
                                        min_tokens=12, return_log_probs=True, return_perf_metrics=True))
    outputs = ("text_output", "cum_log_probs", "output_log_probs", "num_output_tokens") + PERF
    results, errors = stream_like_nvidia(server.grpc, model, values, outputs)
    assert not errors and len(results) == 1
    r = results[0]
    assert r.as_numpy("num_output_tokens").reshape(-1)[0] == 12  # min_tokens: no early end
    lps = r.as_numpy("output_log_probs")
    assert lps.shape == (1, 1, 12) and lps.dtype == np.float32 and (lps <= 0).all()
    cum = r.as_numpy("cum_log_probs")
    assert cum.shape == (1, 1) and abs(float(cum[0][0]) - float(lps.sum())) < 1e-3
    rate, drafted, accepted = (r.as_numpy(k)[0][0] for k in ("acceptance_rate", "total_draft_tokens",
                                                             "total_accepted_draft_tokens"))
    assert 0 <= accepted <= drafted and (rate == 0 if drafted == 0 else abs(rate - accepted / drafted) < 1e-6)
    assert r.as_numpy("first_token_time_ns")[0][0] >= r.as_numpy("arrival_time_ns")[0][0] > 0
    new, reused, total = (int(r.as_numpy(k)[0][0]) for k in ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
                                                              "kv_cache_alloc_total_blocks"))
    assert total == new + reused > 0 and reused >= 0


def test_penalties_change_the_output_and_stay_the_same_on_every_protocol(server):
    plain = http_generate(server, "llm", {"text_input": PROMPT, "max_tokens": 16, "exclude_input_in_output": True})
    status, body = http_generate(server, "llm", {"text_input": PROMPT, "max_tokens": 16, "exclude_input_in_output": True,
                                                 "repetition_penalty": 1.5, "frequency_penalty": 0.5,
                                                 "bad_words": ["fox", "quick"], "min_length": 16,
                                                 "return_log_probs": True})
    assert status == 200 and plain[0] == 200, body
    assert body["text_output"] != plain[1]["text_output"] and body["num_output_tokens"] == 16
    assert len(body["output_log_probs"]) == 16 and "cum_log_probs" in body
    values = nvidia_e2e_request(PROMPT, output_len=16, temperature=0.0, bad_words=["fox", "quick"], streaming=True,
                                **extra(repetition_penalty=1.5, frequency_penalty=0.5, min_tokens=16))
    values["exclude_input_in_output"] = batch1(True, bool)
    results, errors = stream_like_nvidia(server.grpc, "ensemble", values)
    assert not errors and "".join(text_of(r) for r in results) == body["text_output"]


def test_num_return_sequences_gives_sequence_index(server):
    values = nvidia_e2e_request("Tell me a story.", output_len=8, streaming=True,
                                **extra(num_return_sequences=3, random_seed=5))
    results, errors = stream_like_nvidia(server.grpc, "ensemble", values, ("text_output", "sequence_index"))
    assert not errors
    texts = {}
    for r in results:
        texts.setdefault(int(r.as_numpy("sequence_index")[0][0]), []).append(text_of(r))
    assert sorted(texts) == [0, 1, 2] and len({"".join(t) for t in texts.values()}) > 1  # seeds 5, 6, 7


def test_batch_inputs_give_batch_index_and_equal_single_requests(server):
    """--batch-inputs: every input stacked to [2, 1] (stop/bad words [2, n])."""
    prompts = [PROMPT, "The capital of France is"]
    singles = [nvidia_e2e_request(p, output_len=10, temperature=0.0, **extra(repetition_penalty=1.1)) for p in prompts]
    stacked = {k: np.concatenate([s[k] for s in singles], axis=0) for k in singles[0]}
    assert stacked["text_input"].shape == (2, 1)
    results, errors = stream_like_nvidia(server.grpc, "ensemble", stacked, ("text_output", "batch_index"))
    assert not errors and len(results) == 2
    by_row = {int(r.as_numpy("batch_index")[0][0]): text_of(r) for r in results}
    for i, single in enumerate(singles):
        (one,), errs = stream_like_nvidia(server.grpc, "ensemble", single)
        assert not errs and by_row[i] == text_of(one)


def test_unary_model_joins_each_generation(server):
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        values = nvidia_e2e_request(PROMPT, output_len=6, temperature=0.0,
                                    **extra(num_return_sequences=2, return_log_probs=True))
        result = client.infer("llm_unary", tensors(grpcclient, values))
    finally:
        client.close()
    texts = result.as_numpy("text_output")
    assert texts.shape[0] == 2 and texts[0] == texts[1]  # greedy: both the same
    assert result.as_numpy("output_log_probs").shape == (2, 1, 6)


def test_top_log_probs_streamed_and_joined(server):
    """return_top_log_probs: the same ids and alternatives streamed from `ensemble` as joined by
    llm_unary; greedy, so each token is its first alternative."""
    values = nvidia_e2e_request(PROMPT, output_len=6, temperature=0.0, streaming=True,
                                **extra(return_log_probs=True, return_top_log_probs=3))
    outputs = ("text_output", "output_log_probs", "output_token_ids", "output_top_token_ids", "output_top_log_probs")
    results, errors = stream_like_nvidia(server.grpc, "ensemble", values, outputs)
    assert not errors and results
    ids = np.concatenate([r.as_numpy("output_token_ids").reshape(-1) for r in results])
    top = np.concatenate([r.as_numpy("output_top_token_ids").reshape(-1, 3) for r in results if r.as_numpy("output_top_token_ids").size])
    assert len(ids) == 6 and top.shape == (6, 3) and (top[:, 0] == ids).all()
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        values["stream"] = batch1(False, bool)
        result = client.infer("llm_unary", tensors(grpcclient, values))
    finally:
        client.close()
    assert result.as_numpy("output_token_ids").reshape(-1).tolist() == ids.tolist()
    assert result.as_numpy("output_top_token_ids").shape == (1, 1, 6, 3)
    assert (result.as_numpy("output_top_token_ids").reshape(6, 3) == top).all()
    lps = result.as_numpy("output_top_log_probs").reshape(6, 3)
    assert (np.diff(lps, axis=1) <= 0).all()
    assert np.allclose(lps[:, 0], result.as_numpy("output_log_probs").reshape(-1), atol=1e-5)


@pytest.mark.parametrize("fields,words", [
    (dict(repetition_penalty=-1.0), "repetition_penalty must be a finite number > 0"),
    (dict(presence_penalty=float("nan")), "presence_penalty must be a finite number"),
    (dict(min_tokens=50), "min_length (min_tokens) 50 exceeds max_tokens 8"),
    (dict(num_return_sequences=0), "num_return_sequences must be between 1"),
    (dict(return_log_probs=True, return_top_log_probs=21), "return_top_log_probs must be between 0 and 20"),
    (dict(return_top_log_probs=2), "return_top_log_probs needs return_log_probs=true"),
])
def test_invalid_values_are_refused_naming_the_input(server, fields, words):
    values = nvidia_e2e_request(PROMPT, output_len=8, **extra(**fields))
    results, errors = stream_like_nvidia(server.grpc, "ensemble", values)
    assert not results and len(errors) == 1 and words in errors[0]
    body = {"text_input": PROMPT, "max_tokens": 8, **fields}
    if not any(isinstance(v, float) and v != v for v in fields.values()):  # JSON has no NaN
        status, out = http_generate(server, "llm", body)
        assert status == 400 and words in out["error"]


def test_bad_words_must_be_strings_over_http(server):
    status, out = http_generate(server, "ensemble", {"text_input": PROMPT, "max_tokens": 4, "bad_words": [1, 2]})
    assert status == 400 and "bad_words must be a string" in out["error"]
