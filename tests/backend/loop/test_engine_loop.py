"""The engine loop with the real model: continuous batching, cancellation, refusals."""
import time

import pytest

from backend.drafters import Drafter
from backend.loop.engine_loop import prefill_groups
from backend.engines.torch_llama import TorchLlama
from backend.generation.request import GenerationRequest, RequestError
from backend.generation.sampling import SamplingParams
from loop_helpers import ListSink, greedy, make_loop, run_all


@pytest.fixture(scope="module")
def engine(checkpoint):
    return TorchLlama(checkpoint, dtype="bf16", max_slots=4, max_context=256)


def test_prefill_groups_limit_padding():
    assert prefill_groups([250, 20, 240, 25]) == [[1, 3], [2, 0]]
    assert prefill_groups([10, 10, 10]) == [[0, 1, 2]]
    assert prefill_groups([100] * 5, max_padded_tokens=250) == [[0, 1], [2, 3], [4]]


def test_more_requests_than_slots_all_complete_and_share_steps(engine, tokenizer):
    loop = make_loop(engine, tokenizer, "static", max_batch=4, drafter="ngram", gamma=3)
    sinks = run_all(loop, [greedy(f"Count to {i}:", 12) for i in range(10)])
    assert all(s.chunks[-1].finish_reason in ("stop", "length") for s in sinks)
    assert max(o.batch_size for o in loop.trace) == 4
    assert not loop.running and not loop.waiting


def test_cancel_frees_the_slot(engine, tokenizer):
    loop = make_loop(engine, tokenizer, "off", max_batch=4)
    keep, cancel = ListSink(), ListSink()
    loop.submit(greedy("Tell me about the sea.", 40, stream=True), keep)
    loop.submit(greedy("Tell me about the sky.", 200, stream=True), cancel)
    for _ in range(3):
        loop.step()
    assert len(loop.running) == 2
    cancel.cancel = True
    time.sleep(loop.cfg.cancel_poll_s)
    loop.step()
    assert cancel.done and cancel.chunks[-1].finish_reason == "cancelled"
    assert len(loop.running) == 1 and loop.running[0].slot == 0
    while not keep.done:
        loop.step()
    assert keep.chunks[-1].finish_reason in ("stop", "length")


@pytest.mark.parametrize("request_,message", [
    (GenerationRequest(prompt="", max_new_tokens=4), "text_input is missing or empty"),
    (GenerationRequest(prompt="hi", max_new_tokens=0), "max_tokens must be a positive integer"),
    (GenerationRequest(prompt="word " * 300, max_new_tokens=4), "context window"),
    (GenerationRequest(prompt="hi", max_new_tokens=4, end_id=10**6), "end_id"),
    (GenerationRequest(prompt="hi", max_new_tokens=4, sampling=SamplingParams(temperature=1e-40)), "temperature must be 0"),
])
def test_refusals_name_the_problem(engine, tokenizer, request_, message):
    loop = make_loop(engine, tokenizer)
    with pytest.raises(RequestError, match=message):
        loop.submit(request_, ListSink())
    assert loop.inbox.empty()


def test_drafter_failure_falls_back_to_plain_decoding(engine, tokenizer):
    class Broken(Drafter):
        name = "broken"

        def propose(self, *a):
            raise RuntimeError("boom")

    loop = make_loop(engine, tokenizer, "static", drafters={"broken": Broken()}, drafter="broken", gamma=3)
    plain = run_all(make_loop(engine, tokenizer, "off"), [greedy("a b c a b c a b", 10)])[0]
    spec = run_all(loop, [greedy("a b c a b c a b", 10)])[0]
    assert spec.text == plain.text
    assert loop.stats.drafter_errors > 0


def test_a_seed_reproduces_sampled_text_whatever_the_policy_drafts(checkpoint, tokenizer):
    """Per-position sampling (fp32): plain decoding and n-gram speculation give the same text for a seed."""
    from backend.generation.request import SamplingParams
    fp32 = TorchLlama(checkpoint, dtype="fp32", max_slots=1, max_context=256)

    def run(policy, **kw):
        r = GenerationRequest(prompt="a b c a b c a b c a b", max_new_tokens=40, sampling=SamplingParams(temperature=0.8),
                              seed=11, exclude_input_in_output=True)
        loop = make_loop(fp32, tokenizer, policy, **kw)
        return run_all(loop, [r])[0].text, loop

    plain, _ = run("off")
    spec, loop = run("static", drafter="ngram", gamma=4)
    assert spec == plain and plain
    assert loop.stats.accepted > 0


def test_a_request_that_fails_in_prefill_or_a_step_fails_alone(checkpoint, tokenizer, monkeypatch):
    """One sequence's exception in the step (here: its sampling raises) fails that request
    only; the others in the same steps finish exactly as they would alone, and everything
    the failed one held is released."""
    import backend.loop.verifier as verifier

    engine = TorchLlama(checkpoint, dtype="fp32", max_slots=4, max_context=128)  # fp32: batch-invariant here
    prompts = [f"Count from {i} to {i + 8}:" for i in range(3)]
    alone = [s.text for s in run_all(make_loop(engine, tokenizer, "off", max_batch=4), [greedy(p, 12) for p in prompts])]
    real = verifier.target_probs

    calls = []

    def broken(logits, params):
        if params.temperature == 0.7:  # its first token (prefill) samples; its first step raises
            calls.append(1)
            if len(calls) > 1:
                raise FloatingPointError("this request's sampling broke")
        if params.temperature == 0.8:  # its first token raises
            raise FloatingPointError("this request's first token broke")
        return real(logits, params)

    monkeypatch.setattr(verifier, "target_probs", broken)
    loop = make_loop(engine, tokenizer, "static", max_batch=4, drafter="ngram", gamma=3)
    bad_step = greedy("Count from 5 to 20:", 12, sampling=SamplingParams(temperature=0.7, top_k=1))
    bad_start = greedy("Count from 6 to 20:", 12, sampling=SamplingParams(temperature=0.8, top_k=1))
    sinks = run_all(loop, [greedy(prompts[0], 12), bad_start, greedy(prompts[1], 12), bad_step,
                           greedy(prompts[2], 12)])
    assert [sinks[i].text for i in (0, 2, 4)] == alone
    assert sinks[1].errors and "internal error while starting" in sinks[1].errors[0]
    assert sinks[3].errors and "internal error while verifying" in sinks[3].errors[0]
    assert not loop.running and loop.pool.num_free == loop.pool.num_blocks


def test_admission_bound_refuses_at_once_then_admits_again(engine, tokenizer):
    """cfg.max_queue waiting requests: the next is refused (Overloaded) before any work;
    once the queue drains, requests are accepted again."""
    import dataclasses
    from backend.generation.request import Overloaded
    loop = make_loop(engine, tokenizer, "off", max_batch=1)
    loop.cfg = dataclasses.replace(loop.cfg, max_queue=2)
    sinks = [ListSink() for _ in range(3)]
    for s in sinks[:2]:
        loop.submit(greedy("Hello", 2), s)  # not stepped yet: both wait
    with pytest.raises(Overloaded, match="retry later"):
        loop.submit(greedy("Hello", 2), sinks[2])
    while not all(s.done for s in sinks[:2]):
        loop.step()
    loop.submit(greedy("Hello", 2), sinks[2])
    while not sinks[2].done:
        loop.step()
    assert sinks[2].chunks[-1].finish_reason in ("stop", "length")


LONG_PROMPT = " ".join(f"Item {i}: the {w} is blue." for i, w in enumerate(["sky", "sea", "ink", "jay"] * 6))


def test_a_long_prompt_is_prefilled_in_chunks_between_the_others_steps(engine, tokenizer):
    """Chunks of at most prefill_chunk tokens at fixed boundaries; the running sequence emits
    a token between every two chunks; the output equals the prompt's prefilled whole, alone."""
    n = len(tokenizer(LONG_PROMPT).input_ids)
    assert n > 96, n
    alone = run_all(make_loop(engine, tokenizer, "off", max_batch=1, prefill_chunk=0), [greedy(LONG_PROMPT, 8)])[0]
    loop = make_loop(engine, tokenizer, "off", max_batch=4, prefill_chunk=32)
    calls, forward = [], engine.forward
    engine.forward = lambda slots, starts, tokens, **kw: calls.append((list(slots), starts[0], len(tokens[0]))) \
        or forward(slots, starts, tokens, **kw)
    try:
        short, long = ListSink(), ListSink()
        loop.submit(greedy("Tell me about the sea.", 60, stream=True), short)
        loop.step()
        loop.submit(greedy(LONG_PROMPT, 8), long)
        emitted = []
        while not long.done:
            loop.step()
            emitted.append(len(loop.running[0].tokens) if loop.running else None)
    finally:
        engine.forward = forward
    chunks = [(start, length) for slots, start, length in calls if slots == [1]]  # the long prompt's slot
    assert chunks == [(st, min(32, n - st)) for st in range(0, n, 32)], calls[:8]
    prefill_steps = (n + 31) // 32
    assert len(set(emitted[:prefill_steps])) == prefill_steps, f"the short sequence stalled: {emitted}"
    assert long.text == alone.text


def test_a_sequence_cancelled_or_preempted_while_prefilling_gives_back_its_blocks(engine, tokenizer):
    loop = make_loop(engine, tokenizer, "off", max_batch=4, prefill_chunk=32)
    sink = ListSink()
    loop.submit(greedy(LONG_PROMPT, 8), sink)
    loop.step()
    seq = loop.running[0]
    assert seq.prefilling and 0 < seq.kv_len < seq.prefill_len and not seq.joined
    loop.scheduler.preempt(seq)
    assert seq.seq_id not in loop.pool and loop.waiting[0] is seq and seq.kv_len == 0
    loop.step()  # back in, first chunks again (alone, nothing decoding: prefill_chunks of them)
    assert loop.running[0] is seq and seq.kv_len == 32 * loop.cfg.prefill_chunks
    sink.cancel = True
    time.sleep(loop.cfg.cancel_poll_s)
    loop.step()
    assert sink.done and sink.chunks[-1].finish_reason == "cancelled"
    assert not loop.running and loop.pool.num_free == loop.pool.num_blocks
