"""Offline profiler: the step-time and switch-cost tables the policies read.

Measures on this machine, with the real engine:
  * target forward time T(context bucket, B sequences, t tokens each), the table the policy
    reads an iteration's shape in (build_engines/shape_table.py: one shape of n tokens does
    not cost what another does), and from it AdaSpec's table by token batch n: B = max(1, n // 4)
    sequences verifying n / B tokens each, the shape of a speculative step (γ + 1 = 4) at that load;
  * draft time: one decode sub-step of the model drafter (the distilled drafter
    built by build_engines/distill_drafter.py, if any; its B sequences x 1 token at
    token batch B) — without one, the n-gram drafter's ~20 µs per sequence;
  * C_switch(L_max, B) (Nightjar): the catch-up prefill of L_max tokens for B
    sequences a model drafter pays after it was not drafting; zero without one.

    python -m build_engines.profile_costs --engine llama.cpp --out-dir .cache/profiles [--budget-s 120]

Within a time budget. Each context bucket gets an equal share of the time left (what one does
not use goes to the next), and inside it the points are measured in order of what the policies
read most: for the target's (B, t) table, batch-1 speculation and the decode anchors first
(shape_table.SHAPE_PRIORITY); for a drafter's table by token batch, 1, 2, 8, 32, then 128 and 4,
then 16 and 64. Before each point its time is predicted from the points already
measured; one that would not fit in what is left of the share is skipped, and a slow point
gets fewer repeats. Skipped points are interpolated linearly between measured neighbours (in n;
in t or B for the (B, t) table; the policies interpolate the same way), so a slow engine (the
batch-invariant torch engine on an AVX2 CPU: ~0.3 s a token at 1,536 cached tokens) gets fewer,
wider samples in minutes, not an hour of them. The JSON records which points were measured
(`measured`, `shape_measured`, `draft_measured`).

Each engine has its own curve (llama.cpp on a 2-core CPU is close to compute-bound,
so verifying k tokens costs nearly k steps; torch bf16 with native bf16 makes it
nearly free), so the profile is per engine: `<model>-<engine name>.json`, e.g.
smollm2-135m-llama.cpp-Q8_0.json, and the policy configs name it with `{engine}`
(backend/served_policy.py fills in the served engine). The profile records which
drafter it measured; a run whose drafter differs (one was built since) measures the
drafter's tables again and keeps the target's.

TensorRT-LLM (`--engine trtllm`, inside its container; NOT YET RUN ON A GPU) pads every draft of
an iteration to one length, so its profile is the padded table of policy/profiles.py: the time
of an iteration of B sequences each verifying t = 1 + K tokens (t = 1: speculation off), timed
on TensorRT-LLM's LLM API with a drafter that always proposes K tokens (`trtllm_profile`).
Until it is measured, the server plans with configs/profiles/trtllm-default.json, converted
from a bench/gpu_step_costs.py run (a new run replaces it the same way):

    python -m build_engines.profile_costs --from-gpu-step-costs docs/results/gpu_step_costs_h200.json \
        --out configs/profiles/trtllm-default.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

CTX_BUCKETS = (128, 512, 1536)
TOKEN_BATCH = (1, 2, 4, 8, 16, 32, 64, 128)
# measurement order inside a context bucket: what batch-1 speculation and the loads' anchors read first
PRIORITY = ((1, 2, 8, 32), (128, 4), (16, 64))
SWITCH_L_MAX, SWITCH_BATCH = (16, 64, 256, 1024), (1, 8, 32)
# 2: measured within a budget; `measured` marks the points not interpolated. 3: the target by
# (B, t) shape (shape_target_s, shape_measured), token_batch / target_s read off it
PROFILE_VERSION = 3
DEFAULT_BUDGET_S = 120.0
DRAFTER_SHARE = 0.3  # of the budget, for a model drafter's tables (the target's table gets the rest)


def log(msg: str) -> None:
    print(f"[profile_costs] {msg}", flush=True)


def shape_for(n: int) -> tuple:
    """(sequences, tokens per sequence) whose product is the token batch n."""
    b = max(1, n // 4)
    return b, n // b


def median_time(fn, repeats: int) -> float:
    """Wall time of fn() over `repeats` calls after one warm-up (oneDNN picks kernels then): the
    lower median. Other processes on a shared machine only ever add time, and llama.cpp's
    spinning workers turn a descheduled thread into a stall of a whole time slice, so the upper
    half of the samples measures the neighbours, not the engine."""
    samples = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median_low(sorted(samples[1:])[: max(1, repeats // 2 + 1)])


def interpolate_row(xs: Sequence[float], known: Dict[float, float]) -> List[float]:
    """A value for every x: measured where known, else linear between the nearest known
    neighbours, linear from the last two beyond the ends (one known point: proportional to x).

    >>> interpolate_row([1, 2, 4, 8], {1: 1.0, 4: 2.5})
    [1.0, 1.5, 2.5, 4.5]
    >>> interpolate_row([1, 2, 4], {2: 0.5})
    [0.25, 0.5, 1.0]
    """
    pts = sorted(known.items())
    if len(pts) == 1:
        (x0, y0), = pts
        return [y0 * x / x0 for x in xs]
    out = []
    for x in xs:
        if x in known:
            out.append(known[x])
            continue
        i = next((k for k, (px, _) in enumerate(pts) if px > x), len(pts))
        (xa, ya), (xb, yb) = pts[min(max(i - 1, 0), len(pts) - 2)], pts[min(max(i, 1), len(pts) - 1)]
        out.append(max(0.0, ya + (yb - ya) * (x - xa) / (xb - xa)))
    return out


class BudgetedTable:
    """A table of seconds, one row per context bucket over the token batches, measured point by
    point before a deadline; the points that would not fit are interpolated. Rows are measured
    one after another (a row's cache is filled once), each within an equal share of the time
    left, so what one row does not use goes to the next; inside a row, in PRIORITY's order.

    `measure(row, n, repeats)` returns one point's time."""

    def __init__(self, rows: Sequence[int], xs: Sequence[int], budget_s: float, repeats: int, label: str):
        self.rows, self.xs, self.repeats, self.label = tuple(rows), tuple(xs), repeats, label
        self.deadline = time.monotonic() + budget_s
        self.known: Dict[int, Dict[int, float]] = {r: {} for r in self.rows}

    # the grid's shape: a subclass with other points (build_engines/shape_table.py) overrides these
    def order(self) -> list:
        """The points in measurement order."""
        return priority_order(self.xs)

    def interpolate(self, xs: Sequence, known: dict) -> List[float]:
        """Every point of xs: measured where known, else interpolated from the known."""
        return interpolate_row(xs, known)

    @staticmethod
    def dominates(y, x) -> bool:
        """Whether point y computes at least what x does (so may not cost less)."""
        return y > x

    @staticmethod
    def size(x) -> int:
        """Sort key: larger points first in `recheck`."""
        return x

    @staticmethod
    def name(x) -> str:
        return f"n={x:4d}"

    point_s = 1.0  # the time one point's repeats aim at

    def predict(self, row: int, x: int) -> Optional[float]:
        """A point's time from the points measured: its own row, else the row before (times the
        context ratio: an upper bound, as if attention were all of it); None before any."""
        if self.known[row]:
            return self.interpolate([x], self.known[row])[0]
        i = self.rows.index(row)
        for prev in reversed(self.rows[:i]):
            if self.known[prev]:
                return self.interpolate([x], self.known[prev])[0] * row / prev
        return None

    def run(self, measure: Callable[[int, int, int], float]) -> None:
        for i, row in enumerate(self.rows):
            row_deadline = time.monotonic() + (self.deadline - time.monotonic()) / (len(self.rows) - i)
            for x in self.order():
                guess = self.predict(row, x)
                left = row_deadline - time.monotonic()
                # a row's first point (n=1, the cheapest) is always measured: every row needs one
                if self.known[row] and (self.repeats_for(guess) + 1) * guess > left:
                    log(f"{self.label}: context {row}, {self.name(x)} skipped (~{guess * 1000:.0f} ms a call, "
                        f"{max(0.0, left):.0f} s of this context's share left): interpolated")
                    continue
                repeats = self.repeats if guess is None else self.repeats_for(guess)
                self.known[row][x] = t = measure(row, x, repeats)
                log(f"{self.label}: context {row:5d}, {self.name(x)}: {1000 * t:8.1f} ms ({repeats} repeats)")
            self.recheck(row, measure)

    def recheck(self, row: int, measure: Callable[[int, int, int], float]) -> None:
        """More tokens never cost less. Where a point costs more than a larger one, one of the two
        measured something else: the neighbours (a profile built beside a busy process once priced
        one token at 260 ms and two at 1.3 s, against 6 and 14, and the composite then drafted
        wherever it could), or a host whose speed moved between the two (this 2-core VM's drifts
        30% in minutes: one profile priced 8 sequences of 8 tokens at 67 ms, as fast as 6 tokens,
        against ~100, and the composite lost 45% at 8 streams of multi-turn). Both are measured
        again, the larger first, back to back; the fresh pair is kept, the smaller bounded by the
        larger."""
        known = self.known[row]
        for x in sorted(known, key=self.size, reverse=True):  # the largest first: bounds pass down
            above = [y for y in known if self.dominates(y, x)]
            if not above:
                continue
            y = min(above, key=known.get)
            if known[x] > known[y]:
                again_y = measure(row, y, self.repeats_for(known[x]))
                again = measure(row, x, self.repeats_for(known[x]))
                log(f"{self.label}: context {row:5d}, {self.name(x)}: {1000 * known[x]:.1f} ms exceeded "
                    f"{self.name(y)}'s {1000 * known[y]:.1f} ms; again {1000 * again:.1f} and {1000 * again_y:.1f} ms")
                known[y], known[x] = again_y, min(again, again_y)
        for x in sorted(known, key=self.size, reverse=True):  # a fresh pair may bound a point passed
            above = [known[y] for y in known if self.dominates(y, x)]
            if above:
                known[x] = min(known[x], min(above))

    def repeats_for(self, guess: float) -> int:
        """Fewer repeats for slow points: about point_s' worth, at least one."""
        return max(1, min(self.repeats, int(self.point_s / max(guess, 1e-6))))

    def table(self) -> List[List[float]]:
        """Every row over every x (run() measures at least one point of each row)."""
        return [self.interpolate(self.xs, self.known[r]) for r in self.rows]

    def measured(self) -> List[List[bool]]:
        return [[x in self.known[r] for x in self.xs] for r in self.rows]


def priority_order(xs: Sequence[int]) -> List[int]:
    """The grid's points in measurement order: PRIORITY's, then any it does not name.

    >>> priority_order([1, 2, 4, 8, 16, 32, 64, 128, 256])
    [1, 2, 8, 32, 128, 4, 16, 64, 256]
    """
    order = [x for level in PRIORITY for x in level if x in xs]
    return order + [x for x in xs if x not in order]


def fill(engine, ctx: int, b: int) -> None:
    """Slots 0..b-1 hold ctx cached tokens (one prefill copied where the engine can copy)."""
    if hasattr(engine, "copy_slot"):
        engine.forward([0], [0], [[11] * ctx], logit_rows=[[ctx - 1]])
        for s in range(1, b):
            engine.copy_slot(0, s)
    else:
        engine.forward(list(range(b)), [0] * b, [[11] * ctx] * b, logit_rows=[[ctx - 1]] * b)


class TargetTimer:
    """Forwards of b sequences of t tokens each at context ctx (`shape` = (b, t)). An engine that
    can copy slots (llama.cpp, whose forward needs the positions before it filled) gets its slots
    filled once per bucket: every forward starts at ctx and so replaces only what the last one
    wrote. The torch engine is not filled: attending over zeros costs what attending over real
    keys does."""

    def __init__(self, engine, max_b: int):
        self.engine, self.max_b, self.filled = engine, max_b, None

    def __call__(self, ctx: int, shape: Tuple[int, int], repeats: int) -> float:
        if hasattr(self.engine, "copy_slot") and self.filled != ctx:
            fill(self.engine, ctx, self.max_b)
            self.filled = ctx
        b, t = shape
        slots = list(range(b))
        return median_time(lambda: self.engine.forward(slots, [ctx] * b, [[7] * t] * b), repeats)


def time_ngram_draft(repeats: int = 200) -> float:
    from backend.drafters import make_drafter
    d = make_drafter("ngram")
    seq = list(range(400)) * 2
    t0 = time.perf_counter()
    for i in range(repeats):
        d.propose(0, seq[: 400 + i], 4)
    return (time.perf_counter() - t0) / repeats


def time_decode(engine, ctx: int, b: int, repeats: int) -> float:
    """One decode sub-step of b sequences (1 token each) at context ctx. The cache is not filled
    first: attending over zeros costs what attending over real keys does, and filling 128
    sequences of 1.5k tokens would take minutes."""
    slots = list(range(b))
    return median_time(lambda: engine.forward(slots, [ctx] * b, [[7]] * b), repeats)


def time_catch_up(engine, l_max: int, b: int, repeats: int) -> float:
    return median_time(lambda: engine.forward(list(range(b)), [0] * b, [[11] * l_max] * b,
                                              logit_rows=[[l_max - 1]] * b), repeats)


def profiled_drafter(drafter_dir: Path) -> Optional[Path]:
    """The model drafter the profile measures: the first built of chat, code."""
    from backend.drafters.artifacts import find_artifact
    return next((p for p in (find_artifact(drafter_dir, n) for n in ("chat", "code")) if p is not None), None)


def drafter_label(path: Optional[Path]) -> str:
    """What the profile records as its drafter (a rebuilt drafter gets a new label)."""
    if path is None:
        return "ngram"
    mf = path / "manifest.json"
    return f"{path.name}@{json.loads(mf.read_text()).get('built_at', '?') if mf.exists() else '?'}"


def switch_costs(engine, repeats: int, deadline: float) -> List[List[float]]:
    """C_switch(l_max, b), smallest first; what is too big for this machine (over 8,192 tokens)
    or for the budget is extrapolated linearly in tokens from the l_max before it."""
    seconds = [[0.0] * len(SWITCH_BATCH) for _ in SWITCH_L_MAX]
    for i, lm in enumerate(SWITCH_L_MAX):
        for j, b in enumerate(SWITCH_BATCH):
            guess = seconds[i - 1][j] * lm / SWITCH_L_MAX[i - 1] if i else 0.0
            if lm * b <= 8192 and (i == 0 or 2 * guess < deadline - time.monotonic()):
                seconds[i][j] = time_catch_up(engine, lm, b, max(1, repeats // 2))
            else:
                seconds[i][j] = guess
    return seconds


def drafter_profile(path: Path, dtype: str, repeats: int, budget_s: float):
    """(draft_s table, which points were measured, switch-cost table) of a built model drafter."""
    from backend.engines.torch_llama import TorchLlama
    eng = TorchLlama(path, dtype=dtype, max_slots=TOKEN_BATCH[-1], max_context=CTX_BUCKETS[-1] + 16,
                     batch_invariant=False)  # as backend/drafters/model.py runs drafters
    table = BudgetedTable(CTX_BUCKETS, TOKEN_BATCH, 0.7 * budget_s, repeats, f"drafter {path.name}")
    table.run(lambda ctx, b, r: time_decode(eng, ctx, b, r))
    switch = switch_costs(eng, repeats, time.monotonic() + 0.3 * budget_s)
    log(f"{path.name} catch-up (l_max x batch, s): {switch}")
    return table.table(), table.measured(), {"l_max": list(SWITCH_L_MAX), "batch": list(SWITCH_BATCH),
                                             "seconds": switch}


def target_engine(cfg, max_slots: int, max_context: int):
    """The engine a ServerConfig serves (engine, checkpoint, dtype, batch_invariant, gguf), sized
    for the profile."""
    root = Path.cwd()
    checkpoint = cfg.resolve(cfg.checkpoint, root)
    if cfg.engine == "llama.cpp":
        from backend.engines.llama_cpp import LlamaCpp, served_gguf
        gguf = cfg.resolve(cfg.gguf, root) if cfg.gguf else served_gguf(checkpoint)
        return LlamaCpp(gguf, max_slots=max_slots, max_context=max_context)
    from backend.engines.torch_llama import TorchLlama
    return TorchLlama(checkpoint, dtype=cfg.dtype, max_slots=max_slots, max_context=max_context,
                      batch_invariant=cfg.batch_invariant)


def profiled_slots() -> int:
    """The slots the profiled engine needs: the (B, t) table's largest B."""
    from .shape_table import SHAPE_BATCH
    return max(SHAPE_BATCH)


def profile_name(model: str, engine_name: str) -> str:
    """The profile file of an engine: torch/bf16 -> <model>-torch-bf16.json."""
    return f"{model}-{engine_name.replace('/', '-')}.json"


def target_profile(engine, repeats: int, budget_s: float) -> dict:
    """The target's step-time tables, by (B, t) shape and by token batch, measured within budget_s."""
    from .shape_table import SHAPE_BATCH, ShapeTable  # imported here: it builds on this module
    table = ShapeTable(CTX_BUCKETS, budget_s, repeats, "target")
    table.run(TargetTimer(engine, max(SHAPE_BATCH)))
    return table.profile_fields()


def draft_tables(drafter_dir: Path, dtype: str, repeats: int, budget_s: float) -> dict:
    """The profile's drafter part: the model drafter's tables, or the n-gram drafter's cost."""
    path = profiled_drafter(drafter_dir)
    if path is None:
        ngram = time_ngram_draft()
        log(f"no model drafter built; ngram draft: {1e6 * ngram:.0f} µs per sequence")
        return {"drafter": "ngram", "draft_s": [[ngram * n for n in TOKEN_BATCH] for _ in CTX_BUCKETS],
                "draft_measured": [[True] * len(TOKEN_BATCH) for _ in CTX_BUCKETS],
                "switch_cost": {"l_max": list(SWITCH_L_MAX), "batch": list(SWITCH_BATCH),
                                "seconds": [[0.0] * len(SWITCH_BATCH)] * len(SWITCH_L_MAX)}}
    draft_s, measured, switch = drafter_profile(path, dtype, repeats, budget_s)
    return {"drafter": drafter_label(path), "draft_s": draft_s, "draft_measured": measured, "switch_cost": switch}


def profile(engine, name: str, checkpoint: Path, dtype: str, repeats: int, drafter_dir: Path,
            budget_s: float = DEFAULT_BUDGET_S, target: Optional[dict] = None) -> dict:
    """The whole profile of the engine called `name`; `target` (a previous profile's target part)
    is kept, not measured, and then no engine is needed (None)."""
    import torch

    t0 = time.monotonic()
    if target is None:
        has_drafter = profiled_drafter(drafter_dir) is not None
        target = target_profile(engine, repeats, budget_s * (1 - DRAFTER_SHARE if has_drafter else 1.0))
        if hasattr(engine, "close"):
            engine.close()
    del engine
    drafts = draft_tables(drafter_dir, dtype, repeats, max(1.0, budget_s - (time.monotonic() - t0)))
    zeros = [0.0] * len(TOKEN_BATCH)
    return {
        "profile_version": PROFILE_VERSION,
        "checkpoint": str(checkpoint), "engine": name, "engine_build": engine_build(name), "dtype": dtype,
        "threads": torch.get_num_threads(),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "budget_s": budget_s, "elapsed_s": round(time.monotonic() - t0, 1),
        # AdaSpec step-time table (policy/profiles.py StepTimeProfile)
        **target, **{k: v for k, v in drafts.items() if k != "switch_cost"},
        "target_overhead_s": zeros, "draft_overhead_s": zeros,
        # Nightjar C_switch(L_max, B) (policy/profiles.py SwitchCostTable)
        "switch_cost": drafts["switch_cost"],
    }


TARGET_KEYS = ("ctx_buckets", "token_batch", "target_s", "measured",
               "verify", "batch", "tokens_per_seq", "shape_target_s", "shape_measured")


def engine_build(engine_name: str) -> str:
    """What a profile's target times depend on beyond the engine's name: for llama.cpp, which
    kernels its matmuls run (backend/engines/q8_kernel.py; a rebuilt library counts as new)."""
    if not engine_name.startswith("llama.cpp"):
        return ""
    from backend.engines import q8_kernel
    return q8_kernel.build_id()


def reusable_target(path: Path, engine_name: str) -> Optional[dict]:
    """The target part of a profile on disk, if this version measured it for this engine, built
    as it is now."""
    if not path.exists():
        return None
    have = json.loads(path.read_text())
    if (have.get("profile_version") != PROFILE_VERSION or have.get("engine") != engine_name
            or have.get("engine_build", "") != engine_build(engine_name)):
        return None
    return {k: have[k] for k in TARGET_KEYS if k in have}


# -- TensorRT-LLM: the padded cost shape ---------------------------------------------------------
# NOT YET RUN ON A GPU. Written against TensorRT-LLM 1.2 (the LLM API, PyTorch backend); it runs
# only inside the TensorRT-LLM container. TensorRT-LLM 1.2 pads every draft of an iteration to
# the drafter's static length K, so its step time is T(B, t = 1 + K) with every sequence
# verifying t tokens, or T(B, 1) in an iteration where speculation is off: the padded table of
# policy/profiles.py. One LLM per K (the length is static), and in each the drafter decides per
# iteration whether speculation is on (`should_use_spec_decode`), so t = 1 is timed on the same
# engine the policy switches speculation off in.
TRTLLM_TOKENS = (1, 2, 3, 5, 9)  # t = 1 + K; 9: the served default K = 8 (trtllm serving.DEFAULT_MAX_DRAFT_LEN)
TRTLLM_DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "profiles" / "trtllm-default.json"
# a point's iteration time: (wall time of LONG tokens - of SHORT) / (their iterations' difference),
# so the prefill and the per-request set-up cancel out
SHORT_TOKENS, LONG_TOKENS = 8, 40
DRAFT_TOKEN = 13  # what the drafter proposes: rarely accepted; the iteration count is read, not assumed


def monotone_in_t(row: Sequence[float]) -> List[float]:
    """A row by tokens per sequence made non-decreasing: verifying more tokens never costs less
    (a dip is noise or a kernel-choice artifact, docs/results.md), and a dip at t = 2 would make
    speculation look cheaper than plain decoding.

    >>> monotone_in_t([6.3, 6.1, 6.8, 6.5, 7.0])
    [6.3, 6.3, 6.8, 6.8, 7.0]
    """
    out: List[float] = []
    for x in row:
        out.append(max(x, out[-1]) if out else x)
    return out


# TensorRT-LLM 1.2 pads every draft to the served max_draft_len (backend/services/trtllm/serving.py's
# DEFAULT_MAX_DRAFT_LEN): an iteration that speculates verifies 1 + this on every sequence
PAD_TO = 8


def padded_profile(ctx_buckets, batch, tokens, table, draft_s, source: str, pad_to: int = PAD_TO, **extra) -> dict:
    """The padded step-time profile's JSON (policy/profiles.py): table[bucket][batch][t] seconds,
    each row made `monotone_in_t`; draft_s[bucket][batch], the model drafter's one-token step;
    pad_to: the static length the engine pads drafts to (the policy prices any speculating
    iteration at t = 1 + pad_to)."""
    def us(xs):  # seconds to the tenth of a microsecond: the file stays readable
        return [round(float(x), 7) for x in xs]

    zeros = [0.0] * len(batch)
    return {"profile_version": PROFILE_VERSION, "engine": "trtllm", "verify": "padded", "pad_to": pad_to,
            "source": source,
            "ctx_buckets": list(ctx_buckets), "batch": list(batch), "tokens_per_seq": list(tokens),
            "padded_target_s": [[us(monotone_in_t(row)) for row in rows] for rows in table],
            "token_batch": list(batch), "draft_s": [us(r) for r in draft_s],
            "target_overhead_s": zeros, "draft_overhead_s": zeros,
            **{k: [[us(row) for row in rows] for rows in v] if k == "measured_s" else v for k, v in extra.items()}}


def from_gpu_step_costs(costs: dict, path: str) -> dict:
    """A padded profile from a bench/gpu_step_costs.py run (`path`, its JSON `costs`): the target's
    kernel time (gpu_s: what an engine replaying CUDA graphs, as TensorRT-LLM does, pays) as the
    padded table, the draft layout's one-token kernel time as draft_s."""
    source = (f"{costs['engine']} (our TorchLlama) on an {costs['device']}, {costs['layout']} layout with random "
              f"{costs['dtype']} weights, draft {costs.get('draft_layout', '?')}, {costs['date']}: kernel time (gpu_s) "
              f"by bench/gpu_step_costs.py, {path} (docs/results.md, 'The first GPU cost curve'); rows made "
              f"non-decreasing in t. Not TensorRT-LLM's own: profile_costs --engine trtllm measures that")
    draft = [[r[0] for r in rows] for rows in costs["draft"]["gpu_s"]]
    return padded_profile(costs["ctx"], costs["batch"], costs["tokens_per_seq"], costs["target"]["gpu_s"], draft,
                          source, measured_s=costs["target"]["gpu_s"])


def padded_table(ctx_buckets, batches, tokens, timer_for) -> List[List[List[float]]]:
    """table[bucket][batch][t]: `timer_for(K)` is a timer on an engine padding drafts to K,
    `timer(ctx, b, speculate) -> seconds` (speculate False: a plain iteration, t = 1), with an
    optional close(). One engine per K; t = 1 is timed on the first."""
    table = [[[0.0] * len(tokens) for _ in batches] for _ in ctx_buckets]
    ks = sorted({t - 1 for t in tokens if t > 1}) or [1]
    for k in ks:
        timer = timer_for(k)
        try:
            cols = [i for i, t in enumerate(tokens) if t - 1 == k or (t == 1 and k == ks[0])]
            for ci, ctx in enumerate(ctx_buckets):
                for bi, b in enumerate(batches):
                    for ti in cols:
                        table[ci][bi][ti] = timer(ctx, b, tokens[ti] > 1)
                        log(f"trtllm K={k}: context {ctx:5d}, B={b:4d}, t={tokens[ti]}: "
                            f"{1000 * table[ci][bi][ti]:8.2f} ms an iteration")
        finally:
            getattr(timer, "close", lambda: None)()
    return table


def trtllm_profile(checkpoint: Path, timer_for, tokens: Sequence[int] = TRTLLM_TOKENS,
                   default: Path = TRTLLM_DEFAULT) -> dict:
    """TensorRT-LLM's padded profile over the default curve's context buckets and batch sizes. The
    model drafter's table is the default curve's (a 1B layout on an H200): this measures the
    target only."""
    base = json.loads(Path(default).read_text())
    t0 = time.monotonic()
    table = padded_table(base["ctx_buckets"], base["batch"], tokens, timer_for)
    source = (f"build_engines/profile_costs.py --engine trtllm on {checkpoint}: iteration wall time of "
              f"TensorRT-LLM (LLM API, PyTorch backend); draft_s from {Path(default).name}")
    return padded_profile(base["ctx_buckets"], base["batch"], tokens, table, base["draft_s"], source,
                          checkpoint=str(checkpoint), measured_s=table,
                          built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                          elapsed_s=round(time.monotonic() - t0, 1))


class CountingDrafterLogic:
    """The profiling drafter: proposes K tokens for every generation request (the padded shape
    whatever is drafted), turns speculation on or off per iteration (`speculate`), and counts the
    iterations TensorRT-LLM runs with requests (`should_use_spec_decode` is asked once per
    iteration, on or off). `counting_drafter` puts it on TensorRT-LLM's Drafter base."""

    def __init__(self, max_draft_len: int):
        super().__init__(max_draft_len=max_draft_len, max_total_draft_tokens=max_draft_len, max_concurrency=None)
        self.k, self.speculate, self.iterations = max_draft_len, True, 0

    def should_use_spec_decode(self, requests, max_batch_size, max_num_tokens, max_total_draft_tokens) -> bool:
        if requests:
            self.iterations += 1
        return self.speculate

    def prepare_draft_tokens(self, scheduled_requests, resource_manager=None) -> None:
        for r in scheduled_requests.generation_requests:
            r.py_draft_tokens = [DRAFT_TOKEN] * self.k


def counting_drafter(max_draft_len: int):
    # tensorrt_llm only through backend/services/trtllm/_api.py (the only module importing it)
    from backend.services.trtllm import _api
    cls = type("CountingDrafter", (CountingDrafterLogic, _api.drafter_base()), {})
    return cls(max_draft_len)


class TrtllmTimer:
    """Iteration time of B concurrent greedy requests at `ctx` cached tokens on one LLM: the
    difference of a LONG_TOKENS and a SHORT_TOKENS run of the same prompts (the cache reuses
    their blocks after the warm-up run, so the prefill is short, and cancels anyway) over the
    difference of their iterations, the lower median of `repeats` pairs."""

    def __init__(self, llm, drafter, end_id: int, repeats: int = 3, clock: Callable[[], float] = time.perf_counter):
        self.llm, self.drafter, self.end_id, self.repeats, self.clock = llm, drafter, end_id, repeats, clock

    @classmethod
    def build(cls, checkpoint: Path, max_draft_len: int, max_batch: int, max_context: int, repeats: int = 3):
        """NOT YET RUN ON A GPU. The LLM as serving builds it (PyTorch backend, overlap scheduler
        off, our tokenizer), with the counting drafter; the executor in this process, so the
        drafter's counts are the ones read here."""
        import os

        from backend.services.trtllm import _api
        os.environ.setdefault("TLLM_WORKER_USE_SINGLE_PROCESS", "1")
        drafter = counting_drafter(max_draft_len)
        llm = _api.llm_class()(
            model=str(checkpoint), backend="pytorch", skip_tokenizer_init=True, disable_overlap_scheduler=True,
            speculative_config=_api.user_provided_decoding_config()(max_draft_len=max_draft_len, drafter=drafter),
            kv_cache_config=_api.kv_cache_config()(enable_block_reuse=True),
            max_batch_size=max_batch, max_seq_len=max_context + LONG_TOKENS + max_draft_len + 8)
        return cls(llm, drafter, eos_id(checkpoint), repeats)

    def _run(self, prompts, max_tokens: int) -> Tuple[float, int]:
        from backend.services.trtllm import _api
        params = _api.sampling_params_class()(max_tokens=max_tokens, end_id=self.end_id, pad_id=self.end_id,
                                              top_k=1, ignore_eos=True, detokenize=False)
        n0, t0 = self.drafter.iterations, self.clock()
        self.llm.generate(prompts, params)
        return self.clock() - t0, self.drafter.iterations - n0

    def __call__(self, ctx: int, b: int, speculate: bool) -> float:
        import random
        rng = random.Random(ctx * 1000 + b)
        prompts = [[rng.randrange(100, 1000) for _ in range(ctx)] for _ in range(b)]
        self.drafter.speculate = speculate
        self._run(prompts, SHORT_TOKENS)  # warm-up: fills the cache the timed runs reuse
        samples = []
        for _ in range(self.repeats):
            (t_s, n_s), (t_l, n_l) = self._run(prompts, SHORT_TOKENS), self._run(prompts, LONG_TOKENS)
            samples.append((t_l - t_s) / max(1, n_l - n_s))
        return statistics.median_low(samples)

    def close(self) -> None:
        self.llm.shutdown()


def eos_id(checkpoint: Path) -> int:
    """The checkpoint's end-of-sequence token (config.json), for SamplingParams' end_id."""
    eos = json.loads((Path(checkpoint) / "config.json").read_text()).get("eos_token_id", 0)
    return int(eos[0] if isinstance(eos, list) else eos)


def main_trtllm(args) -> int:
    """NOT YET RUN ON A GPU. --engine trtllm: measure TensorRT-LLM's padded profile (no budget:
    the whole grid, a few minutes per K on a GPU)."""
    out = args.out_dir / profile_name(args.model, "trtllm")
    if out.exists() and not args.force:
        log(f"{out} exists; --force to measure again")
        return 0
    base = json.loads(TRTLLM_DEFAULT.read_text())
    max_batch, max_context = max(base["batch"]), max(base["ctx_buckets"])
    result = trtllm_profile(args.checkpoint, lambda k: TrtllmTimer.build(args.checkpoint, k, max_batch, max_context,
                                                                         args.repeats))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    log(f"wrote {out} in {result['elapsed_s']:.0f} s")
    return 0


def main_convert(source: Path, out: Path) -> int:
    """--from-gpu-step-costs: a bench/gpu_step_costs.py run as a padded profile (the trtllm default)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(from_gpu_step_costs(json.loads(source.read_text()), str(source)), indent=1) + "\n")
    log(f"wrote {out} from {source}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", type=Path, default=Path(".cache/models/smollm2-135m-instruct"))
    ap.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "torch", "trtllm"],
                    help="trtllm: TensorRT-LLM's padded profile, inside its container (NOT YET RUN ON A GPU)")
    ap.add_argument("--dtype", default="bf16", help="torch engine's dtype")
    ap.add_argument("--no-batch-invariant", action="store_true", help="torch engine, bf16: the batch-variant kernels")
    ap.add_argument("--gguf", default="", help="llama.cpp engine: this GGUF instead of the checkpoint's")
    ap.add_argument("--out-dir", type=Path, default=Path(".cache/profiles"))
    ap.add_argument("--model", default="smollm2-135m", help="file name prefix")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per point (fewer for slow points)")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="time for the whole profile; points that do not fit are interpolated")
    ap.add_argument("--drafter-dir", type=Path, default=Path(".cache/drafters"))
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--from-gpu-step-costs", type=Path, default=None, metavar="JSON",
                    help="convert a bench/gpu_step_costs.py run into a padded profile (--out) and exit")
    ap.add_argument("--out", type=Path, default=TRTLLM_DEFAULT, help="--from-gpu-step-costs: the profile written")
    args = ap.parse_args(argv)
    if args.from_gpu_step_costs is not None:
        return main_convert(args.from_gpu_step_costs, args.out)
    if args.engine == "trtllm":
        return main_trtllm(args)
    from backend.served_policy import engine_name
    from backend.server_config import ServerConfig
    served = ServerConfig(checkpoint=str(args.checkpoint), engine=args.engine, dtype=args.dtype, gguf=args.gguf,
                          batch_invariant=not args.no_batch_invariant)
    name = engine_name(served, Path.cwd())
    args.out = args.out_dir / profile_name(args.model, name)
    target = None
    if args.out.exists() and not args.force:  # checked before loading the engine: a second set-up is quick
        have = json.loads(args.out.read_text())
        built = drafter_label(profiled_drafter(args.drafter_dir))
        target = reusable_target(args.out, name)
        if target is not None and have.get("drafter") == built:
            log(f"{args.out} is up to date ({built}); --force to measure again")
            return 0
        if target is not None:
            log(f"{args.out} measured {have.get('drafter')!r}, now {built!r}: measuring the drafter again")
    engine = None if target is not None else target_engine(served, profiled_slots(), CTX_BUCKETS[-1] + 16)
    log(f"measuring {name} within {args.budget_s:.0f} s")
    result = profile(engine, name, args.checkpoint, args.dtype, args.repeats, args.drafter_dir, args.budget_s, target)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    switch = args.out.with_name(args.out.stem + ".switch.json")
    switch.write_text(json.dumps(result["switch_cost"], indent=1))
    log(f"wrote {args.out} and {switch} in {result['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
