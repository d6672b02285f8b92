"""Stop words for streamed text: find them, and hold back text that may be the
start of one so a client never receives part of a stop word."""
from __future__ import annotations

from typing import Optional, Sequence


def find_stop(text: str, stop_words: Sequence[str], search_from: int = 0) -> Optional[int]:
    """Index in `text` where the earliest stop word starts, or None."""
    hits = [i for w in stop_words if (i := text.find(w, max(0, search_from - len(w) + 1))) >= 0]
    return min(hits) if hits else None


def holdback(text: str, stop_words: Sequence[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop word.

    >>> holdback("Hello\\nUs", ["\\nUser:"])
    3
    """
    best = 0
    for w in stop_words:
        for n in range(min(len(w) - 1, len(text)), best, -1):
            if text.endswith(w[:n]):
                best = n
                break
    return best
