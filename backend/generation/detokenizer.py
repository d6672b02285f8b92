"""Incremental detokenization for streaming.

Decoding token by token breaks multi-byte characters and words whose spacing
depends on the previous token; instead decode a small window [prefix_offset:]
and emit only the text past what was already sent, holding back output that
ends in an incomplete UTF-8 sequence (U+FFFD) until it completes.
"""
from __future__ import annotations

from typing import List


class IncrementalDetokenizer:
    def __init__(self, tokenizer, prompt_ids: List[int]):
        self.tok = tokenizer
        self.ids: List[int] = list(prompt_ids[-4:])  # a little context for spacing
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.text = ""  # everything emitted so far

    def push(self, new_ids: List[int]) -> str:
        """Add tokens; return the newly completed text (possibly empty)."""
        self.ids.extend(new_ids)
        prefix = self.tok.decode(self.ids[self.prefix_offset: self.read_offset], skip_special_tokens=True)
        full = self.tok.decode(self.ids[self.prefix_offset:], skip_special_tokens=True)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""
        delta = full[len(prefix):]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of generation: emit whatever is held back."""
        full = self.tok.decode(self.ids[self.prefix_offset:], skip_special_tokens=True)
        prefix = self.tok.decode(self.ids[self.prefix_offset: self.read_offset], skip_special_tokens=True)
        delta = full[len(prefix):] if len(full) > len(prefix) else ""
        self.read_offset = len(self.ids)
        self.text += delta
        return delta
