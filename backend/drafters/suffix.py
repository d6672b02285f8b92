"""Suffix decoding (in the spirit of SuffixDecoding, Oliaro et al. 2024).

Model-free: match the longest suffix (up to `max_match` tokens) of a sequence's
committed tokens against (a) the sequence's own prompt + output and (b) a bounded
store of recent outputs shared across requests, then propose the most frequent
continuation among the occurrences of that longest match. Agentic and repeated
workloads regenerate the same text across requests; (b) lets a later request
draft it in long runs.

Why an anchor index and not a suffix tree: a depth-32 suffix trie costs ~32 Python
nodes per stored token. Instead each `_Index` maps every n-gram with
min_match <= n <= anchor to the positions right after its `max_candidates` most
recent occurrences. A proposal looks up the longest anchor that hits, extends
each candidate backwards up to `max_match` tokens, keeps the longest, and votes:
O(max_candidates * (max_match + gamma)) per proposal, independent of store size.
So "longest" means longest among the most recent occurrences of the anchor.
Cost of the store: ~0.6 KB and ~30 us of indexing per stored token (random text,
defaults), paid on `release` under the store's lock.

Vote: walk the candidates' continuations position by position, taking the most
frequent next token among candidates still agreeing with the proposal so far
(ties: the sequence's own context first, then the most recent occurrence) — the
greedy most-frequent-child walk of SuffixDecoding's tree, restricted to candidates.
q is None (one-hot). confidences are 1.0 by default (base contract for model-free
drafters); with confidence="frequency" each is the vote share count(d_j) / alive_j,
an estimate of P(d_j | match, d_<j) that lets policies trim doubtful tails.

What goes into the shared store: on `release`, the tokens past the length at which
this drafter first saw the sequence (the Drafter interface does not say where the
prompt ends; first sight is right after prefill unless another drafter ran first),
or all tokens with store_prompt=True. Only tokens seen through propose/commit are
stored (the loop does not commit a sequence's final step). Oldest whole outputs are evicted first once the store
holds more than `max_store_tokens`; one output longer than that keeps its tail.

Example (a..e distinct tokens): request 1 ends having generated [a b c d e];
release(1) stores it. Request 2 with committed tokens [x y a b] (no own match):
the longest stored suffix match is [a b] (length 2), so propose(2, [x y a b], 3)
-> [c d e]. With stored outputs [a b c], [a b c], [a b d], the vote at "a b"
picks c (2 of 3; frequency confidence 2/3).
"""
from __future__ import annotations

import threading
from typing import Dict, List, Optional, Sequence, Tuple

from .base import Draft, Drafter, register

_SEP = -1  # separates stored outputs; never a token id, so matches and continuations stop at it


class _Index:
    """Token buffer (absolute positions) + anchor table: n-gram -> recent positions right after it.

    Not thread-safe; `SuffixStore` locks around the shared one.
    """

    __slots__ = ("ns", "per_key", "buf", "base", "start", "indexed", "doc_start", "table")

    def __init__(self, min_n: int, max_n: int, per_key: int):
        self.ns = range(min_n, max_n + 1)
        self.per_key = per_key
        self.buf: List[int] = []
        self.base = 0  # absolute position of buf[0]
        self.start = 0  # first live (not evicted) absolute position
        self.indexed = 0  # continuation positions < indexed are in the table
        self.doc_start = 0  # first position of the open (last) document
        self.table: Dict[tuple, List[int]] = {}  # positions ascending, at most per_key

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    def extend(self, tokens: Sequence[int]) -> None:
        """Append to the open document; index every n-gram that now has a continuation."""
        self.buf.extend(tokens)
        buf, base, table, cap = self.buf, self.base, self.table, self.per_key
        for c in range(max(self.indexed, self.doc_start + 1), self.end):
            for n in self.ns:
                if c - n < self.doc_start:
                    break
                key = tuple(buf[c - n - base: c - base])
                pos = table.get(key)
                if pos is None:
                    table[key] = [c]
                else:
                    pos.append(c)
                    if len(pos) > cap:
                        del pos[0]
        self.indexed = self.end

    def close_doc(self) -> None:
        self.buf.append(_SEP)
        self.indexed = self.doc_start = self.end

    def evict_doc(self, doc_end: int) -> None:
        """Drop the oldest document, [start, doc_end) followed by its separator."""
        s, buf, base, table = self.start, self.buf, self.base, self.table
        for c in range(s + 1, doc_end):
            for n in self.ns:
                if c - n < s:
                    break
                key = tuple(buf[c - n - base: c - base])
                pos = table.get(key)
                if pos and pos[0] == c:  # oldest first; absent if the per-key cap already dropped it
                    del pos[0]
                    if not pos:
                        del table[key]
        self.start = doc_end + 1
        if self.start - self.base > len(self.buf) // 2:  # amortised O(1) compaction
            del self.buf[: self.start - self.base]
            self.base = self.start

    def candidates(self, query: Sequence[int], gamma: int) -> Tuple[int, List[List[int]]]:
        """(longest match length L, continuations after each length-L occurrence, newest first).

        `query` is the suffix to match (already cut to max_match tokens).
        """
        pos = None
        for n in reversed(self.ns):
            if len(query) >= n:
                pos = self.table.get(tuple(query[-n:]))
                if pos:
                    break
        if not pos:
            return 0, []
        buf, base, lo = self.buf, self.base, self.start
        best, found = 0, []
        for c in reversed(pos):
            k = n  # the anchor matched; extend backwards
            while k < len(query) and c - k - 1 >= lo and buf[c - k - 1 - base] == query[-k - 1]:
                k += 1
            if k > best:
                best, found = k, [c]
            elif k == best:
                found.append(c)
        conts = []
        for c in found:
            cont = buf[c - base: c - base + gamma]
            if _SEP in cont:
                cont = cont[: cont.index(_SEP)]
            conts.append(cont)
        return best, conts


class SuffixStore:
    """Recent outputs shared across requests: bounded, oldest evicted first, thread-safe.

    Pass one store to several drafters (e.g. one per engine loop) to share it.
    """

    def __init__(self, max_store_tokens: int = 65536, min_n: int = 2, anchor: int = 4, max_candidates: int = 32):
        if max_store_tokens < 1:
            raise ValueError(f"suffix: max_store_tokens must be >= 1, got {max_store_tokens}")
        self.max_store_tokens = max_store_tokens
        self._index = _Index(min_n, anchor, max_candidates)
        self._docs: List[int] = []  # end position of each stored output, oldest first
        self._head = 0  # self._docs[self._head:] are live
        self._tokens = 0  # live tokens, separators excluded
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._tokens

    @property
    def num_outputs(self) -> int:
        return len(self._docs) - self._head

    def add(self, tokens: Sequence[int]) -> None:
        tokens = list(tokens[-self.max_store_tokens:])
        if not tokens:
            return
        with self._lock:
            idx = self._index
            while self._tokens + len(tokens) > self.max_store_tokens:
                end = self._docs[self._head]
                self._tokens -= end - idx.start
                idx.evict_doc(end)
                self._head += 1
            if self._head > 64 and self._head * 2 > len(self._docs):
                del self._docs[: self._head]
                self._head = 0
            idx.extend(tokens)
            self._docs.append(idx.end)
            idx.close_doc()
            self._tokens += len(tokens)

    def candidates(self, query: Sequence[int], gamma: int) -> Tuple[int, List[List[int]]]:
        with self._lock:
            return self._index.candidates(query, gamma)


def vote(conts: List[List[int]], limit: int) -> Tuple[List[int], List[float]]:
    """Greedy most-frequent walk over candidate continuations; earlier candidates win ties.

    Returns (tokens, vote shares). Example: vote([[3, 4], [3, 5], [3, 5], [6]], 2)
    -> ([3, 5], [0.75, 2/3]).
    """
    out: List[int] = []
    share: List[float] = []
    alive = conts
    for j in range(limit):
        counts: Dict[int, int] = {}
        for c in alive:
            if len(c) > j:
                counts[c[j]] = counts.get(c[j], 0) + 1
        if not counts:
            break
        tok = max(counts, key=counts.__getitem__)  # first maximum in candidate order
        out.append(tok)
        share.append(counts[tok] / sum(counts.values()))
        alive = [c for c in alive if len(c) > j and c[j] == tok]
    return out, share


class _SeqState:
    __slots__ = ("prompt_len", "index")

    def __init__(self, prompt_len: int, index: _Index):
        self.prompt_len = prompt_len
        self.index = index


@register
class SuffixDrafter(Drafter):
    name = "suffix"
    is_model = False

    def __init__(
        self,
        max_match: int = 32,
        min_match: int = 2,
        anchor: int = 4,
        max_candidates: int = 32,
        max_store_tokens: int = 65536,
        store_prompt: bool = False,
        confidence: str = "one",
        spec_factor: Optional[float] = None,
        store: Optional[SuffixStore] = None,
    ):
        """max_match: longest suffix matched; min_match..anchor: indexed n-gram lengths;
        max_candidates: recent occurrences kept per n-gram; max_store_tokens: shared store cap;
        store_prompt: also store prompts on release; confidence: "one" | "frequency";
        spec_factor: SuffixDecoding's adaptive length, draft at most spec_factor * match length;
        store: share an existing store (default: a new one owned by this drafter)."""
        if not 1 <= min_match <= anchor <= max_match:
            raise ValueError(f"suffix: need 1 <= min_match <= anchor <= max_match, got {min_match}, {anchor}, {max_match}")
        if max_candidates < 1:
            raise ValueError(f"suffix: max_candidates must be >= 1, got {max_candidates}")
        if confidence not in ("one", "frequency"):
            raise ValueError(f"suffix: confidence must be 'one' or 'frequency', got {confidence!r}")
        if spec_factor is not None and spec_factor <= 0:
            raise ValueError(f"suffix: spec_factor must be > 0, got {spec_factor}")
        self.max_match, self.min_match, self.anchor = max_match, min_match, anchor
        self.max_candidates = max_candidates
        self.store_prompt = store_prompt
        self.confidence = confidence
        self.spec_factor = spec_factor
        self.store = store if store is not None else SuffixStore(max_store_tokens, min_match, anchor, max_candidates)
        self._seqs: Dict[int, _SeqState] = {}
        self._lock = threading.Lock()  # guards _seqs; one sequence is driven by one thread at a time

    def _new_index(self) -> _Index:
        return _Index(self.min_match, self.anchor, self.max_candidates)

    def _sync(self, seq_id: int, tokens: Sequence[int]) -> _Index:
        """This sequence's own index, caught up with `tokens` (committed tokens only grow)."""
        with self._lock:
            st = self._seqs.get(seq_id)
            if st is None:
                st = self._seqs[seq_id] = _SeqState(len(tokens), self._new_index())
        if st.index.end > len(tokens):  # not a continuation of what we saw: start over
            st.index = self._new_index()
        if len(tokens) > st.index.end:
            st.index.extend(tokens[st.index.end:])
        return st.index

    def propose(self, seq_id: int, tokens: Sequence[int], gamma: int) -> Draft:
        own = self._sync(seq_id, tokens)
        if gamma <= 0:
            return Draft(tokens=[])
        query = list(tokens[-self.max_match:])
        n_own, c_own = own.candidates(query, gamma)
        n_glob, c_glob = self.store.candidates(query, gamma)
        best = max(n_own, n_glob)
        if best < self.min_match:
            return Draft(tokens=[])
        conts = (c_own if n_own == best else []) + (c_glob if n_glob == best else [])
        limit = gamma if self.spec_factor is None else min(gamma, max(1, int(self.spec_factor * best)))
        out, share = vote(conts, limit)
        conf = share if self.confidence == "frequency" else [1.0] * len(out)
        return Draft(tokens=out, confidences=conf)

    def commit(self, seq_id: int, tokens: Sequence[int]) -> None:
        self._sync(seq_id, tokens)

    def release(self, seq_id: int) -> None:
        with self._lock:
            st = self._seqs.pop(seq_id, None)
        if st is None:
            return
        toks = st.index.buf  # one open document, never evicted: exactly the tokens seen
        self.store.add(toks if self.store_prompt else toks[st.prompt_len:])
