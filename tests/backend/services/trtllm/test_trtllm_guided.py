"""Structured output on TensorRT-LLM (backend/services/trtllm/guides.py), against the fake
`tensorrt_llm` whose executor masks guided requests as 1.2's GuidedDecoder does with its
llguidance backend (fake_executor.py, step 4b): the guides we pass give the language our CPU
engines serve (json.dumps's layout included), so guided text equals constrained plain decoding
on the CPU engine loop token for token, whatever the policy drafts, beside unguided requests;
our hook cuts drafts where the grammar refuses them and the grammar drafter's forced tokens are
accepted. NOT YET RUN ON A GPU."""
import json
import re
from pathlib import Path

import pytest

from backend.generation.guided import Guide
from backend.generation.request import GenerationRequest, RequestError
from backend.loop.offline import ListSink, make_loop, run_all
from backend.server_config import ServerConfig
from test_trtllm_serving import serve

ROOT = Path(__file__).resolve().parents[4]
MAX_CONTEXT = 128
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "city": {"type": "string", "enum": ["Paris", "London", "Berlin"]}},
          "required": ["name", "age", "city"], "additionalProperties": False}
GUIDED = [("Describe a person as JSON.", Guide("json_schema", json.dumps(PERSON))),
          ("Give me a JSON list of two fruits.", Guide("json")),
          ("What year comes after 2024? Answer with digits.", Guide("regex", r"\d{4}")),
          ("Is the sky blue? Answer yes or no.", Guide("ebnf_grammar", 'root ::= "yes" | "no"'))]


def requests():
    out = [GenerationRequest(prompt=p, max_new_tokens=32, exclude_input_in_output=True, apply_chat_template=True, guide=g)
           for p, g in GUIDED]
    return out + [GenerationRequest(prompt="Tell me about Paris.", max_new_tokens=16, exclude_input_in_output=True,
                                    apply_chat_template=True)]


@pytest.fixture
def service(fake_trtllm, trt_engine, checkpoint, tokenizer, monkeypatch):
    """-> start(speculator or None, **llm settings) -> (TrtllmService, FakePyExecutor); stopped at the end."""
    from tensorrt_llm import _fake

    from backend.services.trtllm.serving import TrtllmService
    from fake_executor import FakePyExecutor

    made = []

    def factory(llm):
        made.append(FakePyExecutor(trt_engine, llm.drafter, llm.args["speculative_config"].max_draft_len,
                                   tokenizer=tokenizer if llm.args["guided_decoding_backend"] else None))
        return made[-1]

    _fake.EXECUTOR_FACTORY = factory
    monkeypatch.setenv("TLLM_WORKER_USE_SINGLE_PROCESS", "1")
    services = []

    def start(speculator=None, policy="static", trtllm_config=""):
        cfg = ServerConfig(checkpoint=str(checkpoint), dtype="fp32", max_batch=3, max_context=MAX_CONTEXT,
                           max_tokens_limit=64, policy=policy, drafters="ngram,suffix,grammar",
                           trtllm_config=trtllm_config)
        svc = TrtllmService.from_config(cfg, ROOT, max_draft_len=4, speculator=speculator)
        svc.start()
        services.append(svc)
        return svc, made[-1]

    yield start
    for svc in services:
        svc.stop()


def grammar_speculator():
    from backend.drafters import make_drafter
    from policy.speculator import Speculator
    from policy.static import StaticPolicy
    return Speculator(StaticPolicy(drafter="grammar", gamma=4), {"grammar": make_drafter("grammar")}, lookahead=True)


@pytest.mark.parametrize("policy", ["grammar", "composite", "off"])
def test_guided_text_equals_constrained_plain_decoding_on_the_cpu(service, trt_engine, tokenizer, policy):
    spec = grammar_speculator() if policy == "grammar" else None
    svc, ex = service(spec, policy="static" if policy == "grammar" else policy)
    reqs = requests()
    ours = serve(svc, reqs)
    cpu = run_all(make_loop(trt_engine, tokenizer, policy="off", max_context=MAX_CONTEXT), requests())
    for r, a, b in zip(reqs, ours, cpu):
        assert not a.errors and a.done, a.errors
        assert a.text == b.text, (r.prompt, a.text, b.text)
    person = json.loads(ours[0].text)  # json.dumps's layout, as on the CPU
    assert json.dumps(person) == ours[0].text and set(person) == {"name", "age", "city"}
    assert ours[3].text in ("yes", "no") and len(ours[2].text) == 4
    assert ex.guided.masked_rows > 0
    if policy == "grammar":  # forced keys and punctuation were drafted, cut to the grammar, and accepted
        assert ex.drafted_by_hook > 0 and ex.accepted > 0
        assert ex.accepted == ex.drafted_by_hook, "a forced token the grammar allowed was rejected"


def test_drafts_are_cut_where_they_leave_the_grammar(service, tokenizer):
    """A drafter that always proposes words: beside an unguided request its drafts reach
    TensorRT-LLM; for a request whose regex allows digits only, every one is cut first."""
    from backend.drafters.base import Draft, Drafter
    from policy.speculator import Speculator
    from policy.static import StaticPolicy
    words = tokenizer(" hello world again and", add_special_tokens=False).input_ids

    class Words(Drafter):
        name = "words"

        def propose(self, seq_id, tokens, gamma):
            return Draft(tokens=words[:gamma], confidences=[1.0] * min(gamma, len(words)))

    spec = Speculator(StaticPolicy(drafter="words", gamma=4), {"words": Words()}, lookahead=True)
    svc, ex = service(spec)
    free = serve(svc, [GenerationRequest(prompt="Count: 1 2 3", max_new_tokens=8)])[0]
    drafted = ex.drafted_by_hook
    assert free.text and drafted > 0
    guided = serve(svc, [GenerationRequest(prompt="Count: 1 2 3", max_new_tokens=8,
                                                          exclude_input_in_output=True,
                                                          guide=Guide("regex", "[0-9]{8}"))])[0]
    assert re.fullmatch("[0-9]{1,8}", guided.text), guided.text
    assert ex.drafted_by_hook == drafted, "words were drafted where the grammar allows digits only"


def test_bad_guides_and_structured_output_switched_off_are_refused(service, tmp_path):
    svc, _ = service()
    with pytest.raises(RequestError, match="cannot be compiled|not valid"):
        svc.submit(GenerationRequest(prompt="hi", max_new_tokens=4, guide=Guide("regex", "([")), ListSink())
    with pytest.raises(RequestError, match="guided_decoding_guide_type"):
        svc.submit(GenerationRequest(prompt="hi", max_new_tokens=4, guide=Guide("yaml", "a: b")), ListSink())
    off = tmp_path / "llm.yaml"
    off.write_text("guided_decoding_backend: null\n")
    svc, _ = service(trtllm_config=str(off))
    assert svc.llm.args["guided_decoding_backend"] is None
    with pytest.raises(RequestError, match="structured output is off"):
        svc.submit(GenerationRequest(prompt="hi", max_new_tokens=4, guide=Guide("json")), ListSink())


def test_the_guides_tensorrt_llm_gets_give_the_cpu_layout(tokenizer):
    """What TensorRT-LLM's llguidance matcher factory compiles from our fields (schema with
    x-guidance, Lark for GBNF) accepts json.dumps's layout only, as our CPU grammar does."""
    import llguidance
    import llguidance.hf

    from backend.services.trtllm.guides import guided_decoding_fields
    ll = llguidance.hf.from_tokenizer(tokenizer, n_vocab=len(tokenizer))

    def accepts(grammar, text):
        m = llguidance.LLMatcher(ll, grammar, log_level=0)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        return m.validate_tokens(ids) == len(ids)

    schema = llguidance.LLMatcher.grammar_from_json_schema(guided_decoding_fields(Guide("json_schema",
                                                                                        json.dumps(PERSON)))["json"])
    assert accepts(schema, '{"name": "Ada", "age": 36, "city": "London"}')
    assert not accepts(schema, '{"name":"Ada"') and not accepts(schema, '{ "name": "Ada"')
    anything = llguidance.LLMatcher.grammar_from_json_schema(guided_decoding_fields(Guide("json"))["json"])
    assert accepts(anything, '["apple", "pear"]') and not accepts(anything, '["apple","pear"]')
    lark = guided_decoding_fields(Guide("ebnf_grammar", 'root ::= "yes" | "no"'))["grammar"]
    assert accepts(llguidance.LLMatcher.grammar_from_lark(lark), "yes")
    assert not accepts(llguidance.LLMatcher.grammar_from_lark(lark), "maybe")
    assert guided_decoding_fields(Guide("regex", r"\d{4}")) == {"regex": r"\d{4}"}
