"""The OpenAI-compatible API (backend/frontend/openai/ on the HTTP edge) against the real server,
with the official `openai` client and genai-perf's chat and completions endpoint types."""
import json
import os
import subprocess
import urllib.request

import openai
import pytest

QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=120)


def generate(server, payload):
    req = urllib.request.Request(f"http://{server.http}/v2/models/llm/generate", data=json.dumps(payload).encode(),
                                 method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def chat_reference(server):
    """llm's own greedy answer with its chat template (tokenizer.apply_chat_template in the model)."""
    return generate(server, {"text_input": QUESTION, "max_tokens": 24, "apply_chat_template": True,
                             "exclude_input_in_output": True})


def test_models(client):
    assert [m.id for m in client.models.list().data] == ["llm"]
    model = client.models.retrieve("llm")
    assert (model.id, model.object, model.owned_by) == ("llm", "model", "specserve")
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-4")
    err = e.value.response.json()["error"]
    assert (err["param"], err["code"], err["type"]) == ("model", "model_not_found", "invalid_request_error")


def request(server, method, path, body=None):
    """-> (status, JSON body) of any request to the HTTP port, errors included."""
    req = urllib.request.Request(f"http://{server.http}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})  # urllib's default is a form
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.parametrize("method,path,status,code", [
    ("POST", "/v1/embeddings", 404, "unknown_url"), ("GET", "/v1", 404, "unknown_url"),
    ("GET", "/v1/chat/completions/x", 404, "unknown_url"), ("POST", "/v1/models", 405, "method_not_allowed"),
    ("GET", "/v1/chat/completions", 405, "method_not_allowed"), ("DELETE", "/v1/models/llm", 405, "method_not_allowed"),
])
def test_unknown_routes_answer_openai_errors(server, method, path, status, code):
    got, body = request(server, method, path, {} if method == "POST" else None)
    assert got == status and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code and body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800"}]}, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stop": ["\udfff"]}, "stop[0]"),
    ("/v1/completions", {"prompt": "\ud83d"}, "prompt"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, body, param):
    """JSON allows "\\ud800"; UTF-8 cannot carry it to the engine (once a 503 "overloaded" with Retry-After).
    The SDK refuses to send one, so the body is sent as bytes."""
    got, answer = request(server, "POST", path, dict(body, model="llm", max_tokens=4))
    assert got == 400 and answer["error"]["param"] == param and "lone surrogate" in answer["error"]["message"]


def test_min_tokens_and_ignore_eos(client):
    """A raw question under greedy decoding ends at once on this instruct model (0 tokens): vLLM's
    min_tokens and ignore_eos (the engine's min_length) make it generate. (The end id leads the
    next token by ~1.6-1.8 logits for this prompt, in either order of llama.cpp's sums, so the
    first assertion does not hang on the kernels' last bits.)"""
    kw = dict(model="llm", prompt="What is the capital of France?", max_tokens=12, temperature=0)
    assert client.completions.create(**kw).usage.completion_tokens == 0
    r = client.completions.create(**kw, extra_body={"min_tokens": 5})
    assert r.usage.completion_tokens >= 5 and r.choices[0].text.strip()
    r = client.completions.create(**kw, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "Say hi."}],
                                          temperature=0, max_tokens=40, extra_body={"ignore_eos": True})
    assert chat.usage.completion_tokens == 40


def test_refusals_are_counted_where_they_happen(client, server):
    """An OpenAI-layer 400 (refused before Triton) counts in specserve_edge_requests_refused_total;
    the model's own 400 in specserve_requests_rejected_total, not twice."""
    edge = 'specserve_edge_requests_refused_total{api="openai",reason="invalid_request",status="400"}'
    model = 'specserve_requests_rejected_total{reason="invalid"}'
    before = server.metrics()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "hi"}], n=9)
    server.wait_metric(edge, lambda v: v == before.get(edge, 0) + 1)
    with pytest.raises(openai.BadRequestError):  # above max_tokens_limit: the model refuses it
        client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=100000)
    server.wait_metric(model, lambda v: v == before.get(model, 0) + 1)
    assert server.metrics()[edge] == before.get(edge, 0) + 1
    triton = 'specserve_edge_requests_refused_total{api="triton",reason="invalid_request",status="400"}'
    assert request(server, "POST", "/v2/models/llm/generate", {"text_input": "hi", "max_tokens": "x"})[0] == 400
    server.wait_metric(triton, lambda v: v == before.get(triton, 0) + 1)


def test_chat_completion_is_the_engine_with_its_chat_template(client, chat_reference):
    r = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": QUESTION}],
                                       temperature=0, max_tokens=24)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "llm"
    (choice,) = r.choices
    assert choice.message.role == "assistant"
    assert choice.message.content == chat_reference["text_output"] and choice.message.content
    assert choice.finish_reason == ("length" if chat_reference["finish_reason"] == "length" else "stop")
    assert r.usage.prompt_tokens == chat_reference["num_input_tokens"]
    assert r.usage.completion_tokens == chat_reference["num_output_tokens"]
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_streaming_with_usage(client, chat_reference):
    stream = client.chat.completions.create(model="llm", messages=[{"role": "user", "content": QUESTION}],
                                            temperature=0, max_completion_tokens=24, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    texts = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(texts) > 1 and "".join(texts) == chat_reference["text_output"]
    finished = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finished in (["length"], ["stop"])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == chat_reference["num_output_tokens"]


def test_conversation_with_system_and_history(client):
    messages = [{"role": "system", "content": "You answer with one word."},
                {"role": "user", "content": "Name a colour."},
                {"role": "assistant", "content": "Blue."},
                {"role": "user", "content": [{"type": "text", "text": "Name another one."}]}]
    r = client.chat.completions.create(model="llm", messages=messages, temperature=0, max_tokens=8)
    short = client.chat.completions.create(model="llm", messages=[messages[0], messages[-1]], temperature=0,
                                           max_tokens=8)
    assert r.choices[0].message.content
    # the earlier turns were sent: "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nBlue.<|im_end|>\n"
    assert r.usage.prompt_tokens >= short.usage.prompt_tokens + 10


def test_completion(client, server):
    ref = generate(server, {"text_input": "The capital of France is", "max_tokens": 8, "exclude_input_in_output": True})
    r = client.completions.create(model="llm", prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text == ref["text_output"]
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 8
    echoed = client.completions.create(model="llm", prompt="The capital of France is", max_tokens=8, temperature=0,
                                       echo=True)
    assert echoed.choices[0].text == "The capital of France is" + ref["text_output"]
    streamed = client.completions.create(model="llm", prompt="The capital of France is", max_tokens=8,
                                         temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == ref["text_output"]


def test_stop(client):
    r = client.completions.create(model="llm", prompt="1, 2, 3, 4, 5,", max_tokens=40, temperature=0, stop=["9"])
    assert "8" in r.choices[0].text and "9" not in r.choices[0].text and r.choices[0].finish_reason == "stop"


def test_seed_and_n(client):
    kw = dict(model="llm", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=12,
              temperature=0.9, top_p=0.95, seed=3, n=2)
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    texts = [c.message.content for c in sorted(a.choices, key=lambda c: c.index)]
    assert [c.index for c in sorted(a.choices, key=lambda c: c.index)] == [0, 1]
    assert texts == [c.message.content for c in sorted(b.choices, key=lambda c: c.index)]  # the seed holds
    assert texts[0] != texts[1]  # each choice has its own seed (3, 4)
    assert a.usage.completion_tokens == sum(
        client.chat.completions.create(**dict(kw, n=1, seed=s)).usage.completion_tokens for s in (3, 4))


@pytest.mark.parametrize("kwargs,status,param,words", [
    (dict(extra_body={"repetition_penalty": 1.1}), 400, "repetition_penalty", "Unrecognized request argument"),
    (dict(logit_bias={"1": 5}), 400, "logit_bias", "logit_bias is not supported"),
    (dict(top_logprobs=3), 400, "top_logprobs", "top_logprobs requires logprobs to be true"),
    (dict(logprobs=True, top_logprobs=21), 400, "top_logprobs", "top_logprobs must be between 0 and 20"),
    (dict(frequency_penalty=2.5), 400, "frequency_penalty", "frequency_penalty must be between"),
    (dict(temperature=3), 400, "temperature", "temperature must be between 0"),
    (dict(max_tokens=100000), 400, "max_tokens", "max_tokens 100000 exceeds"),  # the model's, naming the field
    (dict(top_p=1e-300), 400, "top_p", "top_p must be in (0, 1]"),  # 0 in FP32: the model's
    (dict(messages=[{"role": "user", "content": "hi", "name": 5}]), 400, "messages[0].name", "must be a string"),
    (dict(extra_body={"min_tokens": 5}), 400, "min_tokens", "min_tokens 5 exceeds max_tokens 4"),
    (dict(model="gpt-4"), 404, "model", "The model 'gpt-4' does not exist"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages[0]", "role"),
])
def test_errors_are_openai_shaped(client, kwargs, status, param, words):
    args = dict(model="llm", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    args.update(kwargs)
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(**args)
    assert e.value.status_code == status
    err = e.value.response.json()["error"]
    assert words in err["message"] and err["param"] == param and err["type"]


def _close(a, b, tol=1e-2):
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


def test_chat_logprobs_with_top_logprobs(client):
    kw = dict(model="llm", messages=[{"role": "user", "content": QUESTION}], temperature=0, max_tokens=16,
              logprobs=True, top_logprobs=3)
    r = client.chat.completions.create(**kw)
    (choice,) = r.choices
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens > 0
    assert "".join(t.token for t in content) == choice.message.content
    for t in content:
        assert t.logprob <= 0 and bytes(t.bytes) == t.token.encode() and len(t.top_logprobs) == 3
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5  # greedy
        assert [a.logprob for a in t.top_logprobs] == sorted((a.logprob for a in t.top_logprobs), reverse=True)
    plain = client.chat.completions.create(**dict(kw, logprobs=True, top_logprobs=None))
    assert [t.token for t in plain.choices[0].logprobs.content] == [t.token for t in content]
    assert all(t.top_logprobs == [] for t in plain.choices[0].logprobs.content)
    assert client.chat.completions.create(**dict(kw, logprobs=None, top_logprobs=None)).choices[0].logprobs is None
    streamed = [c for c in client.chat.completions.create(**kw, stream=True) if c.choices]
    got = [t for c in streamed if c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [t.token for t in got] == [t.token for t in content]
    assert _close([t.logprob for t in got], [t.logprob for t in content])
    assert [[a.token for a in t.top_logprobs] for t in got] == [[a.token for a in t.top_logprobs] for t in content]
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == choice.message.content


def test_completion_logprobs(client):
    kw = dict(model="llm", prompt="The capital of France is", max_tokens=8, temperature=0, logprobs=2)
    r = client.completions.create(**kw)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 8
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(8)]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert len(top) == 2 and abs(top[token] - value) < 1e-5 and value == max(top.values())  # greedy: the top one
    streamed = list(client.completions.create(**kw, stream=True))
    chunks = [c.choices[0].logprobs for c in streamed if c.choices[0].logprobs]
    assert [t for c in chunks for t in c.tokens] == lp.tokens
    assert [o for c in chunks for o in c.text_offset] == lp.text_offset
    assert _close([v for c in chunks for v in c.token_logprobs], lp.token_logprobs)
    zero = client.completions.create(**dict(kw, logprobs=0)).choices[0].logprobs
    assert zero.tokens == lp.tokens and all(list(top) == [t] for t, top in zip(zero.tokens, zero.top_logprobs))


@pytest.mark.parametrize("kwargs,words", [(dict(logprobs=6), "logprobs must be between 0 and 5"),
                                          (dict(logprobs=1, echo=True), "logprobs with echo")])
def test_completion_logprobs_errors(client, kwargs, words):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="llm", prompt="hi", max_tokens=4, **kwargs)
    err = e.value.response.json()["error"]
    assert words in err["message"] and err["param"] == "logprobs"


def test_stream_closed_by_the_client_cancels_the_request(client, server):
    server.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)
    before = server.metrics().get("specserve_requests_cancelled_total", 0)
    stream = client.chat.completions.create(model="llm", max_tokens=250, stream=True, messages=[
        {"role": "user", "content": "Write a very long essay about the history of mathematics."}])
    for _, chunk in zip(range(4), stream):  # it is generating
        pass
    stream.close()
    server.wait_metric("specserve_requests_cancelled_total", lambda v: v >= before + 1)
    server.wait_metric('specserve_sequences{state="running"}', lambda v: v == 0)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_genai_perf_openai_endpoints(server, tmp_path, checkpoint, endpoint, load_tool):
    tool = load_tool("genai-perf")
    out = subprocess.run(
        [str(tool), "profile", "-m", "llm", "--endpoint-type", endpoint, "-u", server.http, "--streaming",
         "--tokenizer", str(checkpoint), "--concurrency", "2", "--request-count", "4",
         "--synthetic-input-tokens-mean", "32", "--output-tokens-mean", "12", "--artifact-dir", str(tmp_path / "a"),
         "--extra-inputs", "ignore_eos:true"],  # genai-perf's fixed output length (vLLM's field)
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=dict(os.environ, COLUMNS="200"))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Output Token Throughput" in out.stdout and "Time To First Token" in out.stdout
