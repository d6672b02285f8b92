"""NVIDIA's token-level models without Triton (backend/frontend/triton_models/token_models.py, the word-list
format in backend/generation/word_lists.py) on the served checkpoint's tokenizer, and what a
token-level request sends back (backend/generation/sequence.py). The real server runs them in
tests/integration/test_token_models.py."""
import numpy as np
import pytest

from backend.frontend.triton_models.token_models import llm_inputs, postprocess, preprocess
from backend.generation import word_lists
from backend.generation.request import GenerationRequest, RequestError, prompt_ids
from backend.generation.sequence import Sequence


def test_word_lists_round_trip_and_padding():
    arr = word_lists.encode([[5, 6], [], [7]], width=5)
    assert arr.tolist() == [[5, 6, 7, 0, 0], [2, 3, -1, -1, -1]] and arr.dtype == np.int32
    assert word_lists.decode(arr) == [[5, 6], [7]]
    assert word_lists.decode(np.array([[0], [-1]])) == []  # NVIDIA's form of "no words"
    for bad in (np.zeros((3, 2)), np.array([[1, 2], [2, 1]]), np.array([[1], [4]])):
        with pytest.raises(ValueError, match="word list"):
            word_lists.decode(bad)


def q(*texts):
    return np.array([[t.encode()] for t in texts], dtype=object)


def test_preprocessing_tokenizes_as_llm_does(tokenizer):
    out = preprocess(tokenizer, {"QUERY": q("Hello there, friend", "Hi"), "REQUEST_OUTPUT_LEN": np.array([[8], [9]], np.int32),
                                 "STOP_WORDS_DICT": np.array([[b"friend", b""], [b"\n", b"Hi"]], dtype=object)})
    ids = [prompt_ids(tokenizer, GenerationRequest(prompt=p, max_new_tokens=16)) for p in ("Hello there, friend", "Hi")]
    pad = tokenizer.pad_token_id
    assert out["INPUT_ID"].dtype == np.int32 and out["INPUT_ID"].tolist() == [ids[0], ids[1] + [pad] * (len(ids[0]) - len(ids[1]))]
    assert out["REQUEST_INPUT_LEN"].tolist() == [[len(ids[0])], [len(ids[1])]]
    assert out["REQUEST_OUTPUT_LEN"].tolist() == [[8], [9]]
    assert out["OUT_END_ID"].tolist() == [[tokenizer.eos_token_id]] * 2 and out["OUT_PAD_ID"].tolist() == [[pad]] * 2
    stops = out["STOP_WORDS_IDS"]
    assert stops.shape[:2] == (2, 2) and stops.dtype == np.int32
    assert word_lists.decode(stops[0]) == [tokenizer("friend", add_special_tokens=False).input_ids]
    assert len(word_lists.decode(stops[1])) == 2
    assert word_lists.decode(out["BAD_WORDS_IDS"][0]) == []
    assert out["EMBEDDING_BIAS"].shape == (2, 0) and out["DECODER_INPUT_ID"].tolist() == [[pad]] * 2


def test_preprocessing_end_and_pad_ids_and_refusals(tokenizer):
    out = preprocess(tokenizer, {"QUERY": q("a"), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
                                 "END_ID": np.array([[7]], np.int32), "PAD_ID": np.array([[0]], np.int32)})
    assert out["OUT_END_ID"].tolist() == [[7]] and out["OUT_PAD_ID"].tolist() == [[0]]
    with pytest.raises(RequestError, match="QUERY is missing"):
        preprocess(tokenizer, {"REQUEST_OUTPUT_LEN": np.array([[4]], np.int32)})
    with pytest.raises(RequestError, match="REQUEST_OUTPUT_LEN is missing"):
        preprocess(tokenizer, {"QUERY": q("a")})
    with pytest.raises(RequestError, match="EMBEDDING_BIAS_WORDS is not served"):
        preprocess(tokenizer, {"QUERY": q("a"), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32),
                               "EMBEDDING_BIAS_WORDS": np.array([[b"x"]], dtype=object)})
    with pytest.raises(RequestError, match="QUERY is not valid UTF-8"):
        preprocess(tokenizer, {"QUERY": np.array([[b"\xff"]], dtype=object), "REQUEST_OUTPUT_LEN": np.array([[4]], np.int32)})


def test_postprocessing_decodes_each_beam_to_its_length(tokenizer):
    a, b = (tokenizer(t, add_special_tokens=False).input_ids for t in ("Hello world", "Bye"))
    tokens = np.zeros((2, 1, len(a)), np.int32)
    tokens[0, 0], tokens[1, 0, :len(b)] = a, b
    out = postprocess(tokenizer, tokens, np.array([[len(a)], [len(b)]], np.int32))
    assert out.tolist() == [b"Hello world", b"Bye"]
    with pytest.raises(RequestError, match="SEQUENCE_LENGTH 9 is outside"):
        postprocess(tokenizer, tokens[:1], np.array([[9]], np.int32))
    with pytest.raises(RequestError, match="outside the vocabulary"):
        postprocess(tokenizer, np.array([[[1 << 30]]], np.int32), np.array([[1]], np.int32))


def test_postprocessing_ids_that_split_a_character(tokenizer):
    """A fox emoji is several byte-level tokens: a piece that ends inside it decodes to U+FFFD
    (valid UTF-8, no error); the whole sequence decodes exactly."""
    ids = tokenizer("a 🦊 b", add_special_tokens=False).input_ids
    whole = postprocess(tokenizer, np.array([[ids]], np.int32), np.array([[len(ids)]], np.int32))
    assert whole[0].decode() == "a 🦊 b"
    cut = next(n for n in range(1, len(ids)) if "\ufffd" in tokenizer.decode(ids[:n]))
    piece = postprocess(tokenizer, np.array([[ids]], np.int32), np.array([[cut]], np.int32))[0]
    assert piece.decode("utf-8").endswith("\ufffd")


def test_tensorrt_llm_inputs_become_llms():
    values = {"input_ids": np.array([[5, 6, 7, 0]], np.int32), "input_lengths": np.array([[3]], np.int32),
              "request_output_len": np.array([[8]], np.int32), "streaming": np.array([[True]]),
              "runtime_top_k": np.array([[1]], np.int32), "runtime_top_p": np.array([[0.0]], np.float32),
              "seed": np.array([[3]], np.uint64), "end_id": np.array([[2]], np.int32),
              "decoder_input_ids": np.array([[2]], np.int32), "guided_decoding_guide_type": np.array([[b"json"]], object)}
    out = llm_inputs(values)
    assert out["input_ids"].tolist() == [[5, 6, 7]]
    assert sorted(out) == ["end_id", "guided_decoding_guide_type", "input_ids", "max_tokens", "random_seed", "stream",
                           "top_k"]  # runtime_top_p 0 is TensorRT-LLM's "off"; decoder ids ignored
    values["runtime_top_p"] = np.array([[0.9]], np.float32)
    assert llm_inputs(values)["top_p"].tolist() == [[pytest.approx(0.9)]]


@pytest.mark.parametrize("change,words", [
    (dict(input_ids=None), "input_ids is missing"),
    (dict(input_ids=np.array([[1, 2], [3, 4]], np.int32)), "send one token sequence per request"),
    (dict(input_lengths=None), "input_lengths is missing"),
    (dict(input_lengths=np.array([[5]], np.int32)), "input_lengths 5 is outside [1, 2]"),
    (dict(request_output_len=None), "request_output_len is missing"),
    (dict(decoder_input_ids=np.array([[1, 2]], np.int32)), "decoder_input_ids is for encoder-decoder models"),
    (dict(embedding_bias=np.array([[0.5]], np.float32)), "embedding_bias is not served"),
    (dict(return_generation_logits=np.array([[True]])), "return_generation_logits is not served"),
])
def test_tensorrt_llm_refusals_name_the_field(change, words):
    values = {"input_ids": np.array([[1, 2]], np.int32), "input_lengths": np.array([[2]], np.int32),
              "request_output_len": np.array([[4]], np.int32)}
    values.update(change)
    with pytest.raises(RequestError, match=words.replace("[", r"\[").replace("]", r"\]")):
        llm_inputs({k: v for k, v in values.items() if v is not None})


class Sink:
    def __init__(self):
        self.sent = []

    def send(self, chunk, final):
        self.sent.append((chunk, final))


class Detok:
    text = ""

    def push(self, ids):
        self.text += "x" * len(ids)

    def flush(self):
        pass


def sequence(**req):
    r = GenerationRequest("", max_new_tokens=6, input_ids=[10, 11], return_output_ids=True, **req)
    return Sequence(seq_id=0, request=r, sink=Sink(), prompt_ids=[10, 11], tokens=[10, 11], detok=Detok(),
                    eos_ids=frozenset({2}))


@pytest.mark.parametrize("stream,exclude,expected", [(False, False, [[10, 11, 5, 6, 7]]), (False, True, [[5, 6, 7]]),
                                                     (True, False, [[5], [6, 7]])])
def test_output_ids_streamed_new_or_whole_with_the_prompt(stream, exclude, expected):
    seq = sequence(stream=stream, exclude_input_in_output=exclude)
    seq.append([5], 100)
    seq.respond(False)
    seq.append([6, 7, 2], 100)
    seq.respond(True)
    assert [c.output_ids for c, _ in seq.sink.sent] == expected


def test_token_stop_words_end_generation_and_stay_in_the_output():
    seq = sequence(stop_words_ids=[[6, 7], [11, 5, 9]])
    seq.append([5, 6, 7, 8], 100)
    assert seq.finish_reason == "stop" and seq.tokens[2:] == [5, 6, 7]  # [11, 5, ...] would need the prompt
