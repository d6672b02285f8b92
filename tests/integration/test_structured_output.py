"""Structured output against the real server: OpenAI's response_format (json_object, json_schema)
with the official client, TensorRT-LLM's guided_decoding_guide_type / guided_decoding_guide over
HTTP generate and gRPC streaming, a guided request beside unguided ones, and clear 400s for
guides that cannot compile."""
import json
import re
import threading
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

CITY = {"type": "object", "properties": {"city": {"type": "string"}, "country": {"type": "string"},
                                          "population": {"type": "integer"}},
        "required": ["city", "country", "population"], "additionalProperties": False}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"http://{server.http}/v1", api_key="unused", max_retries=0, timeout=120)


def generate(server, payload, model="llm"):
    req = urllib.request.Request(f"http://{server.http}/v2/models/{model}/generate",
                                 data=json.dumps(payload).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def ask(client, content, response_format, **kw):
    return client.chat.completions.create(model="llm", messages=[{"role": "user", "content": content}],
                                          temperature=0, max_tokens=kw.pop("max_tokens", 64),
                                          response_format=response_format, **kw)


def test_json_schema_response_matches_the_schema(client):
    r = ask(client, "Describe Rome as JSON.", {"type": "json_schema",
                                               "json_schema": {"name": "city", "schema": CITY, "strict": True}})
    value = json.loads(r.choices[0].message.content)
    assert list(value) == ["city", "country", "population"]
    assert isinstance(value["city"], str) and isinstance(value["population"], int)
    assert r.choices[0].finish_reason == "stop"


def test_json_schema_streams_the_same_text(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY}}
    whole = ask(client, "Describe Rome as JSON.", fmt).choices[0].message.content
    chunks = list(ask(client, "Describe Rome as JSON.", fmt, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def test_json_object_response_is_a_json_object(client):
    r = ask(client, "List three fruits with their colours as JSON.", {"type": "json_object"}, max_tokens=96)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # cut by max_tokens: still an object's beginning
        assert r.choices[0].message.content.startswith("{")


def test_text_response_format_changes_nothing(client):
    plain = ask(client, "Say hello.", None, max_tokens=16).choices[0].message.content
    assert ask(client, "Say hello.", {"type": "text"}, max_tokens=16).choices[0].message.content == plain


@pytest.mark.parametrize("fmt, words", [
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "frob"}}}, "cannot be compiled"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "schema"),
    ({"type": "yaml"}, "response_format.type"),
    ("json", "response_format must be an object"),
])
def test_a_response_format_that_cannot_be_served_is_a_400_naming_it(client, fmt, words):
    with pytest.raises(openai.BadRequestError) as e:
        ask(client, "hi", fmt)
    assert words in str(e.value) and e.value.body.get("param") == "response_format"


def test_guided_inputs_on_generate(server):
    out = generate(server, {"text_input": "What year comes after 2024? Answer with digits.", "max_tokens": 16,
                            "apply_chat_template": True, "exclude_input_in_output": True,
                            "guided_decoding_guide_type": "regex", "guided_decoding_guide": r"\d{4}"})
    assert re.fullmatch(r"\d{4}", out["text_output"]), out
    out = generate(server, {"text_input": "Is the sky blue?", "max_tokens": 8, "apply_chat_template": True,
                            "exclude_input_in_output": True, "guided_decoding_guide_type": "ebnf_grammar",
                            "guided_decoding_guide": 'root ::= "yes" | "no"'}, model="ensemble")
    assert out["text_output"] in ("yes", "no"), out


@pytest.mark.parametrize("payload, words", [
    ({"guided_decoding_guide_type": "regex", "guided_decoding_guide": "(["}, "cannot be compiled"),
    ({"guided_decoding_guide_type": "xml", "guided_decoding_guide": "<a/>"}, "guided_decoding_guide_type"),
    ({"guided_decoding_guide": r"\d+"}, "needs guided_decoding_guide_type"),
    ({"guided_decoding_guide_type": "json_schema"}, "guided_decoding_guide is required"),
])
def test_a_bad_guide_on_generate_is_a_400_naming_the_input(server, payload, words):
    with pytest.raises(urllib.error.HTTPError) as e:
        generate(server, dict({"text_input": "hi", "max_tokens": 4}, **payload))
    assert e.value.code == 400 and words in e.value.read().decode()


def test_guided_grpc_stream_beside_unguided_requests(server):
    """A guided request streams over gRPC while unguided ones run in the same batch; each unguided
    text is the one it gets alone."""
    import tritonclient.grpc as grpcclient

    prompts = ["Tell me about Paris.", "Name three rivers.", "What is two plus two?"]
    alone = [generate(server, {"text_input": p, "max_tokens": 24, "apply_chat_template": True,
                               "exclude_input_in_output": True})["text_output"] for p in prompts]
    texts, errors = [], []

    def stream():
        def t(name, value, dtype):
            x = grpcclient.InferInput(name, [1, 1], dtype)
            x.set_data_from_numpy(np.array([[value]], dtype=object if dtype == "BYTES" else np.int32
                                           if dtype == "INT32" else bool))
            return x
        c = grpcclient.InferenceServerClient(server.grpc)
        c.start_stream(callback=lambda result, error: errors.append(error) if error else
                       texts.append(result.as_numpy("text_output").reshape(-1)[0].decode()))
        c.async_stream_infer("llm", [t("text_input", b"Describe Paris as JSON.", "BYTES"), t("max_tokens", 48, "INT32"),
                                     t("stream", True, "BOOL"), t("apply_chat_template", True, "BOOL"),
                                     t("guided_decoding_guide_type", b"json_schema", "BYTES"),
                                     t("guided_decoding_guide", json.dumps(CITY).encode(), "BYTES")])
        c.stop_stream()
        c.close()

    th = threading.Thread(target=stream)
    th.start()
    beside = [None] * len(prompts)

    def run(i):
        beside[i] = generate(server, {"text_input": prompts[i], "max_tokens": 24, "apply_chat_template": True,
                                      "exclude_input_in_output": True})["text_output"]
    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for w in workers:
        w.start()
    for w in workers + [th]:
        w.join(180)
    assert not errors and len(texts) > 1
    text = "".join(texts)
    assert text.startswith('{"city": "') and '"country": "' in text
    assert beside == alone
