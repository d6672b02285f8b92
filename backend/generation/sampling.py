"""Target distributions and lossless acceptance (verification is sampling, not drafting).

Vocabulary (README.md, "The step protocol"): for a sequence with draft tokens
d_1..d_γ the target forward yields γ+1 distributions p_1..p_{γ+1} (p_j scores the
position of d_j; p_{γ+1} follows the last draft).
  * accepted tokens: the leading drafts the target agrees with;
  * recovered token: at the first rejection j, a sample from norm(max(0, p_j − q_j));
  * bonus token: when all γ are accepted, a sample from p_{γ+1}.
Every step therefore emits accepted + 1 tokens.

Greedy (temperature 0): accept d_j iff d_j == argmax p_j; the emitted +1 token is
argmax at the first mismatch (or the bonus position). This equals plain greedy
decoding token for token.

Sampling: accept d_j with probability min(1, p_j(d_j)/q_j(d_j)) (Leviathan et al.
2023, Chen et al. 2023); the emitted sequence is distributed exactly as the
target's. Model-free drafters have q = one-hot at d_j, so the test is
"accept with probability p_j(d_j)" and the recovered distribution is p_j with d_j
removed, renormalised.

Example (greedy): drafts [5, 9, 4], target argmax per position [5, 9, 7, 3]
-> accepted 2 ([5, 9]), recovered 7, emitted [5, 9, 7].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Distribution the target samples from after temperature, top-k and top-p.

    logits: [n, V] float32 -> probs [n, V]. The speculative and the plain paths
    both sample from exactly this distribution, which is what makes them equal.
    """
    x = logits / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    probs = torch.softmax(x, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@dataclass
class Verdict:
    tokens: list  # emitted tokens: accepted drafts + one recovered/bonus token
    accepted: int
    p_draft: list  # p_j(d_j) per verified draft position (for rewards)


def accept_greedy(target_argmax: Sequence[int], draft: Sequence[int]) -> Verdict:
    """target_argmax has len(draft) + 1 entries (see module example)."""
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return Verdict(tokens=list(draft[:n]) + [int(target_argmax[n])], accepted=n, p_draft=[])


def position_generator(seed: int, position: int) -> torch.Generator:
    """The random stream of one output position of one request."""
    return torch.Generator().manual_seed((seed * 1_000_003 + position) % (1 << 63))


def accept_sampling_positional(p: torch.Tensor, draft: Sequence[int], seed: int, start: int) -> Verdict:
    """Speculative sampling for one-hot (model-free) drafts that a seed reproduces.

    At each position the target's token is sampled from p with that position's own
    generator, and the draft is accepted while it matches. P(accept d) = p(d) and every
    emitted token is distributed exactly as p — the same law as rejection sampling with
    a one-hot q — but the output depends only on (seed, position), not on what was
    drafted, so a seed gives the same text whatever the policy decides.
    p: [γ+1, V]; `start` is the absolute position of the first token this step emits.
    """
    out, p_draft = [], []
    for j in range(len(draft) + 1):
        y = int(torch.multinomial(p[j], 1, generator=position_generator(seed, start + j)))
        out.append(y)
        if j == len(draft):
            break
        p_draft.append(float(p[j, draft[j]]))
        if y != draft[j]:
            return Verdict(tokens=out, accepted=j, p_draft=p_draft)
    return Verdict(tokens=out, accepted=len(draft), p_draft=p_draft)


def accept_sampling(p: torch.Tensor, draft: Sequence[int], q: Optional[torch.Tensor],
                    generator: torch.Generator) -> Verdict:
    """Standard speculative rejection sampling.

    p: [γ+1, V] target probabilities; q: [γ, V] draft probabilities or None for a
    one-hot (model-free) drafter.
    """
    gamma = len(draft)
    uniforms = torch.rand(gamma, generator=generator).tolist() if gamma else []
    out, p_draft = [], []
    for j, d in enumerate(draft):
        pj = float(p[j, d])
        qj = 1.0 if q is None else float(q[j, d])
        p_draft.append(pj)
        if qj > 0 and uniforms[j] < min(1.0, pj / qj):
            out.append(int(d))
            continue
        if q is None:
            residual = p[j].clone()
            residual[d] = 0.0
        else:
            residual = (p[j] - q[j]).clamp_min(0.0)
        total = float(residual.sum())
        # total == 0 only if p == q (then acceptance was certain); fall back to p.
        dist = residual / total if total > 0 else p[j]
        out.append(int(torch.multinomial(dist, 1, generator=generator)))
        return Verdict(tokens=out, accepted=j, p_draft=p_draft)
    out.append(int(torch.multinomial(p[gamma], 1, generator=generator)))
    return Verdict(tokens=out, accepted=gamma, p_draft=p_draft)


def divergences(p: torch.Tensor, q: torch.Tensor) -> tuple:
    """KL(p||q) and TV(p, q) per row (lists of floats): how far a model drafter's q is from the
    target's p at each verified draft position (DSDE's signal). q may be zero where p is not
    (a draft-vocabulary head); it is floored at 1e-10, so KL stays finite but large there."""
    kl = (p * (p.clamp_min(1e-30).log() - q.clamp_min(1e-10).log())).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    return kl.tolist(), tv.tolist()
