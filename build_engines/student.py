"""A trainable Llama drafter (autograd), saved in the Hugging Face layout the engine loads.

The student has the target's width, its first `layers` decoder layers as the
initialisation, the target's embedding (frozen, so the server shares the target's
copy) and a head restricted to a draft vocabulary: the `vocab_ids` the target
actually predicts in the domain (as FR-Spec/EAGLE-3 do). The head rows start as
the target's tied embedding rows; the layers, the final norm and (`train_head`,
the default for builds) the head learn. The small head makes both training and drafting several times cheaper
(the full 49k-row head is most of a small model's step) at the price of never
proposing a token outside the draft vocabulary: q is zero there, which rejection
sampling handles exactly. Saved tensor names match backend/engines/torch_llama.py
plus `draft_vocab`, so the server runs the drafter with the same engine.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import save_file

LAYER_TENSORS = ("input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


class StudentLlama(nn.Module):
    def __init__(self, cfg: dict, target: Dict[str, torch.Tensor], layers: int, vocab_ids: torch.Tensor,
                 train_head: bool = False):
        super().__init__()
        self.cfg = dict(cfg, num_hidden_layers=layers, tie_word_embeddings=False, draft_vocab_size=len(vocab_ids))
        self.hidden, self.heads = cfg["hidden_size"], cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-5)
        theta = (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0))
        self.register_buffer("embed", target["embed_tokens.weight"].float().clone(), persistent=False)
        self.register_buffer("vocab_ids", vocab_ids.long().clone(), persistent=False)
        head = target.get("lm_head.weight")  # a drafter artifact's own head, or else the tied rows
        head = (head if head is not None and head.shape[0] == len(vocab_ids) else self.embed[self.vocab_ids]).float().clone()
        if train_head:  # the draft head starts as the target's (tied) rows and learns its own calibration
            self.head = nn.Parameter(head)
        else:
            self.register_buffer("head", head, persistent=False)
        # token id -> row of the draft head (-1: outside the draft vocabulary)
        index = torch.full((self.embed.shape[0],), -1, dtype=torch.long)
        index[self.vocab_ids] = torch.arange(len(vocab_ids))
        self.register_buffer("index_of", index, persistent=False)
        self.norm = nn.Parameter(target["norm.weight"].float().clone())
        self.params = nn.ParameterDict()
        for i in range(layers):
            for name in LAYER_TENSORS:
                key = f"layers.{i}.{name}.weight"
                self.params[key.replace(".", "__")] = nn.Parameter(target[key].float().clone())
        self.layers = layers
        inv = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def w(self, i: int, name: str) -> torch.Tensor:
        return self.params[f"layers__{i}__{name.replace('.', '__')}__weight"]

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """Final-normed hidden states [B, L, H] (the head is applied by the loss, in chunks)."""
        B, L = ids.shape
        x = self.embed[ids]
        ang = torch.outer(torch.arange(L, dtype=torch.float32), self.inv_freq)
        ang = torch.cat([ang, ang], -1)
        cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
        g = self.heads // self.kv_heads
        for i in range(self.layers):
            h = F.rms_norm(x, (self.hidden,), self.w(i, "input_layernorm"), self.eps)
            q = F.linear(h, self.w(i, "self_attn.q_proj")).view(B, L, self.heads, self.head_dim)
            k = F.linear(h, self.w(i, "self_attn.k_proj")).view(B, L, self.kv_heads, self.head_dim)
            v = F.linear(h, self.w(i, "self_attn.v_proj")).view(B, L, self.kv_heads, self.head_dim)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if g > 1:
                k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, L, -1)
            x = x + F.linear(o, self.w(i, "self_attn.o_proj"))
            h = F.rms_norm(x, (self.hidden,), self.w(i, "post_attention_layernorm"), self.eps)
            x = x + F.linear(F.silu(F.linear(h, self.w(i, "mlp.gate_proj"))) * F.linear(h, self.w(i, "mlp.up_proj")),
                             self.w(i, "mlp.down_proj"))
        return F.rms_norm(x, (self.hidden,), self.norm, self.eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary (column j is token vocab_ids[j])."""
        return F.linear(h, self.head)

    def save(self, out: Path, dtype: torch.dtype = torch.bfloat16) -> Dict[str, int]:
        """Write config.json + model.safetensors (embedding included: the directory stands alone)."""
        return save_drafter(self, out, dtype)


def save_drafter(student, out: Path, dtype: torch.dtype, extra: Optional[Dict[str, torch.Tensor]] = None) -> Dict[str, int]:
    """Write a student's config.json + model.safetensors (its layers, norm, head, draft
    vocabulary, the embedding so the directory stands alone, and `extra` tensors).
    Returns the bytes of what it holds besides the embedding, and of everything."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {"model.embed_tokens.weight": student.embed, "model.norm.weight": student.norm.detach(),
               "lm_head.weight": student.head.detach(), **(extra or {})}
    for i in range(student.layers):
        for name in LAYER_TENSORS:
            tensors[f"model.layers.{i}.{name}.weight"] = student.w(i, name).detach()
    tensors = {k: v.to(dtype).contiguous() for k, v in tensors.items()}
    tensors["draft_vocab"] = student.vocab_ids.contiguous()
    save_file(tensors, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(dict(student.cfg, dtype=str(dtype).removeprefix("torch.")), indent=2))
    size = {k: v.numel() * v.element_size() for k, v in tensors.items()}
    return {"layer_bytes": sum(b for k, b in size.items() if k not in ("model.embed_tokens.weight", "draft_vocab")),
            "total_bytes": sum(size.values())}


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


def soft_label_loss(student: StudentLlama, h: torch.Tensor, mask: torch.Tensor, top_ids: torch.Tensor,
                    top_p: torch.Tensor, chunk: int = 1024) -> tuple:
    """Cross-entropy against the target's top-k distribution restricted to the draft vocabulary
    and renormalised, over masked positions.

    Returns (mean loss, number of positions where the student's argmax equals the target's).
    The head runs over chunks of rows so a [tokens, vocab] logit matrix never exists whole.
    """
    rows = h[mask]
    col = student.index_of[top_ids[mask]]  # [n, k] draft-head column, -1 outside
    p = top_p[mask] * (col >= 0)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-9)
    col = col.clamp_min(0)
    total, agree = rows.new_zeros(()), 0
    target_top1 = top_ids[mask][:, 0]
    for s in range(0, rows.shape[0], chunk):
        lg = student.logits(rows[s: s + chunk]).float()
        logq = torch.log_softmax(lg, -1)
        total = total - (p[s: s + chunk] * logq.gather(-1, col[s: s + chunk])).sum()
        agree += int((student.vocab_ids[lg.argmax(-1)] == target_top1[s: s + chunk]).sum())
    return total / max(1, rows.shape[0]), agree


def draft_vocabulary(samples, size: int, always=()) -> torch.Tensor:
    """The `size` tokens the target predicts most often as its top-1 in these samples (then most
    frequent in the text), plus `always` (e.g. EOS). Ties broken by id: deterministic."""
    from collections import Counter
    top1, text = Counter(), Counter()
    for s in samples:
        top1.update(s.top_ids[s.mask, 0].tolist())
        text.update(s.ids.tolist())
    ranked = [t for t, _ in sorted(top1.items(), key=lambda kv: (-kv[1], kv[0]))]
    ranked += [t for t, _ in sorted(text.items(), key=lambda kv: (-kv[1], kv[0])) if t not in top1]
    chosen = list(dict.fromkeys(list(always) + ranked))[:size]
    return torch.tensor(sorted(chosen), dtype=torch.long)
