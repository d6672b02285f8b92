"""A trainable feature drafter (EAGLE-style), saved in a layout the serving drafter loads.

Why: a 4-layer student that reads only tokens tops out near 0.40 greedy agreement
with SmolLM2 on chat (measured: more data did not help). The target's own top
hidden state already holds much of what it will say next; a drafter that reads it
(EAGLE, Li et al. 2024) needs less capacity of its own to agree with the target.

Vocabulary of this module: f_t is the target's feature at position t (its final-
normed hidden state, what its head reads to predict token t+1). At position t the
drafter reads z_t = embed(x_t) + fc (s f_{t-1}) (f_{-1} = 0; s a fixed scale), runs
its Llama decoder layers (the target's first ones to start; its own KV cache when
serving) over z_0..z_t, and its output o_t = norm(g_t)
stands in for f_t: the head turns it into a guess for x_{t+1}, and drafting a
second token feeds o_t where the true f_t is not known yet.

Training (`feature_losses`) teaches both uses in one step ("training-time test", EAGLE-3):
pass 1 reads the true features (the first draft token's situation, and the catch-up
the server does on committed tokens); pass 2 reads pass 1's outputs o_{t-1} in
place of f_{t-1} and attends to pass 1's keys for earlier positions plus its own
(the second draft token's situation). Each pass's head output is trained on the
target's soft labels; o_t is also pulled towards f_t (smooth L1).
The head covers a draft vocabulary (rows of the target's tied embedding to start),
like the token students (student.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from backend.drafters.feature import FEATURE_FORMAT  # config.json "drafter_format": what the server loads

from .student import LAYER_TENSORS, _rope, save_drafter



class FeatureStudent(nn.Module):
    def __init__(self, cfg: dict, target: Dict[str, torch.Tensor], vocab_ids: torch.Tensor, layers: int = 4):
        super().__init__()
        H = cfg["hidden_size"]
        self.cfg = dict(cfg, num_hidden_layers=layers, tie_word_embeddings=False, draft_vocab_size=len(vocab_ids),
                        drafter_format=FEATURE_FORMAT)
        self.hidden, self.heads = H, cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim") or H // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-5)
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.register_buffer("embed", target["embed_tokens.weight"].float().clone(), persistent=False)
        self.register_buffer("vocab_ids", vocab_ids.long().clone(), persistent=False)
        index = torch.full((self.embed.shape[0],), -1, dtype=torch.long)
        index[self.vocab_ids] = torch.arange(len(vocab_ids))
        self.register_buffer("index_of", index, persistent=False)
        self.head = nn.Parameter(self.embed[self.vocab_ids].clone())
        self.norm = nn.Parameter(target["norm.weight"].float().clone())
        # z_t = embed(x_t) + fc (s f_{t-1}); fc starts at zero, so the untrained drafter is
        # the target's first layers reading tokens (a token student) and learns to use f.
        # s brings features (RMS ~ the final norm's weights, ~2 here) to the embeddings'
        # scale (~0.14): unscaled, fc's first updates swamped the token input (measured:
        # training fell behind a token student's).
        rms = lambda t: float(t.float().pow(2).mean().sqrt())  # noqa: E731
        self.feature_scale = rms(self.embed) / rms(target["norm.weight"])
        self.cfg["feature_scale"] = self.feature_scale
        self.fc = nn.Parameter(torch.zeros(H, H))
        self.layers = layers
        self.params = nn.ParameterDict({
            f"layers__{i}__{name.replace('.', '__')}": nn.Parameter(target[f"layers.{i}.{name}.weight"].float().clone())
            for i in range(layers) for name in LAYER_TENSORS})
        inv = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def w(self, i: int, name: str) -> torch.Tensor:
        return self.params[f"layers__{i}__{name.replace('.', '__')}"]

    def _layer(self, i: int, x: torch.Tensor, cos, sin, earlier=None):
        """Decoder layer i. Without `earlier`: causal self-attention; returns (x, k, v).
        With earlier = (k1, v1) of pass 1: query t sees pass 1's keys before t and its own."""
        B, L, _ = x.shape
        h = F.rms_norm(x, (self.hidden,), self.w(i, "input_layernorm"), self.eps)
        q = F.linear(h, self.w(i, "self_attn.q_proj")).view(B, L, self.heads, self.head_dim)
        k = F.linear(h, self.w(i, "self_attn.k_proj")).view(B, L, self.kv_heads, self.head_dim)
        v = F.linear(h, self.w(i, "self_attn.v_proj")).view(B, L, self.kv_heads, self.head_dim)
        q, k = _rope(q, cos, sin).transpose(1, 2), _rope(k, cos, sin)
        g = self.heads // self.kv_heads
        k, v = (t.transpose(1, 2).repeat_interleave(g, dim=1) for t in (k, v))
        if earlier is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            j = torch.arange(L)
            mask = torch.cat([j[None, :] < j[:, None], torch.eye(L, dtype=torch.bool)], dim=1)
            a = F.scaled_dot_product_attention(q, torch.cat([earlier[0], k], 2), torch.cat([earlier[1], v], 2),
                                               attn_mask=mask)
        x = x + F.linear(a.transpose(1, 2).reshape(B, L, -1), self.w(i, "self_attn.o_proj"))
        h = F.rms_norm(x, (self.hidden,), self.w(i, "post_attention_layernorm"), self.eps)
        x = x + F.linear(F.silu(F.linear(h, self.w(i, "mlp.gate_proj"))) * F.linear(h, self.w(i, "mlp.up_proj")),
                         self.w(i, "mlp.down_proj"))
        return x, k, v

    def two_passes(self, ids: torch.Tensor, feats: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Outputs o of pass 1 (true features) and pass 2 (pass 1's outputs as features), [B, L, H]."""
        B, L = ids.shape
        ang = torch.outer(torch.arange(L, dtype=torch.float32), self.inv_freq)
        ang = torch.cat([ang, ang], -1)
        cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
        e = self.embed[ids]

        def shifted(f):
            return torch.cat([f.new_zeros(B, 1, self.hidden), f[:, :-1]], dim=1)

        x, kv = e + F.linear(shifted(feats) * self.feature_scale, self.fc), []
        for i in range(self.layers):
            x, k, v = self._layer(i, x, cos, sin)
            kv.append((k, v))
        o1 = F.rms_norm(x, (self.hidden,), self.norm, self.eps)
        x = e + F.linear(shifted(o1) * self.feature_scale, self.fc)
        for i in range(self.layers):
            x, _, _ = self._layer(i, x, cos, sin, earlier=kv[i])
        return o1, F.rms_norm(x, (self.hidden,), self.norm, self.eps)

    def logits(self, o: torch.Tensor) -> torch.Tensor:
        return F.linear(o, self.head)

    def save(self, out: Path, dtype: torch.dtype = torch.bfloat16) -> Dict[str, int]:
        """config.json + model.safetensors in the engine's names plus fc and draft_vocab."""
        return save_drafter(self, out, dtype, {"model.fc.weight": self.fc.detach()})


def feature_losses(student: FeatureStudent, ids, feats, mask, top_ids, top_p, reg_weight: float = 0.1):
    """(loss, agreement counts [pass 1, pass 2], positions): soft-label cross-entropy of both
    passes over the draft vocabulary, plus smooth L1 of pass 1's outputs against the features."""
    o1, o2 = student.two_passes(ids, feats)
    col = student.index_of[top_ids[mask]]
    p = top_p[mask] * (col >= 0)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    col = col.clamp_min(0)
    top1 = top_ids[mask][:, 0]
    loss, agree = F.smooth_l1_loss(o1[mask].float(), feats[mask].float()) * reg_weight, []
    for o in (o1, o2):
        lg = student.logits(o[mask]).float()
        loss = loss - (p * torch.log_softmax(lg, -1).gather(-1, col)).sum(-1).mean()
        agree.append(int((student.vocab_ids[lg.argmax(-1)] == top1).sum()))
    return loss, agree, int(mask.sum())
