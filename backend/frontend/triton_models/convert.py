"""Triton's wire -> our domain, pure: one request's input tensors -> GenerationRequests (no Triton
here: the model hands in a getter of its request's tensors, so tests need no stub).

The interface is the tensor names of NVIDIA's TensorRT-LLM backend ensemble (text_input,
max_tokens, stream, temperature, top_k, top_p, random_seed, stop_words, end_id, ...), so existing
TensorRT-LLM clients, perf_analyzer and genai-perf work unchanged.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ...generation import word_lists
from ...generation.guided import Guide
from ...generation.logits_processors import Penalties
from ...generation.request import GenerationRequest, RequestError, decode_utf8
from ...generation.sampling import SamplingParams
from ...server_config import ServerConfig

Tensors = Callable[[str], Optional[np.ndarray]]  # an input's name -> its array, or None when not sent

# Inputs of the TensorRT-LLM ensemble we act on, plus our own apply_chat_template and min_length
# (TensorRT-LLM's min_tokens under its sampling-config name). pad_id / beam_width are accepted for
# compatibility (see _convert). Every input may carry a batch dimension > 1 (one row per prompt, as
# end_to_end_grpc_client.py --batch-inputs sends): a single row applies to every prompt.
_SCALARS = {"max_tokens": int, "temperature": float, "top_k": int, "top_p": float, "random_seed": int,
            "end_id": int, "pad_id": int, "beam_width": int, "stream": bool, "exclude_input_in_output": bool,
            "apply_chat_template": bool, "repetition_penalty": float, "presence_penalty": float,
            "frequency_penalty": float, "min_length": int, "min_tokens": int, "return_log_probs": bool,
            "return_top_log_probs": int, "return_perf_metrics": bool, "num_return_sequences": int}
MAX_RETURN_SEQUENCES = 16


def rows(arr: np.ndarray, name: str, batch: int) -> list:
    """An input's rows, one per prompt of the batch (a single row applies to every prompt): the one
    row-broadcast of every input."""
    rows = arr.reshape(1, -1) if arr.ndim < 2 else arr.reshape(arr.shape[0], -1)
    if rows.shape[0] == batch:
        return list(rows)
    if rows.shape[0] == 1:
        return [rows[0]] * batch
    raise RequestError(f"{name} has {rows.shape[0]} rows for a batch of {batch} prompts (text_input); send one "
                       f"row per prompt, or one for all")


def _scalars(tensor: Tensors, name: str, kind, batch: int) -> list:
    arr = tensor(name)
    if arr is None:
        return [None] * batch
    out = []
    for row in rows(arr, name, batch):
        if row.size != 1:
            raise RequestError(f"{name} must hold exactly one value per request, got shape {list(arr.shape)}")
        value = row[0]
        out.append(kind(value.item() if hasattr(value, "item") else value))
    return out


def _strings(tensor: Tensors, name: str, batch: int) -> list:
    arr = tensor(name)
    if arr is None:
        return [[] for _ in range(batch)]
    if arr.dtype != np.object_:
        raise RequestError(f"{name} must be strings (BYTES), got {arr.dtype}")
    return [[decode_utf8(b, name) if isinstance(b, bytes) else str(b) for b in row] for row in rows(arr, name, batch)]


def _token_prompt(tensor: Tensors) -> Optional[list]:
    """input_ids (a token-level prompt, [1, n] or [n]) as a list, or None when not sent; a prompt
    in text_input as well is refused."""
    arr = tensor("input_ids")
    if arr is None:
        return None
    text = tensor("text_input")
    if text is not None and text.size:
        raise RequestError("send the prompt as text_input or as input_ids, not both")
    if arr.ndim > 1 and arr.shape[0] != 1:
        raise RequestError(f"input_ids has {arr.shape[0]} rows; send one token sequence per request")
    return [int(t) for t in arr.reshape(-1)]


def _word_lists(tensor: Tensors, name: str, batch: int) -> list:
    """stop_words_list / bad_words_list ([2, n] int32 per prompt: backend/generation/word_lists.py)
    as token sequences, one list per prompt of the batch."""
    arr = tensor(name)
    if arr is None:
        return [[] for _ in range(batch)]
    if arr.ndim < 2 or arr.shape[-2] != 2:
        raise RequestError(f"{name} must have shape [2, n] per request (ids, end offsets), got {list(arr.shape)}")
    try:
        return [word_lists.decode(r.reshape(2, -1), name) for r in rows(arr.reshape(-1, 2 * arr.shape[-1]), name, batch)]
    except ValueError as e:
        raise RequestError(str(e)) from None


def convert(tensor: Tensors, cfg: ServerConfig) -> list:
    """One Triton request's inputs (tensor(name): the input, or None) -> [(GenerationRequest,
    batch_index, sequence_index)]: one per prompt of
    the batch (text_input rows) and returned sequence (num_return_sequences); an index is None
    when that dimension is 1 (its output is then not sent)."""
    text, ids = tensor("text_input"), _token_prompt(tensor)
    if ids is not None:  # one token-level prompt: the batch is its one row
        text = np.array([b""], dtype=np.object_)
    if text is None or text.size == 0:
        raise RequestError("text_input is missing or empty")
    batch = text.shape[0] if text.ndim >= 1 else 1
    if text.size != batch:
        raise RequestError(f"send one prompt per batch row (text_input has shape {list(text.shape)})")
    columns = {k: _scalars(tensor, k, kind, batch) for k, kind in _SCALARS.items()}
    stop_rows, bad_rows = _strings(tensor, "stop_words", batch), _strings(tensor, "bad_words", batch)
    guide_types, guides = _strings(tensor, GUIDE_TYPE, batch), _strings(tensor, GUIDE_TEXT, batch)
    stop_ids, bad_ids = _word_lists(tensor, "stop_words_list", batch), _word_lists(tensor, "bad_words_list", batch)
    out = []
    for b, raw in enumerate(text.reshape(-1)):
        v = {k: col[b] for k, col in columns.items()}
        where = f" (batch row {b})" if batch > 1 else ""
        prompt = decode_utf8(raw, "text_input") if isinstance(raw, bytes) else str(raw)
        if v["beam_width"] not in (None, 1):
            raise RequestError(f"beam_width {v['beam_width']} is not supported (only 1){where}")
        n = 1 if v["num_return_sequences"] is None else v["num_return_sequences"]
        if not 1 <= n <= MAX_RETURN_SEQUENCES:
            raise RequestError(f"num_return_sequences must be between 1 and {MAX_RETURN_SEQUENCES}, got {n}{where}")
        if None not in (v["min_length"], v["min_tokens"]) and v["min_length"] != v["min_tokens"]:
            raise RequestError(f"min_length {v['min_length']} and min_tokens {v['min_tokens']} disagree (they are "
                               f"the same setting){where}")
        min_length = v["min_length"] if v["min_length"] is not None else v["min_tokens"]
        penalties = Penalties(
            repetition_penalty=1.0 if v["repetition_penalty"] is None else v["repetition_penalty"],
            presence_penalty=0.0 if v["presence_penalty"] is None else v["presence_penalty"],
            frequency_penalty=0.0 if v["frequency_penalty"] is None else v["frequency_penalty"],
            min_length=0 if min_length is None else min_length, bad_words=tuple(w for w in bad_rows[b] if w))
        sampling = SamplingParams(temperature=v["temperature"] if v["temperature"] is not None else 0.0,
                                  top_k=v["top_k"] or 0, top_p=v["top_p"] if v["top_p"] is not None else 1.0)
        # TensorRT-LLM treats top_k=1 as greedy; so do we (exactly the same tokens).
        if sampling.top_k == 1:
            sampling = SamplingParams()
        chat = v["apply_chat_template"]
        guide = _guide(guide_types[b], guides[b], where)
        for s in range(n):  # sequence s samples with seed + s when a seed is given
            seed = None if v["random_seed"] is None else (v["random_seed"] + s) % (1 << 64)
            out.append((GenerationRequest(
                prompt=prompt,
                max_new_tokens=cfg.max_new_tokens(v["max_tokens"]),
                sampling=sampling, seed=seed, stop_words=[w for w in stop_rows[b] if w], end_id=v["end_id"],
                stream=bool(v["stream"]), exclude_input_in_output=bool(v["exclude_input_in_output"]),
                apply_chat_template=cfg.chat_template_default if chat is None else chat, penalties=penalties,
                return_log_probs=bool(v["return_log_probs"]), return_top_log_probs=v["return_top_log_probs"] or 0,
                return_perf_metrics=bool(v["return_perf_metrics"]), input_ids=ids, stop_words_ids=stop_ids[b],
                bad_words_ids=bad_ids[b], return_output_ids=ids is not None, guide=guide),
                b if batch > 1 else None, s if n > 1 else None))
    return out


GUIDE_TYPE, GUIDE_TEXT = "guided_decoding_guide_type", "guided_decoding_guide"


def _guide(types: list, texts: list, where: str) -> Optional[Guide]:
    """TensorRT-LLM's guided decoding inputs of one prompt -> a Guide, or None (no type, or an
    empty one: unguided, as in TensorRT-LLM). The grammar itself is compiled at admission."""
    if len(types) > 1 or len(texts) > 1:
        raise RequestError(f"{GUIDE_TYPE} and {GUIDE_TEXT} take one string per request{where}")
    kind, text = (types[0].strip() if types else ""), (texts[0] if texts else "")
    if not kind:
        if text.strip():
            raise RequestError(f"{GUIDE_TEXT} needs {GUIDE_TYPE} (json, json_schema, regex or ebnf_grammar){where}")
        return None
    guide = Guide(kind, text)
    problem = guide.problem()
    if problem:
        raise RequestError(problem + where)
    return guide
