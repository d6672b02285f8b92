"""Per-request logits processors (TensorRT-LLM's penalties, min_length, bad_words), applied to a
sequence's logits rows before it samples or verifies — in plain decoding and in speculative
verification alike, so speculation stays lossless.

Semantics (TensorRT-LLM's sampling config; its penalty kernel works on the temperature-scaled
logits and counts every token of the sequence, prompt included, unless a prompt_ignore_length is
set, which we do not serve):

- repetition_penalty r > 0: a token present in prompt + output has its logit divided by r when
  positive, multiplied by r when negative (r > 1 discourages repetition, r < 1 encourages it);
- presence_penalty a: subtracted once from every present token's (temperature-scaled) logit;
- frequency_penalty f: f × (occurrences in prompt + output) subtracted likewise; both may be
  negative (they then encourage repetition), as in TensorRT-LLM and OpenAI;
- min_length m (TensorRT-LLM's min_tokens): the end tokens (end_id, or the model's EOS ids) are
  masked (-inf) while fewer than m tokens have been generated;
- bad_words (strings, tokenized without special tokens): a one-token word is always masked; a
  longer one masks its last token whenever the context ends with its other tokens.

Because the additive penalties act on logits / T in TensorRT-LLM while target_probs divides by T
afterwards, they are multiplied by T here when sampling (greedy: T counts as 1).

Verification of a speculative step has rows 0..γ: row j predicts the token after the context
prompt + output + d_1..d_j, so row j is processed with that context (drafts[:j]) and with
generated + j tokens generated — exactly what plain decoding would apply at that position.

Example: repetition_penalty 2 over context [3, 3, 5] with logits [1, 1, 1, -1, 1, 4]:
token 3 (present, -1) -> -2, token 5 (present, 4) -> 2, the others unchanged.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence

import torch

NEG_INF = float("-inf")


@dataclass(frozen=True)
class Penalties:
    """What a request asks of the logits (defaults: nothing)."""

    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_length: int = 0
    bad_words: tuple = ()  # strings

    @property
    def neutral(self) -> bool:
        return (self.repetition_penalty == 1.0 and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0
                and self.min_length <= 0 and not self.bad_words)

    def problems(self, max_tokens: int) -> Optional[str]:
        """The first invalid value, described naming its input (None if all are valid)."""
        r = self.repetition_penalty
        if not (isinstance(r, (int, float)) and math.isfinite(r) and r > 0):
            return f"repetition_penalty must be a finite number > 0, got {r}"
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v)):
                return f"{name} must be a finite number, got {v}"
        m = self.min_length
        if isinstance(m, bool) or not isinstance(m, int) or m < 0:
            return f"min_length (min_tokens) must be an integer >= 0, got {m}"
        if m > max_tokens:
            return f"min_length (min_tokens) {m} exceeds max_tokens {max_tokens}"
        for w in self.bad_words:
            if not isinstance(w, str):
                return f"bad_words must be strings, got {type(w).__name__}"
        return None


class LogitsProcessor:
    """One request's processors over its token ids. `bad_words_ids`: each bad word tokenized
    (empty ones dropped); `end_ids`: the tokens min_length masks."""

    def __init__(self, penalties: Penalties, bad_words_ids: Sequence[Sequence[int]], end_ids: Iterable[int],
                 temperature: float = 0.0):
        self.p = penalties
        self.end_ids = sorted(set(int(t) for t in end_ids))
        words = [list(map(int, w)) for w in bad_words_ids if len(w)]
        self.single = sorted({w[0] for w in words if len(w) == 1})
        self.multi = [(w[:-1], w[-1]) for w in words if len(w) > 1]
        self.scale = temperature if temperature > 0 else 1.0
        self.counting = (penalties.repetition_penalty != 1.0 or penalties.presence_penalty != 0.0
                         or penalties.frequency_penalty != 0.0)

    def __call__(self, logits: torch.Tensor, context: Sequence[int], drafts: Sequence[int] = (),
                  generated: int = 0) -> torch.Tensor:
        """logits [n, V] -> processed copy (float32). Row j's context is context + drafts[:j] and
        it follows `generated + j` generated tokens; drafts needs at least n - 1 entries."""
        x = logits.float().clone()
        n, vocab = x.shape
        drafts = [int(d) for d in drafts[: n - 1]]
        if self.counting:  # only the columns of tokens in the context or the drafts change
            ids = torch.tensor(list(context) + drafts, dtype=torch.long)
            uniq, inverse = torch.unique(ids, return_inverse=True)
            counts = torch.zeros(n, len(uniq))
            counts[0].index_add_(0, inverse[: len(ids) - len(drafts)], torch.ones(len(ids) - len(drafts)))
            if n > 1:  # row j also counts d_1..d_j
                step = torch.zeros(n, len(uniq))
                step[torch.arange(1, n), inverse[len(ids) - len(drafts):]] = 1.0
                counts = counts[0] + step.cumsum(0)
            sub = x[:, uniq]
            present = counts > 0
            r = self.p.repetition_penalty
            if r != 1.0:
                sub = torch.where(present, torch.where(sub < 0, sub * r, sub / r), sub)
            if self.p.presence_penalty:
                sub = sub - (self.p.presence_penalty * self.scale) * present.to(sub.dtype)
            if self.p.frequency_penalty:
                sub = sub - (self.p.frequency_penalty * self.scale) * counts
            x[:, uniq] = sub
        if self.p.min_length > 0 and self.end_ids:
            rows = [j for j in range(n) if generated + j < self.p.min_length]
            if rows:
                x[torch.tensor(rows)[:, None], torch.tensor(self.end_ids)[None, :]] = NEG_INF
        if self.single:
            x[:, self.single] = NEG_INF
        if self.multi:
            longest = max(len(prefix) for prefix, _ in self.multi)
            tail = list(context[-longest:]) if longest else []
            for j in range(n):
                seen = (tail + drafts[:j])[-longest:]
                for prefix, last in self.multi:
                    k = len(prefix)
                    if len(seen) >= k and seen[-k:] == prefix:
                        x[j, last] = NEG_INF
        return x


def tokenize_words(tokenizer, words: Sequence[str]) -> List[List[int]]:
    """Each word as the token ids it has inside a text (no special tokens)."""
    return [list(tokenizer(w, add_special_tokens=False).input_ids) for w in words if w]
