"""Log probs in OpenAI's shapes (backend/frontend/openai/logprobs.py)."""
from backend.frontend.openai.logprobs import TokenPieces, chat_logprobs, completion_logprobs


def test_logprobs_shapes(checkpoint, tokenizer):
    pieces = TokenPieces(checkpoint)
    ids = tokenizer(" Paris é", add_special_tokens=False).input_ids
    assert [pieces(t)[0] for t in ids] == [tokenizer.decode([t]) for t in ids]
    assert bytes(b for t in ids for b in pieces(t)[1]) == " Paris é".encode()  # raw bytes join to the text
    lp = {"ids": ids, "lps": [-0.5] * len(ids), "top_ids": [[ids[0], 7]] * len(ids), "top_lps": [[-0.1, -2.0]] * len(ids)}
    chat = chat_logprobs(pieces, lp)
    assert chat["refusal"] is None and len(chat["content"]) == len(ids)
    first = chat["content"][0]
    assert first["token"] == tokenizer.decode([ids[0]]) and first["logprob"] == -0.5
    assert first["bytes"] == list(first["token"].encode())
    assert [t["token"] for t in first["top_logprobs"]] == [tokenizer.decode([ids[0]]), tokenizer.decode([7])]
    assert first["top_logprobs"][1] == {"token": tokenizer.decode([7]), "logprob": -2.0, "bytes": pieces(7)[1]}
    comp, end = completion_logprobs(pieces, lp, 3)
    assert comp["tokens"] == [pieces(t)[0] for t in ids] and comp["token_logprobs"] == [-0.5] * len(ids)
    assert comp["text_offset"][0] == 3 and end == 3 + sum(len(t) for t in comp["tokens"])
    assert comp["top_logprobs"][1] == {pieces(ids[0])[0]: -0.1, pieces(7)[0]: -2.0, pieces(ids[1])[0]: -0.5}
    no_top = dict(lp, top_ids=[], top_lps=[])
    assert chat_logprobs(pieces, no_top)["content"][0]["top_logprobs"] == []
    assert completion_logprobs(pieces, no_top, 0)[0]["top_logprobs"][0] == {pieces(ids[0])[0]: -0.5}
