"""TensorRT-LLM's token word lists (stop_words_list, bad_words_list; the preprocessing model's
STOP_WORDS_IDS, BAD_WORDS_IDS): one [2, L] int32 array per request. Row 0 holds every word's ids
end to end, row 1 each word's end offset into row 0; ids are padded with 0, offsets with -1.

>>> encode([[5, 6], [7]])
array([[ 5,  6,  7],
       [ 2,  3, -1]], dtype=int32)
>>> decode(encode([[5, 6], [7]]))
[[5, 6], [7]]
>>> decode(encode([]))
[]
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np


def encode(words: Sequence[Sequence[int]], width: int = 0) -> np.ndarray:
    """[2, max(width, ids, 1)] int32; empty words are dropped."""
    words = [list(w) for w in words if len(w)]
    flat = [t for w in words for t in w]
    out = np.zeros((2, max(width, len(flat), 1)), dtype=np.int32)
    out[1] = -1
    out[0, :len(flat)] = flat
    out[1, :len(words)] = np.cumsum([len(w) for w in words], dtype=np.int64)
    return out


def decode(arr: np.ndarray, name: str = "word list") -> List[List[int]]:
    """The words of one [2, L] array; ValueError naming `name` when it is not in that format."""
    arr = np.asarray(arr)
    if arr.ndim != 2 or arr.shape[0] != 2:
        raise ValueError(f"{name} must have shape [2, n] per request (ids, end offsets), got {list(arr.shape)}")
    ids, offsets = arr[0].tolist(), arr[1].tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:  # padding
            break
        if not start < end <= len(ids):
            raise ValueError(f"{name} offsets must increase within its {len(ids)} ids, got {offsets}")
        words.append(ids[start:end])
        start = end
    return words
