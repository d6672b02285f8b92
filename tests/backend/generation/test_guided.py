"""Structured output (backend/generation/guided.py, backend/drafters/grammar.py): the grammar's masks,
draft cutting and forced tokens against llguidance on the served tokenizer; then lossless on the
served engine: guided greedy output under every policy, alone and in a batch of 8 beside unguided
requests, equals constrained plain decoding token for token, and seeded sampling gives the same
text whatever the policy drafts (so it samples the constrained distribution, as plain decoding)."""
import json
import logging
import re

import pytest
import torch

from backend.drafters import make_drafter
from backend.engines.llama_cpp import LlamaCpp, served_gguf
from backend.generation.guided import Guide, GuideCompiler, GuidedProcessor, GuideError, guide_problem
from backend.generation.logits_processors import LogitsProcessor, Penalties
from backend.generation.request import GenerationRequest, RequestError
from backend.generation.sampling import SamplingParams
from loop_helpers import make_loop, run_all, served_policy
from policy import POLICIES

PERSON = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]}},
    "required": ["name", "age", "city"], "additionalProperties": False}
DOC = '{"name": "Ada", "age": 36, "city": "London"}'


@pytest.fixture(scope="module")
def compiler(tokenizer):
    return GuideCompiler(tokenizer, len(tokenizer))


@pytest.fixture(scope="module")
def doc_ids(tokenizer):
    return tokenizer(DOC, add_special_tokens=False).input_ids


def person(compiler, eos=(2,)):
    return compiler.compile(Guide("json_schema", json.dumps(PERSON)), 0, frozenset(eos))


def test_each_row_of_a_verified_step_has_the_mask_plain_decoding_would_apply(compiler, doc_ids):
    state = person(compiler)
    for k in range(0, len(doc_ids) - 3, 3):
        drafts = doc_ids[k: k + 3]
        rows = state.allowed(doc_ids[:k], drafts, 4)
        for j in range(4):
            alone = person(compiler).allowed(doc_ids[: k + j], (), 1)[0]
            assert torch.equal(rows[j], alone), (k, j)
            if j < 3:
                assert rows[j][drafts[j]]  # the document is valid: each of its tokens is allowed


def test_the_state_after_drafts_that_were_not_all_committed_is_the_committed_ones(compiler, tokenizer):
    """Drafts consumed for the masks, then other tokens committed: the state is that of the committed
    tokens (llguidance 1.9.1's rollback left `{"name` allowing `",` here; GuideState never rolls back)."""
    ids = tokenizer('[{"name": "Banana", "description": "Banana"}, {"name', add_special_tokens=False).input_ids
    second = [i for i, t in enumerate(ids) if tokenizer.decode([t]) == "Ban"][1]
    drafts = tokenizer('Banana", "description": "', add_special_tokens=False).input_ids
    state = compiler.compile(Guide("json"), 0, frozenset({2}))
    state.allowed(ids[:second], drafts, len(drafts) + 1)
    got = state.allowed(ids, (), 1)[0]  # the rest committed in one step
    assert torch.equal(got, compiler.compile(Guide("json"), 0, frozenset({2})).allowed(ids, (), 1)[0])
    assert state.forced(ids, 8) == compiler.compile(Guide("json"), 0, frozenset({2})).forced(ids, 8)
    closing = tokenizer('",', add_special_tokens=False).input_ids
    assert len(closing) == 1 and not got[closing[0]]  # after `{"name` a key's `":` must come


def test_rows_after_a_refused_draft_repeat_the_last_allowed_state(compiler, tokenizer, doc_ids):
    state = person(compiler)
    bad = tokenizer("}", add_special_tokens=False).input_ids[0]  # `{"` then `}`: not a valid object start here
    rows = state.allowed(doc_ids[:1], [bad, doc_ids[1]], 3)
    assert not rows[0][bad] and torch.equal(rows[1], rows[0]) and torch.equal(rows[2], rows[0])
    assert state.consumed == 1 and torch.equal(state.allowed(doc_ids[:1], (), 1)[0], rows[0])  # nothing kept


def test_drafts_are_cut_where_they_leave_the_grammar(compiler, tokenizer, doc_ids):
    state = person(compiler)
    junk = tokenizer(" hello", add_special_tokens=False).input_ids
    k = next(k for k in range(len(doc_ids)) if tokenizer.decode(doc_ids[:k]).endswith('"age": '))
    assert state.valid_prefix(doc_ids[:k], doc_ids[k: k + 4]) == 4
    assert state.valid_prefix(doc_ids[:k], junk) == 0  # a number must come: no words
    assert state.valid_prefix(doc_ids[:k], doc_ids[k: k + 2] + junk + doc_ids[k + 2: k + 3]) == 2
    assert state.valid_prefix(doc_ids[:k], []) == 0


def test_the_grammar_forces_keys_and_punctuation(compiler, tokenizer, doc_ids):
    state = person(compiler)
    start = tokenizer.decode(state.forced([], 8))
    assert start and '{"name": "'.startswith(start), start
    after_name = tokenizer.decode(doc_ids[:7])
    assert after_name.endswith('"Ada",'), after_name
    forced = tokenizer.decode(state.forced(doc_ids[:7], 8))
    assert forced and ' "age": '.startswith(forced) and "age" in forced, forced
    assert state.forced(doc_ids[:7], 0) == []
    assert state.consumed == 7  # forcing looks ahead without consuming


def test_the_grammars_end_allows_the_requests_own_end_tokens(compiler, tokenizer):
    state = compiler.compile(Guide("regex", r"\d{4}"), 0, frozenset({7}))
    digits = tokenizer("2025", add_special_tokens=False).input_ids
    row = state.allowed(digits, (), 1)[0]
    assert row.nonzero().flatten().tolist() == [7]


def test_a_grammar_that_ended_without_end_tokens_still_allows_a_token(compiler, tokenizer):
    """end_id -1 (no end token): past the grammar's end the model may only repeat the grammar's own
    end token, until max_tokens, never sample from an empty row."""
    state = compiler.compile(Guide("regex", "yes"), 0, frozenset())
    yes = tokenizer("yes", add_special_tokens=False).input_ids
    eos = compiler.ll_tokenizer.eos_token
    assert state.allowed(yes, (), 1)[0].nonzero().flatten().tolist() == [eos]
    assert state.allowed(yes + [eos, eos], (), 1)[0].nonzero().flatten().tolist() == [eos]


def test_min_length_gives_way_when_the_grammar_must_end(compiler, tokenizer):
    state = compiler.compile(Guide("ebnf_grammar", 'root ::= "yes" | "no"'), 0, frozenset({2}))
    penalties = LogitsProcessor(Penalties(min_length=5), [], [2])
    proc = GuidedProcessor(state, penalties)
    yes = tokenizer("yes", add_special_tokens=False).input_ids
    out = proc(torch.zeros(1, len(tokenizer)), yes, (), len(yes))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [2]


@pytest.mark.parametrize("guide, words", [
    (Guide("xml", "<a/>"), "guided_decoding_guide_type"),
    (Guide("regex", ""), "guided_decoding_guide is required"),
    (Guide("regex", "(["), "cannot be compiled"),
    (Guide("json_schema", "{nope"), "not valid JSON"),
    (Guide("json_schema", "[1]"), "JSON Schema"),
    (Guide("json_schema", '{"type": "frob"}'), "cannot be compiled"),
    (Guide("ebnf_grammar", "root ::= missing"), "not a valid EBNF grammar"),
])
def test_a_guide_that_cannot_compile_is_refused_naming_it(compiler, guide, words):
    with pytest.raises(GuideError, match=re.escape(words)):
        compiler.compile(guide, 0, frozenset({2}))
    assert words in guide_problem(guide)


@pytest.mark.parametrize("guide", [Guide("json"), Guide("json_schema", json.dumps(PERSON)), Guide("regex", r"\d+"),
                                   Guide("ebnf_grammar", 'root ::= [0-9]+ "." [0-9]'), Guide("ebnf_grammar", 'start: "a"+')])
def test_valid_guides_compile(compiler, guide):
    assert guide_problem(guide) is None
    compiler.compile(guide, 0, frozenset({2}))


# -- lossless on the served engine ---------------------------------------------------------------
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                          "population": {"type": "integer"}},
        "required": ["city", "country", "population"], "additionalProperties": False}
GUIDED = [
    ("Describe a person as JSON.", Guide("json_schema", json.dumps(PERSON))),
    ("Describe Paris as JSON.", Guide("json_schema", json.dumps(CITY))),
    ("Describe Rome as JSON.", Guide("json_schema", json.dumps(CITY))),
    ("Give me a JSON list of three fruits.", Guide("json")),
    ("What year comes after 2024? Answer with digits.", Guide("regex", r"\d{4}")),
    ("Is the sky blue? Answer yes or no.", Guide("ebnf_grammar", 'root ::= "yes" | "no"')),
    ("Write a phone number.", Guide("regex", r"\(\d{3}\) \d{3}-\d{4}")),
]
UNGUIDED = ["Tell me about Paris.", "Repeat exactly, twice: 'I have read about glaciers today.'"]
MAX_TOKENS = 40


def requests(sampled=False):
    sampling = SamplingParams(temperature=0.8, top_p=0.95) if sampled else SamplingParams()
    out = [GenerationRequest(prompt=p, max_new_tokens=MAX_TOKENS, exclude_input_in_output=True, apply_chat_template=True,
                             guide=g, sampling=sampling, seed=11 + i if sampled else None)
           for i, (p, g) in enumerate(GUIDED)]
    return out + [GenerationRequest(prompt=p, max_new_tokens=MAX_TOKENS, exclude_input_in_output=True,
                                    apply_chat_template=True, sampling=sampling, seed=3 if sampled else None)
                  for p in UNGUIDED]


@pytest.fixture(scope="module")
def engine(checkpoint):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    eng = LlamaCpp(served_gguf(checkpoint), max_slots=8, max_context=512)
    yield eng
    eng.close()
    torch.set_num_threads(threads)


def drafters():
    return {n: make_drafter(n) for n in ("ngram", "suffix", "grammar")}


def outputs(loop, sampled=False):
    sinks = run_all(loop, requests(sampled))
    assert not [s.errors for s in sinks if s.errors]
    return [(s.chunks[-1].text, s.chunks[-1].finish_reason) for s in sinks]


@pytest.fixture(scope="module")
def plain(engine, tokenizer):
    return outputs(make_loop(engine, tokenizer, "off", max_batch=1, drafters=drafters()))


def test_plain_constrained_output_matches_each_grammar(plain, tokenizer, compiler):
    finished = 0
    for (prompt, guide), (text, finish) in zip(GUIDED, plain):
        # every output is a prefix the grammar allows (a finished one, all of it)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        assert compiler.compile(guide, 0, frozenset({2})).valid_prefix([], ids) == len(ids), text
        if finish != "stop":
            continue
        finished += 1
        if guide.type == "regex":
            assert re.fullmatch(guide.text, text), (prompt, text)
        elif guide.type == "ebnf_grammar":
            assert text in ("yes", "no"), text
        else:
            value = json.loads(text)
            if guide.type == "json_schema":
                schema = json.loads(guide.text)
                assert list(value) == schema["required"], text
                assert all(isinstance(value[k], str if schema["properties"][k]["type"] == "string" else int)
                           for k in value)
            else:
                assert isinstance(value, (list, dict))
    assert finished >= 5, plain


def policy_loop(engine, tokenizer, name, batch):
    """A loop with the server's drafters under policy `name` (its served config), or the static
    grammar drafter (name "grammar")."""
    if name == "grammar":
        return make_loop(engine, tokenizer, "static", max_batch=batch, drafters=drafters(), drafter="grammar", gamma=6)
    loop = make_loop(engine, tokenizer, "off", max_batch=batch, drafters=drafters())
    loop.policy = served_policy(name, engine="llama.cpp")
    return loop


@pytest.mark.parametrize("batch", [1, 8], ids=["alone", "batch8"])
@pytest.mark.parametrize("name", sorted(POLICIES) + ["grammar"])
def test_guided_output_is_lossless_under_every_policy(engine, tokenizer, plain, name, batch, caplog):
    loop = policy_loop(engine, tokenizer, name, batch)
    with caplog.at_level(logging.ERROR, logger="specserve.guided"):
        got = outputs(loop)
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # a grammar state gone wrong
    differ = [p[:30] for p, a, b in zip([p for p, _ in GUIDED] + UNGUIDED, plain, got) if a != b]
    assert not differ, f"{name}, max_batch {batch}: {len(differ)} outputs differ: {differ}"
    assert not loop.guides, "finished sequences left their grammar state behind"


def test_the_grammar_drafter_drafts_what_the_target_accepts(engine, tokenizer, plain):
    loop = policy_loop(engine, tokenizer, "grammar", 8)
    assert outputs(loop) == plain
    assert loop.stats.drafted >= 20, "the grammar forced almost nothing: the test proves little"
    assert loop.stats.accepted >= 0.8 * loop.stats.drafted, (loop.stats.accepted, loop.stats.drafted)


def test_drafts_that_leave_the_grammar_are_cut_before_the_forward(engine, tokenizer, plain):
    """n-gram drafts copy earlier tokens, which a grammar often refuses: they are cut before the
    forward, so every draft token a guided sequence verifies is one its grammar allows."""
    loop = make_loop(engine, tokenizer, "static", max_batch=8, drafters=drafters(), drafter="ngram", gamma=4)
    verified, cuts = [], []
    trim, verify = loop.spec.trim, loop._verify

    def counting_trim(seq_id, tokens, draft):
        kept = trim(seq_id, tokens, draft)
        cuts.append(len(draft) - kept)
        return kept

    def checking_verify(proposal, batch, logits, feats):
        for seq, draft in zip(batch, proposal.drafts):
            if seq.guide is not None and len(draft):
                verified.append(seq.guide.valid_prefix(seq.tokens, draft.tokens) == len(draft))
        return verify(proposal, batch, logits, feats)
    loop.spec.trim, loop._verify = counting_trim, checking_verify
    assert outputs(loop) == plain
    assert verified and all(verified), f"{verified.count(False)} drafts verified past the grammar"
    assert sum(cuts) > 0, "no draft ever left the grammar: the test proves little"


def test_forced_rows_are_the_rows_with_one_allowed_token(compiler, doc_ids):
    state = person(compiler)
    for k in range(0, len(doc_ids) - 4, 2):
        drafts = doc_ids[k: k + 4]
        masks = person(compiler).allowed(doc_ids[:k], drafts, 5)
        want = [bool(masks[j].sum() == 1 and masks[j, d]) for j, d in enumerate(drafts)]
        assert state.forced_rows(doc_ids[:k], drafts) == want, k
    assert any(state.forced_rows([], doc_ids[:8])) and not all(state.forced_rows([], doc_ids[:8]))


def test_forced_rows_become_a_point_mass_on_their_draft_token():
    from backend.loop.forced_rows import with_forced_rows
    computed = torch.arange(4 * 5, dtype=torch.float32).reshape(4, 5)  # rows kept: a0 a2 b0 b1
    full = with_forced_rows(computed, [[3, 1], [4]], [[0, 2], [0, 1]])
    assert full.shape == (5, 5)
    assert torch.equal(full[[0, 2, 3, 4]], computed)
    assert full[1].tolist() == [float("-inf"), 0.0] + [float("-inf")] * 3  # row 1 of a: its draft token 1


def test_the_logits_of_forced_rows_are_not_computed_and_output_is_unchanged(engine, tokenizer, plain):
    loop = policy_loop(engine, tokenizer, "grammar", 8)
    asked, forward = [], loop._forward

    def counting_forward(slots, starts, tokens, logit_rows=None):
        if any(len(t) > 1 for t in tokens) and logit_rows is not None:
            asked.append((sum(len(t) for t in tokens), sum(len(r) for r in logit_rows)))
        return forward(slots, starts, tokens, logit_rows)
    loop._forward = counting_forward
    assert outputs(loop) == plain
    inputs, computed = map(sum, zip(*asked))
    assert computed < 0.8 * inputs, (computed, inputs)  # JSON's keys and punctuation: forced


@pytest.mark.parametrize("name", ["grammar", "composite"])
def test_seeded_guided_sampling_is_the_same_text_whatever_the_policy(engine, tokenizer, name):
    want = outputs(make_loop(engine, tokenizer, "off", max_batch=1, drafters=drafters()), sampled=True)
    loop = policy_loop(engine, tokenizer, name, 8)
    assert outputs(loop, sampled=True) == want
    if name == "grammar":
        assert loop.stats.drafted > 0
    for (prompt, guide), (text, finish) in zip(GUIDED, want):
        if guide.type == "regex" and finish == "stop":
            assert re.fullmatch(guide.text, text), text


def test_a_request_with_a_bad_guide_is_refused_at_submission(engine, tokenizer):
    loop = make_loop(engine, tokenizer, "off", max_batch=1, drafters=drafters())
    with pytest.raises(RequestError, match="cannot be compiled"):
        loop.submit(GenerationRequest(prompt="hi", max_new_tokens=16, guide=Guide("regex", "([")), None)
    with pytest.raises(RequestError, match="guided_decoding_guide_type"):
        loop.submit(GenerationRequest(prompt="hi", max_new_tokens=16, guide=Guide("yaml", "a: b")), None)
    assert not loop.guides
