"""The arithmetic of the peer benchmark (bench/bench_peer.py), apart from servers and sockets so
tests check it without starting anything: per-request records, percentiles, output tokens inside a
measured window, ours / peer ratios and the share of prompts whose greedy text is the same at two
loads."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional, Tuple


@dataclass
class Request:
    """One streamed request as the client saw it (perf_counter seconds)."""
    key: str  # the prompt's identity, the same at every load: "chat/17", "multiturn/<conversation>#2"
    start: float
    first: Optional[float]  # the first content arrived (None: none did)
    last: Optional[float]  # the last content arrived
    tokens: int  # output tokens (the server's usage count; content chunks where it sends none)
    text: str = ""
    error: str = ""  # empty: finished

    @property
    def ok(self) -> bool:
        return not self.error

    def ttft(self) -> Optional[float]:
        return None if self.first is None else self.first - self.start

    def tpot(self) -> Optional[float]:
        """Seconds per output token after the first (None below two tokens)."""
        if self.first is None or self.last is None or self.tokens < 2:
            return None
        return (self.last - self.first) / (self.tokens - 1)

    def as_dict(self, t0: float = 0.0) -> dict:
        """Its fields, times in seconds since t0 (a level's window start: negative in the ramp)."""
        shift = lambda t: None if t is None else round(t - t0, 4)  # noqa: E731
        return dict(asdict(self), start=shift(self.start), first=shift(self.first), last=shift(self.last))


def percentile(values: Iterable[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between order statistics as numpy's
    default does; NaN for no values."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def tokens_in_window(r: Request, w0: float, w1: float) -> float:
    """The request's output tokens produced inside [w0, w1]: its first token at `first`, the rest
    spread evenly over (first, last]. A closed loop has requests straddling both edges of the
    window; counting only requests that finished inside it undercounts at high load (a 32-stream
    request can take a third of the window), so each counts its share."""
    if not r.ok or r.first is None or r.tokens <= 0:
        return 0.0
    n = float(w0 <= r.first <= w1)
    if r.tokens > 1:
        span = r.last - r.first
        if span <= 0:
            n += (r.tokens - 1) * float(w0 <= r.last <= w1)
        else:
            overlap = max(0.0, min(r.last, w1) - max(r.first, w0))
            n += (r.tokens - 1) * overlap / span
    return n


def summarise(requests: List[Request], w0: float, w1: float) -> dict:
    """A load level's figures: output tokens/s over [w0, w1]; TTFT (s) and TPOT (ms) percentiles,
    requests done and failed, over the requests started inside the window."""
    started = [r for r in requests if w0 <= r.start <= w1]
    done = [r for r in started if r.ok]
    ttft = [t for t in (r.ttft() for r in done) if t is not None]
    tpot = [1000 * t for t in (r.tpot() for r in done) if t is not None]
    errors = sorted({r.error for r in started if not r.ok})
    return {"window_s": w1 - w0, "tok_s": sum(tokens_in_window(r, w0, w1) for r in requests) / (w1 - w0),
            "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "tpot_p50_ms": percentile(tpot, 50), "tpot_p90_ms": percentile(tpot, 90),
            "done": len(done), "failed": len(started) - len(done), "errors": errors[:5]}


def ratios(rows: List[dict], ours: str = "ours", peer: str = "llama-server") -> List[dict]:
    """ours / peer per (workload, streams) present for both: throughput (> 1: we deliver more) and
    TTFT p50 (< 1: we answer sooner). Rows of several rounds of a level (bench_peer.py --rounds:
    the arms alternate, so the host's drift over minutes falls on both) pair within their round;
    the ratio is the geometric mean of the rounds' ratios, `rounds` lists them."""
    index = {(r["server"], r["workload"], r["streams"], r.get("round", 0)): r for r in rows}
    paired = {}
    for (server, workload, streams, rnd), a in index.items():
        b = index.get((peer, workload, streams, rnd))
        if server != ours or b is None:
            continue
        paired.setdefault((workload, streams), []).append(
            (_div(a["tok_s"], b["tok_s"]), _div(a["ttft_p50_s"], b["ttft_p50_s"])))
    return [{"workload": workload, "streams": streams, "tok_s": geometric_mean(x[0] for x in xs),
             "ttft_p50": geometric_mean(x[1] for x in xs), "rounds": [x[0] for x in xs]}
            for (workload, streams), xs in paired.items()]


def levels(rows: List[dict]) -> List[dict]:
    """One row per (server, workload, streams): the rounds' mean throughput and TTFT p50 (what the
    plot draws); a single round's row as it is."""
    groups = {}
    for r in rows:
        groups.setdefault((r["server"], r["workload"], r["streams"]), []).append(r)
    return [dict(rs[0], tok_s=sum(r["tok_s"] for r in rs) / len(rs),
                 ttft_p50_s=sum(r["ttft_p50_s"] for r in rs) / len(rs)) for rs in groups.values()]


def geometric_mean(values: Iterable[float]) -> float:
    """NaN if any value is NaN, not positive, or there are none."""
    xs = list(values)
    if not xs or any(math.isnan(x) or x <= 0 for x in xs):
        return math.nan
    return xs[0] if len(xs) == 1 else math.exp(sum(math.log(x) for x in xs) / len(xs))


def _div(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def identity(a: Dict[str, str], b: Dict[str, str]) -> Tuple[int, int, List[str]]:
    """(identical, common, keys that differ): the prompts finished at both loads, and how many of
    them got the same greedy text (a batch-invariant server: all)."""
    common = sorted(set(a) & set(b))
    differ = [k for k in common if a[k] != b[k]]
    return len(common) - len(differ), len(common), differ

