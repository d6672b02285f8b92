"""The token-level models of NVIDIA's TensorRT-LLM model set, without Triton: what
`preprocessing` (text -> ids), `tensorrt_llm` (ids -> ids, on llm's engine) and
`postprocessing` (ids -> text) compute. backend/frontend/triton_models/tokens.py moves the tensors.

Tensor names, dtypes and shapes are NVIDIA's (all_models/inflight_batcher_llm/*/config.pbtxt),
so preprocessing -> tensorrt_llm -> postprocessing chains as in NVIDIA's end_to_end_test.py.
Inputs arrive as {name: ndarray} with the batch dimension first; a RequestError names the field.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from ...generation import word_lists
from ...generation.errors import RequestError
from ...generation.prompt import decode_utf8, text_ids

# -- preprocessing --------------------------------------------------------------------------------


def _rows(values: dict, name: str, batch: int) -> Optional[list]:
    """An input's rows, one per query (a single row applies to all); None when not sent."""
    arr = values.get(name)
    if arr is None:
        return None
    rows = arr.reshape(1, -1) if arr.ndim < 2 else arr.reshape(arr.shape[0], -1)
    if rows.shape[0] not in (1, batch):
        raise RequestError(f"{name} has {rows.shape[0]} rows for a batch of {batch} queries (QUERY)")
    return [rows[0 if rows.shape[0] == 1 else b] for b in range(batch)]


def _text(x, name: str) -> str:
    return decode_utf8(x, name) if isinstance(x, bytes) else str(x)


def _one(rows: Optional[list], b: int, default: int) -> int:
    if rows is None:
        return default
    if rows[b].size != 1:
        raise RequestError("END_ID, PAD_ID and REQUEST_OUTPUT_LEN take one value per query")
    return int(rows[b][0])


def preprocess(tokenizer, values: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """QUERY [B, 1] -> INPUT_ID [B, n] (padded with the pad id), REQUEST_INPUT_LEN [B, 1], the word
    dicts as [B, 2, L] word lists, REQUEST_OUTPUT_LEN, OUT_END_ID / OUT_PAD_ID [B, 1] (END_ID /
    PAD_ID, else the tokenizer's), an empty EMBEDDING_BIAS [B, 0] and the decoder placeholders
    TensorRT-LLM sends for a decoder-only model (DECODER_INPUT_ID = pad id, length 1). The prompt
    is tokenized as llm tokenizes text_input (prompt.text_ids), so both paths see the same ids."""
    query = values.get("QUERY")
    if query is None or query.size == 0:
        raise RequestError("QUERY is missing or empty")
    batch = query.shape[0] if query.ndim else 1
    if query.size != batch:
        raise RequestError(f"send one query per batch row (QUERY has shape {list(query.shape)})")
    if values.get("REQUEST_OUTPUT_LEN") is None:
        raise RequestError("REQUEST_OUTPUT_LEN is missing")
    bias = _rows(values, "EMBEDDING_BIAS_WORDS", batch)
    if bias is not None and any(_text(w, "EMBEDDING_BIAS_WORDS") for row in bias for w in row):
        raise RequestError("EMBEDDING_BIAS_WORDS is not served (tensorrt_llm takes no embedding_bias)")
    end_rows, pad_rows = _rows(values, "END_ID", batch), _rows(values, "PAD_ID", batch)
    out_len = _rows(values, "REQUEST_OUTPUT_LEN", batch)
    default_end = tokenizer.eos_token_id
    default_pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else default_end
    end = [_one(end_rows, b, default_end) for b in range(batch)]
    pad = [_one(pad_rows, b, default_pad) for b in range(batch)]
    ids = [text_ids(tokenizer, _text(q, "QUERY")) for q in query.reshape(-1)]
    width = max(1, max(map(len, ids)))
    input_id = np.array([seq + [pad[b]] * (width - len(seq)) for b, seq in enumerate(ids)], dtype=np.int32)
    words = {}
    for name, out in (("BAD_WORDS_DICT", "BAD_WORDS_IDS"), ("STOP_WORDS_DICT", "STOP_WORDS_IDS")):
        rows = _rows(values, name, batch) or [[] for _ in range(batch)]
        seqs = [[list(tokenizer(w, add_special_tokens=False).input_ids) for w in (_text(x, name) for x in row) if w]
                for row in rows]
        length = max(1, max(sum(map(len, s)) for s in seqs))
        words[out] = np.stack([word_lists.encode(s, length) for s in seqs])
    column = lambda xs: np.array(xs, dtype=np.int32).reshape(batch, 1)  # noqa: E731
    return {"INPUT_ID": input_id, "REQUEST_INPUT_LEN": column([len(s) for s in ids]),
            "DECODER_INPUT_ID": column(pad), "REQUEST_DECODER_INPUT_LEN": column([1] * batch),
            **words, "EMBEDDING_BIAS": np.zeros((batch, 0), dtype=np.float32),
            "REQUEST_OUTPUT_LEN": column([_one(out_len, b, 0) for b in range(batch)]),
            "OUT_END_ID": column(end), "OUT_PAD_ID": column(pad)}


# -- postprocessing -------------------------------------------------------------------------------


def postprocess(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """TOKENS_BATCH [B, beams, n] and SEQUENCE_LENGTH [B, beams] -> OUTPUT [B * beams] UTF-8 bytes:
    each beam's first `length` ids decoded without special tokens. Ids that end inside a multi-byte
    character (a streamed piece) decode to U+FFFD for the incomplete bytes, never an error: decode
    whole sequences, or join the ids of consecutive pieces first, for the exact text."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths)
    if tokens.ndim == 2:  # [beams, n] without the batch dimension
        tokens = tokens[None]
    if tokens.ndim != 3:
        raise RequestError(f"TOKENS_BATCH must have shape [batch, beams, tokens], got {list(tokens.shape)}")
    lengths = lengths.reshape(tokens.shape[0], -1)
    if lengths.shape[1] != tokens.shape[1]:
        raise RequestError(f"SEQUENCE_LENGTH has shape {list(lengths.shape)}; it needs one length per beam of "
                           f"TOKENS_BATCH {list(tokens.shape)}")
    vocab = len(tokenizer)
    texts = []
    for b in range(tokens.shape[0]):
        for k in range(tokens.shape[1]):
            n = int(lengths[b, k])
            if not 0 <= n <= tokens.shape[2]:
                raise RequestError(f"SEQUENCE_LENGTH {n} is outside [0, {tokens.shape[2]}] (TOKENS_BATCH's length)")
            ids = tokens[b, k, :n].tolist()
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise RequestError(f"TOKENS_BATCH holds token id {bad}, outside the vocabulary [0, {vocab})")
            texts.append(tokenizer.decode(ids, skip_special_tokens=True).encode("utf-8"))
    return np.array(texts, dtype=np.object_)


# -- tensorrt_llm -> llm ---------------------------------------------------------------------------

# tensorrt_llm inputs llm has under another name; the rest of SAME pass unchanged
RENAMED = {"request_output_len": "max_tokens", "streaming": "stream", "runtime_top_k": "top_k",
           "runtime_top_p": "top_p", "seed": "random_seed"}
SAME = ("end_id", "pad_id", "beam_width", "temperature", "repetition_penalty", "presence_penalty",
        "frequency_penalty", "min_tokens", "return_log_probs", "return_perf_metrics", "exclude_input_in_output",
        "num_return_sequences", "stop_words_list", "bad_words_list", "guided_decoding_guide_type",
        "guided_decoding_guide")
NOT_SERVED = ("return_context_logits", "return_generation_logits")  # refused when true


def _scalar(values: dict, name: str):
    arr = values.get(name)
    if arr is None or arr.size == 0:
        return None
    if arr.size != 1:
        raise RequestError(f"{name} must hold exactly one value per request, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0].item()


def llm_inputs(values: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """tensorrt_llm's request {name: ndarray} -> llm's: input_ids cut to input_lengths, NVIDIA's
    names mapped to llm's (request_output_len -> max_tokens, streaming -> stream, runtime_top_k /
    runtime_top_p -> top_k / top_p, seed -> random_seed), runtime_top_p 0 dropped (0 turns top-p off
    in TensorRT-LLM), the rest passed as they are; llm validates the values. One sequence a request."""
    ids = values.get("input_ids")
    if ids is None or ids.size == 0:
        raise RequestError("input_ids is missing or empty")
    if ids.ndim > 1 and ids.shape[0] != 1:
        raise RequestError(f"input_ids has {ids.shape[0]} rows; send one token sequence per request")
    ids = ids.reshape(-1)
    n = _scalar(values, "input_lengths")
    if n is None:
        raise RequestError("input_lengths is missing")
    if not 0 < n <= ids.size:
        raise RequestError(f"input_lengths {n} is outside [1, {ids.size}] (input_ids' length)")
    if _scalar(values, "request_output_len") is None:
        raise RequestError("request_output_len is missing")
    decoder = values.get("decoder_input_ids")
    if decoder is not None and decoder.size > 1:  # end_to_end_test.py sends one pad id for decoder-only models
        raise RequestError("decoder_input_ids is for encoder-decoder models; this model is decoder-only")
    bias = values.get("embedding_bias")
    if bias is not None and bias.size and np.any(bias != 0):
        raise RequestError("embedding_bias is not served; send it empty or leave it out")
    for name in NOT_SERVED:
        if _scalar(values, name):
            raise RequestError(f"{name} is not served; send false or leave it out")
    out = {"input_ids": ids[:n].astype(np.int32).reshape(1, -1)}
    for name, arr in values.items():
        if name in RENAMED:
            if name == "runtime_top_p" and _scalar(values, name) == 0:
                continue
            out[RENAMED[name]] = arr
        elif name in SAME:
            out[name] = arr
    return out
