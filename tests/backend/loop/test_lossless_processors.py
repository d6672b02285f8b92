"""Logits processors stay lossless under speculation: with repetition / presence / frequency
penalties, min_length and bad_words, greedy output (and its log probs) under policies that always
draft (an oracle drafter proposing plain decoding's own tokens with every few drafts spoiled, so
accepted, recovered and bonus tokens all occur; the n-gram drafter) and under the default policy
equals plain decoding with the same settings token for token, on the torch engine (fp32) and on
the served llama.cpp engine; a seed reproduces sampled text whatever the policy drafts.
Verification applies the processors row by row with the drafts in the context
(backend/generation/logits_processors.py): were a row processed without the drafts before it, the oracle's
accepted drafts would change what the penalties see and the outputs would differ."""
import pytest
import torch

from backend.drafters import Drafter, make_drafter
from backend.engines.llama_cpp import LlamaCpp, served_gguf
from backend.engines.torch_llama import TorchLlama
from backend.generation.logits_processors import Penalties
from backend.generation.request import GenerationRequest
from backend.generation.sampling import SamplingParams
from loop_helpers import make_loop, run_all, served_policy
from policy.speculator import Draft
from test_lossless import PROMPTS as BASE

PROMPTS = BASE[:8]
MAX_TOKENS = 24
SETTINGS = {
    "penalties": Penalties(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3, min_length=12),
    "min_length_bad_words": Penalties(min_length=MAX_TOKENS, bad_words=(" the", " The", "mat", " of the")),
}


class Oracle(Drafter):
    """Drafts the continuation plain decoding produced (recorded token ids), spoiling the last
    draft whenever the context length is 2 mod 5 (a rejection, then a recovered token)."""
    name = "oracle"

    def __init__(self, refs):
        self.refs = refs

    def propose(self, seq_id, tokens, gamma):
        tokens = list(tokens)
        for ref in self.refs:
            if ref[: len(tokens)] == tokens:
                d = list(ref[len(tokens): len(tokens) + gamma])
                if d and len(tokens) % 5 == 2:
                    d[-1] = (d[-1] + 1) % 1000
                return Draft(tokens=d, confidences=[1.0] * len(d))
        return Draft(tokens=[])


def recorded(loop):
    """Keep every finished sequence's token ids (prompt + output) in loop.refs."""
    loop.refs, release = [], loop._release

    def keep(seq):
        loop.refs.append(list(seq.tokens))
        release(seq)
    loop._release = keep
    return loop


def requests(pen, sampling=SamplingParams(), seed=None, log_probs=True):
    return [GenerationRequest(prompt=p, max_new_tokens=MAX_TOKENS, exclude_input_in_output=True, penalties=pen,
                              sampling=sampling, seed=seed, return_log_probs=log_probs) for p in PROMPTS]


def outputs(loop, reqs):
    sinks = run_all(loop, reqs)
    assert not any(s.errors for s in sinks)
    return [(s.chunks[-1].text, s.chunks[-1].output_log_probs) for s in sinks]


def assert_same(want, got, what, tol):
    for p, (ta, la), (tb, lb) in zip(PROMPTS, want, got):
        assert tb == ta, f"{what}: text differs for {p[:40]!r}"
        assert len(la) == len(lb) and all(abs(a - b) <= tol for a, b in zip(la, lb)), f"{what}: log probs differ"


@pytest.fixture(scope="module")
def torch_engine(checkpoint):
    return TorchLlama(checkpoint, dtype="fp32", max_slots=4, max_context=512)


@pytest.fixture(scope="module")
def llama_engine(checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs torch beside llama.cpp
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=4, max_context=512)
    yield eng
    eng.close()
    torch.set_num_threads(threads)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("engine_name", ["torch", "llama.cpp"])
def test_greedy_with_processors_equals_plain_under_speculation(request, tokenizer, engine_name, setting):
    engine = request.getfixturevalue("torch_engine" if engine_name == "torch" else "llama_engine")
    pen = SETTINGS[setting]
    base = recorded(make_loop(engine, tokenizer, "off", max_batch=1))
    plain = outputs(base, requests(pen))
    oracle = make_loop(engine, tokenizer, "static", max_batch=4, drafters={"oracle": Oracle(base.refs)},
                       drafter="oracle", gamma=4)
    assert_same(plain, outputs(oracle, requests(pen)), f"oracle drafts, {setting}", tol=1e-4)
    assert oracle.stats.accepted > 2 * len(PROMPTS) and oracle.stats.accepted < oracle.stats.drafted
    static = make_loop(engine, tokenizer, "static", max_batch=4, drafter="ngram", gamma=4)
    assert_same(plain, outputs(static, requests(pen)), f"static ngram, {setting}", tol=1e-4)
    default = make_loop(engine, tokenizer, "off", max_batch=4)
    default.policy = served_policy("composite", engine=engine_name, **({"dtype": "fp32"} if engine_name == "torch" else {}))
    assert_same(plain, outputs(default, requests(pen)), f"default policy, {setting}", tol=1e-4)
    if setting == "min_length_bad_words":  # token-level, as TensorRT-LLM: the words' tokens never follow
        bad = [tokenizer(w, add_special_tokens=False).input_ids for w in pen.bad_words]
        for (text, lps), ref in zip(plain, base.refs):
            assert len(lps) == MAX_TOKENS
            out = ref[len(ref) - MAX_TOKENS:]
            assert not any(w[0] in out for w in bad if len(w) == 1)


@pytest.mark.parametrize("engine_name", ["torch", "llama.cpp"])
def test_seeded_sampling_with_processors_is_reproduced_whatever_the_policy_drafts(request, tokenizer, engine_name):
    engine = request.getfixturevalue("torch_engine" if engine_name == "torch" else "llama_engine")
    pen = Penalties(repetition_penalty=1.2, presence_penalty=0.2, frequency_penalty=0.1, min_length=8,
                    bad_words=(" the",))
    sampling = SamplingParams(temperature=0.8, top_p=0.95)
    base = recorded(make_loop(engine, tokenizer, "off", max_batch=1))
    plain = outputs(base, requests(pen, sampling, seed=11))
    oracle = make_loop(engine, tokenizer, "static", max_batch=4, drafters={"oracle": Oracle(base.refs)},
                       drafter="oracle", gamma=4)
    assert_same(plain, outputs(oracle, requests(pen, sampling, seed=11)), "seeded, oracle drafts", tol=1e-4)
    assert oracle.stats.accepted > 2 * len(PROMPTS)
    static = make_loop(engine, tokenizer, "static", max_batch=4, drafter="ngram", gamma=4)
    assert_same(plain, outputs(static, requests(pen, sampling, seed=11)), "seeded, static ngram", tol=1e-4)


def test_log_probs_are_the_target_distribution_of_each_emitted_token(torch_engine, tokenizer):
    """Plain greedy: each log prob is log_softmax of the logits at that position (checked by one
    forward over prompt + output); cum_log_probs is their sum."""
    req = [GenerationRequest(prompt="The capital of France is", max_new_tokens=8, exclude_input_in_output=True,
                             return_log_probs=True)]
    sink = run_all(make_loop(torch_engine, tokenizer, "static", max_batch=1, drafter="ngram", gamma=3), req)[0]
    chunk = sink.chunks[-1]
    assert chunk.num_output_tokens > 0 and len(chunk.output_log_probs) == chunk.num_output_tokens
    assert abs(chunk.cum_log_prob - sum(chunk.output_log_probs)) < 1e-3
    assert all(lp <= 0 for lp in chunk.output_log_probs)
    ids = tokenizer("The capital of France is").input_ids  # the first token's log prob, from one forward
    logits = torch_engine.forward([3], [0], [ids], logit_rows=[[len(ids) - 1]])
    torch_engine.truncate(3, 0)
    first = int(logits[0].argmax())
    assert abs(float(torch.log_softmax(logits[0].float(), -1)[first]) - chunk.output_log_probs[0]) < 1e-4
