"""Log probs in OpenAI's shapes: token ids -> the text and bytes of each token (TokenPieces), a
chat choice's `logprobs` and a completion choice's, from what the engine returns per response."""
from __future__ import annotations

import json
from pathlib import Path


def _byte_decoder() -> dict:
    """GPT-2's byte-level BPE alphabet: character -> the byte it stands for."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenPieces:
    """Token id -> (its text decoded alone, its bytes): the raw bytes for a byte-level BPE tokenizer
    (a token holding part of a UTF-8 character decodes to U+FFFD alone; its bytes join with the
    next token's), else the text's UTF-8."""

    def __init__(self, checkpoint: Path):
        path = checkpoint / "tokenizer.json"
        if path.exists():
            from tokenizers import Tokenizer
            self.tok = Tokenizer.from_file(str(path))
            spec = json.loads(path.read_text()).get("decoder") or {}
            kinds = {spec.get("type")} | {d.get("type") for d in spec.get("decoders") or []}
            self.bytes_of = _byte_decoder() if "ByteLevel" in kinds else None
        else:
            from transformers import AutoTokenizer
            self.tok, self.bytes_of = AutoTokenizer.from_pretrained(str(checkpoint)), None
        self.cache: dict = {}

    def __call__(self, token_id: int) -> tuple:
        piece = self.cache.get(token_id)
        if piece is None:
            text = self.tok.decode([token_id], skip_special_tokens=False)
            raw = list(text.encode("utf-8"))
            if self.bytes_of is not None and hasattr(self.tok, "id_to_token"):
                name = self.tok.id_to_token(token_id) or ""
                if name and all(c in self.bytes_of for c in name):
                    raw = [self.bytes_of[c] for c in name]
            piece = self.cache[token_id] = (text, raw)
        return piece


def chat_logprobs(pieces: TokenPieces, lp: dict) -> dict:
    """Token ids / log probs / alternatives -> a chat choice's `logprobs` ({content, refusal})."""
    content = []
    for j, (token, value) in enumerate(zip(lp["ids"], lp["lps"])):
        text, raw = pieces(token)
        top = [{"token": pieces(t)[0], "logprob": v, "bytes": pieces(t)[1]}
               for t, v in zip(lp["top_ids"][j], lp["top_lps"][j])] if lp["top_ids"] else []
        content.append({"token": text, "logprob": value, "bytes": raw, "top_logprobs": top})
    return {"content": content, "refusal": None}


def completion_logprobs(pieces: TokenPieces, lp: dict, offset: int) -> tuple:
    """-> (a completion choice's `logprobs` {tokens, token_logprobs, top_logprobs, text_offset}, the
    offset after its tokens). top_logprobs: the alternatives and the sampled token (up to k + 1, as
    OpenAI); text_offset: where each token's text begins in the choice's text."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for j, (token, value) in enumerate(zip(lp["ids"], lp["lps"])):
        text = pieces(token)[0]
        top = {pieces(t)[0]: v for t, v in zip(lp["top_ids"][j], lp["top_lps"][j])} if lp["top_ids"] else {}
        top.setdefault(text, value)
        out["tokens"].append(text)
        out["token_logprobs"].append(value)
        out["top_logprobs"].append(top)
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


def of_response(result) -> dict:
    """A response's output_token_ids / output_log_probs / output_top_* as {ids, lps, top_ids, top_lps}
    (top_*: one list of k per token, or [] without alternatives)."""
    values = result.as_numpy
    ids, lps = values("output_token_ids"), values("output_log_probs")
    ids = [] if ids is None else ids.reshape(-1).tolist()
    lps = [] if lps is None else lps.reshape(-1).tolist()
    top_ids, top_lps = values("output_top_token_ids"), values("output_top_log_probs")
    if top_ids is None or top_lps is None or not ids or top_ids.size == 0:
        return {"ids": ids, "lps": lps, "top_ids": [], "top_lps": []}
    return {"ids": ids, "lps": lps, "top_ids": top_ids.reshape(len(ids), -1).tolist(),
            "top_lps": top_lps.reshape(len(ids), -1).tolist()}
