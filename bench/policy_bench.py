"""Policy benchmark: decision overhead per step and a simulator comparison.

    python bench/policy_bench.py [--quick] [--png bench/results/policy_bench.png]

1. Overhead: mean wall time of decide() + observe() per step at batch 1 and 64
   (target < 50 us), measured on a recorded-like synthetic step; the best of
   `REPEATS` independent runs (as timeit does), since a shared VM adds noise of
   tens of percent to any single run.
2. Simulator: regret, best-arm ratio and throughput per policy per environment
   (policy/environments.py), seeded. Writes a PNG if matplotlib is installed.
"""
from __future__ import annotations

import argparse
import os
import random
import time

from policy import make_policy
from policy.environments import ENVIRONMENTS
from policy.simulator import DEFAULT_PARAMS, build, format_table, simulate
from policy.types import DrafterInfo, SequenceOutcome, SequenceView, StepContext, StepOutcome

DRAFTERS = [DrafterInfo("draft", True, True, 256), DrafterInfo("ngram", False, True)]


REPEATS = 3


def overhead_us(name: str, batch: int, steps: int = 300, repeats: int = REPEATS) -> float:
    """Best of `repeats` runs of `_overhead_run` (each a fresh policy)."""
    return min(_overhead_run(name, batch, steps) for _ in range(repeats))


def _overhead_run(name: str, batch: int, steps: int) -> float:
    pol = make_policy(name, rng=random.Random(0), **DEFAULT_PARAMS.get(name, {}))
    rng = random.Random(1)
    for i in range(batch):
        pol.on_request_start(i)
    total = 0.0
    for t in range(steps):
        ctx = StepContext(t, [SequenceView(i, 200 + t, t, 512, 0.0, "draft", {"draft": 0}) for i in range(batch)],
                          DRAFTERS, queue_len=0, kv_free_blocks=3000, kv_total_blocks=4096)
        t0 = time.perf_counter()
        dec = pol.decide(ctx)
        t1 = time.perf_counter()
        seqs = []
        for i in range(batch):
            arm = dec.arm_for(i)
            acc = rng.randint(0, arm.gamma) if arm.gamma else 0
            model = arm.drafter == "draft"
            seqs.append(SequenceOutcome(i, arm.drafter, arm.gamma, acc, acc + 1, p_draft=[0.7] * arm.gamma,
                                        confidences=[0.6] * arm.gamma, kl=[0.3] * arm.gamma if model else [],
                                        tv=[0.3] * arm.gamma if model else []))
        out = StepOutcome(t, batch, seqs, total_time_s=0.04 + 0.001 * batch)
        t2 = time.perf_counter()
        pol.observe(out)
        t3 = time.perf_counter()
        if t >= 20:  # skip warm-up
            total += (t1 - t0) + (t3 - t2)
    return total / (steps - 20) * 1e6


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(matplotlib not installed: no plot written to {path})")
        return
    envs = sorted({r.env for r in rows})
    pols = sorted({r.policy for r in rows})
    fig, axes = plt.subplots(1, len(envs), figsize=(4.2 * len(envs), 4.5), sharey=False)
    for ax, env in zip(axes, envs):
        vals = [next(r.throughput for r in rows if r.env == env and r.policy == p) for p in pols]
        ax.barh(pols, vals, color=["tab:red" if p == "composite" else "tab:blue" for p in pols])
        ax.set_title(env)
        ax.set_xlabel("simulated tokens/s")
        if ax is not axes[0]:
            ax.set_yticklabels([])
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot written to {path}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="shorter simulator runs")
    ap.add_argument("--png", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "policy_bench.png"))
    a = ap.parse_args(argv)
    names = sorted(DEFAULT_PARAMS) + ["off"]
    print("decision overhead per step, decide + observe (us)")
    print(f"{'policy':<28}{'B=1':>9}{'B=64':>9}")
    for n in names:
        b1, b64 = overhead_us(n, 1), overhead_us(n, 64)
        flag = "" if max(b1, b64) < 50 else "  (> 50 us target)"
        print(f"{n:<28}{b1:>9.1f}{b64:>9.1f}{flag}")
    rows = []
    for env_name in ["stationary", "drift", "batch", "mixed"]:
        env = ENVIRONMENTS[env_name]()
        for n in names:
            rows.append(simulate(build(n, env, 0), env, steps=300 if a.quick else None, seed=0, policy_name=n))
    print()
    print(format_table(rows))
    plot(rows, a.png)


if __name__ == "__main__":
    main()
