"""return_top_log_probs: each generated token's k most likely alternatives, from the distribution
its log prob comes from (the processed softmax when greedy; p after penalties / temperature /
top-k / top-p when sampling), with the token ids (output_token_ids); the same under speculation
as under plain decoding (torch engine, fp32). Requests that do not ask get none of it."""
import pytest
import torch

from backend.engines.torch_llama import TorchLlama
from backend.generation.logits_processors import Penalties
from backend.generation.request import GenerationRequest, Limits, RequestError, validate
from backend.generation.sampling import SamplingParams
from loop_helpers import make_loop, run_all
from test_lossless import PROMPTS as BASE

PROMPTS = [BASE[4], BASE[7], BASE[10], BASE[11]]  # the last three repeat: n-gram drafts get accepted
MAX_TOKENS, K = 12, 5


@pytest.fixture(scope="module")
def engine(checkpoint):
    return TorchLlama(checkpoint, dtype="fp32", max_slots=4, max_context=512)


def requests(k=K, **kw):
    return [GenerationRequest(prompt=p, max_new_tokens=MAX_TOKENS, exclude_input_in_output=True, return_log_probs=True,
                              return_top_log_probs=k, **kw) for p in PROMPTS]


def finals(loop, reqs):
    sinks = run_all(loop, reqs)
    assert not any(s.errors for s in sinks)
    return sinks


def joined(sink):
    """A streamed sink's per-token outputs joined (a whole response is one chunk)."""
    ids, lps, top_ids, top_lps = [], [], [], []
    for c in sink.chunks:
        ids += c.output_token_ids
        lps += c.output_log_probs
        top_ids += c.top_token_ids or []
        top_lps += c.top_log_probs or []
    return ids, lps, top_ids, top_lps


def test_greedy_top_alternatives_are_the_top_k_of_the_distribution(engine, tokenizer):
    """Checked against one forward over prompt + output: at every position the alternatives are
    the k largest of log_softmax(logits), in order; the greedy token is the first of them."""
    sink = finals(make_loop(engine, tokenizer, "off", max_batch=1), requests()[:1])[0]
    ids, lps, top_ids, top_lps = joined(sink)
    assert len(ids) == len(lps) == len(top_ids) == len(top_lps) == sink.chunks[-1].num_output_tokens > 0
    assert tokenizer.decode(ids) == sink.chunks[-1].text
    prompt = tokenizer(PROMPTS[0]).input_ids
    logits = engine.forward([3], [0], [prompt + ids[:-1]], logit_rows=[list(range(len(prompt) - 1, len(prompt) + len(ids) - 1))])
    engine.truncate(3, 0)
    want_lps, want_ids = torch.log_softmax(logits.float(), -1).topk(K, dim=-1)
    for j, token in enumerate(ids):
        assert top_ids[j][0] == token  # greedy: the emitted token is the most likely one
        assert abs(top_lps[j][0] - lps[j]) < 1e-6
        assert top_lps[j] == sorted(top_lps[j], reverse=True) and len(top_ids[j]) == K
        assert torch.allclose(torch.tensor(top_lps[j]), want_lps[j], atol=1e-4)
        assert same_alternatives(top_ids[j], top_lps[j], want_ids[j].tolist(), want_lps[j].tolist())


def same_alternatives(ids_a, lps_a, ids_b, lps_b, tol=1e-4):
    """Equal top-k lists (ids and log probs), except that tokens tied within tol at the k-th place
    may differ (a float rounding can order a tie either way)."""
    if len(ids_a) != len(ids_b) or any(abs(x - y) > tol for x, y in zip(lps_a, lps_b)):
        return False
    a, b, last = dict(zip(ids_a, lps_a)), dict(zip(ids_b, lps_b)), min(lps_a + lps_b)
    return all(abs(a[t] - b[t]) <= tol if t in a and t in b else abs(a.get(t, b.get(t)) - last) <= tol
               for t in set(a) | set(b))


def test_greedy_top_log_probs_are_the_same_under_speculation(engine, tokenizer):
    plain = [joined(s) for s in finals(make_loop(engine, tokenizer, "off", max_batch=1), requests())]
    loop = make_loop(engine, tokenizer, "static", max_batch=4, drafter="ngram", gamma=4)
    spec = [joined(s) for s in finals(loop, requests())]
    assert loop.stats.accepted > 0  # speculation did happen
    for (ids_a, lps_a, tids_a, tlps_a), (ids_b, lps_b, tids_b, tlps_b) in zip(plain, spec):
        assert ids_a == ids_b
        assert all(abs(x - y) <= 1e-4 for x, y in zip(lps_a, lps_b))
        for j in range(len(ids_a)):
            assert same_alternatives(tids_a[j], tlps_a[j], tids_b[j], tlps_b[j]), f"position {j}"
    streamed = [joined(s) for s in finals(make_loop(engine, tokenizer, "static", max_batch=4, drafter="ngram",
                                                    gamma=4), requests(stream=True)[:2])]
    for (ids_a, lps_a, tids_a, tlps_a), (ids_b, lps_b, tids_b, tlps_b) in zip(plain, streamed):  # streamed in steps
        assert ids_b == ids_a and all(abs(x - y) <= 1e-4 for x, y in zip(lps_a, lps_b))
        assert all(same_alternatives(*ab) for ab in zip(tids_a, tlps_a, tids_b, tlps_b))


def test_sampled_top_log_probs_come_from_the_sampled_distribution(engine, tokenizer):
    """top_k = 3 sampling: the alternatives beyond the 3 kept tokens have probability 0 (the floor),
    the emitted token is one of the kept 3 and its log prob is among the alternatives'."""
    reqs = requests(sampling=SamplingParams(temperature=0.7, top_k=3), seed=5,
                    penalties=Penalties(repetition_penalty=1.2))
    outs = [joined(s) for s in finals(make_loop(engine, tokenizer, "static", max_batch=4, drafter="ngram", gamma=3), reqs)]
    assert sum(len(o[0]) for o in outs) > MAX_TOKENS  # (a sequence may end at once: EOS sampled first)
    for ids, lps, top_ids, top_lps in outs:
        assert len(top_ids) == len(top_lps) == len(ids)
        for token, lp, tids, tlps in zip(ids, lps, top_ids, top_lps):
            assert token in tids[:3] and abs(tlps[tids.index(token)] - lp) < 1e-5
            assert abs(sum(torch.tensor(tlps[:3]).exp().tolist()) - 1) < 1e-3
            assert all(x < -100 for x in tlps[3:])


def test_requests_that_do_not_ask_get_nothing(engine, tokenizer):
    reqs = requests(k=0) + [GenerationRequest(prompt=PROMPTS[0], max_new_tokens=4)]
    a, b = finals(make_loop(engine, tokenizer, "off", max_batch=2), reqs[:1] + reqs[-1:])
    assert a.chunks[-1].output_token_ids and a.chunks[-1].top_token_ids is None
    assert b.chunks[-1].output_log_probs is None and b.chunks[-1].output_token_ids is None


@pytest.mark.parametrize("k,log_probs,words", [(21, True, "between 0 and 20"), (-1, True, "between 0 and 20"),
                                               (3, False, "needs return_log_probs")])
def test_invalid_top_log_probs_are_refused(k, log_probs, words):
    with pytest.raises(RequestError, match=words):
        validate(GenerationRequest(prompt="x", max_new_tokens=16, return_log_probs=log_probs, return_top_log_probs=k), Limits())
