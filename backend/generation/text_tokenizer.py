"""A checkpoint's tokenizer for the processes that only encode and decode text (the
`preprocessing` and `postprocessing` models): its tokenizer.json through the `tokenizers` library
alone, loaded in ~0.2 s where `transformers.AutoTokenizer` needs ~7 s of CPU (importing
transformers and torch), which every server start paid twice beside llm's own load.

It answers what those callers ask of a Hugging Face tokenizer, the same way (the same library
does the work inside transformers' fast tokenizers): `tok(text, add_special_tokens=...).input_ids`,
`decode(ids, skip_special_tokens=...)`, `eos_token_id`, `pad_token_id`, `len(tok)`. Where that
cannot be guaranteed (no tokenizer.json, or a config asking transformers to rewrite decoded
spaces) `load()` returns transformers' tokenizer instead. The chat template stays with llm, which
loads the full tokenizer. tests/backend/generation/test_text_tokenizer.py holds it equal to
AutoTokenizer on the served checkpoint.
"""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Optional

from tokenizers import Tokenizer

from . import hf_tokenizer


class TextTokenizer:
    def __init__(self, tokenizer: Tokenizer, config: dict):
        self._tok = tokenizer
        self.eos_token_id = self._id(config.get("eos_token"))
        self.pad_token_id = self._id(config.get("pad_token"))

    def _id(self, value) -> Optional[int]:
        """A special token's id, as tokenizer_config.json writes the token: a string, {"content": ...} or null."""
        token = value.get("content") if isinstance(value, dict) else value
        return None if token is None else self._tok.token_to_id(token)

    def __call__(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
        return SimpleNamespace(input_ids=self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)


def load(checkpoint: Path):
    """The checkpoint's tokenizer: a TextTokenizer where its tokenizer.json says everything, else
    transformers' own tokenizer (hf_tokenizer.load)."""
    checkpoint = Path(checkpoint)
    config = hf_tokenizer.read_json(checkpoint / "tokenizer_config.json")
    if (checkpoint / "tokenizer.json").is_file() and not config.get("clean_up_tokenization_spaces"):
        return TextTokenizer(Tokenizer.from_file(str(checkpoint / "tokenizer.json")), config)
    return hf_tokenizer.load(checkpoint)  # seconds: only for checkpoints the fast path cannot serve exactly
