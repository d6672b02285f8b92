"""A Llama-family decoder in plain torch, built for the draft-verify loop on CPU.

Why not transformers' model: its per-step Python/dispatch overhead (~40 ms per
SmolLM2 decode step here) dwarfs the memory-bandwidth floor (~11 ms), and its
cache grows by concatenation. This engine:
  * preallocates one KV cache per batch *slot* ([slots, kv_heads, ctx+1, head_dim]
    per layer) and writes new keys/values with one index_copy_ per layer;
  * takes a *ragged* batch (sequence b appends n_b tokens at position start_b),
    padded to S = max n_b; padded tokens write to a scratch position (index ctx)
    that no real query ever attends to;
  * truncation (rejected drafts) is free: a sequence's valid length is just a
    number owned by the caller, positions past it are overwritten later
    (`truncate` exists for the engine contract, backend/engines/contract.py, and
    only checks its arguments);
  * fuses q/k/v and gate/up projections, and computes logits only for the
    positions the caller asks for (the lm_head is the largest matrix).
Attention uses the grouped-query trick: the g = heads/kv_heads query heads that
share a kv head are folded into the query length, so K/V are never repeated.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from .contract import check_forward_args, check_slot

DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}


@dataclass(frozen=True)
class LlamaShape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    rms_eps: float
    rope_theta: float
    max_positions: int
    eos_token_id: int
    tie_embeddings: bool

    @classmethod
    def from_config(cls, cfg: dict) -> "LlamaShape":
        if cfg.get("model_type") not in ("llama", "mistral", "qwen2") and "LlamaForCausalLM" not in cfg.get("architectures", []):
            raise ValueError(f"unsupported architecture {cfg.get('architectures')}: expected a Llama-family model")
        rope = cfg.get("rope_parameters") or {}
        if (rope.get("rope_type") or "default") != "default" or cfg.get("rope_scaling"):
            raise ValueError("only default RoPE is supported (no rope scaling)")
        heads = cfg["num_attention_heads"]
        eos = cfg.get("eos_token_id", 2)
        return cls(
            vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=heads,
            kv_heads=cfg.get("num_key_value_heads", heads), head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate=cfg["intermediate_size"], rms_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=rope.get("rope_theta", cfg.get("rope_theta", 10000.0)),
            max_positions=cfg.get("max_position_embeddings", 2048),
            eos_token_id=eos[0] if isinstance(eos, list) else eos,
            tie_embeddings=cfg.get("tie_word_embeddings", False),
        )


class Linear:
    """y = x @ W.T with the weight laid out for the fastest kernel this CPU has.

    bf16 on a CPU with native bf16 (AVX512-BF16/AMX, or AVX-NE-CONVERT): oneDNN with
    a prepacked weight reads ~20 GB/s for 1..9 rows, i.e. verifying 8 draft tokens
    costs about what decoding 1 does; unpacked F.linear re-reorders the weight on
    every call and is ~1.5x slower.

    bf16 on a CPU without it (AVX2 only): F.linear emulates bf16 one row at a time,
    so cost grows linearly with rows (whole SmolLM2-135M step, 2 AVX2 cores: 8 rows
    5.7x one row; fp32 weights 2.5x, but one fp32 row costs 1.9x a bf16 one). Such a
    layer keeps an fp32 copy of the same (bf16-valued) weight too and multiplies
    `WIDE_ROWS` or more rows with it: steps of 8+ rows (verifying drafts, batched
    decoding) then cost about what fp32 costs, fewer rows what bf16 costs, for 3
    bytes per weight instead of 2 (bench/bench_cpu_kernels.py). The products are the
    same numbers, summed in fp32 either way.

    fp32 on a CPU: oneDNN with a prepacked weight too. F.linear's MKL sgemm copies
    (packs) the whole weight on every call of 2+ rows, so verifying costs 2-2.3x a
    decode step; packed once, it reads the weight once per call (whole SmolLM2-135M
    step, 2 AVX2 cores, 200 cached tokens, medians of runs: 1 token 56 -> 48 ms, 3 tokens
    129 -> 55 ms, 6 tokens 117 -> 65 ms, 4 sequences x 1 token 123 -> 58 ms). fp32 makes no
    batch-invariance promise either way (it ignores batch_invariant).
    """

    __slots__ = ("weight", "packed", "wide", "nbytes", "min_rows")
    WIDE_ROWS = 8  # whole-model step times of bf16 and fp32 weights cross at 6-8 rows on 2 AVX2 cores
    MIN_ROWS = 8  # batch-invariant mode: every call multiplies at least this many rows (see __call__)
    PACK_FP32 = True  # fp32 weights prepacked for oneDNN; bench/bench_cpu_kernels.py builds one engine without

    def __init__(self, weight: torch.Tensor, batch_invariant: bool = False):  # weight: [out, in]
        """batch_invariant (bf16): a row's product must not depend on how many rows share the
        call. oneDNN's packed bf16 kernel sums K in a different order below 6 rows (K=1536,
        down_proj: up to 1.6e-2 apart, measured), the same order from 6 to 2048+ rows: so
        fewer than MIN_ROWS rows are padded with zero rows (costs ~nothing: 1..9 rows cost
        the same). Without native bf16 there is one weight path (the bf16 one, no fp32 copy):
        the fp32 copy's MKL sgemm changes its reduction order with the row count, and two
        weight paths give two answers."""
        self.weight = weight.contiguous()
        self.packed = self.wide = None
        self.min_rows = self.MIN_ROWS if batch_invariant and weight.dtype == torch.bfloat16 else 1
        on_cpu = weight.device.type == "cpu"  # oneDNN packing and the fp32 copy are CPU kernels' needs
        if on_cpu and ((weight.dtype == torch.float32 and self.PACK_FP32) or (weight.dtype == torch.bfloat16 and native_bf16())):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight, 64)
                if weight.dtype == torch.bfloat16:
                    self.weight = None  # the packed copy is the weight now: do not hold both
                # fp32 keeps the plain weight beside it (twice the weight memory; fp32 on a CPU is the
                # reference, not the served path): the engine can still move to another device, and
                # a head tied to the embedding stays that tensor
            except (RuntimeError, AttributeError):  # an older/other build: plain F.linear
                self.packed = None
        elif on_cpu and weight.dtype == torch.bfloat16 and not batch_invariant:
            self.wide = self.weight.float()
        self.nbytes = weight.numel() * weight.element_size() + (self.wide.numel() * 4 if self.wide is not None else 0)
        if self.packed is not None and self.weight is not None:
            self.nbytes += weight.numel() * weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows < self.min_rows:  # pad to a row count whose kernel sums like every larger one
            flat = x.reshape(rows, x.shape[-1])
            y = self._mul(torch.cat([flat, flat.new_zeros(self.min_rows - rows, x.shape[-1])]))
            return y[:rows].reshape(*x.shape[:-1], y.shape[-1])
        return self._mul(x)

    def to(self, device: torch.device, shared: dict) -> None:
        """Move the weight (and its fp32 copy) to `device`. `shared` maps a source tensor's data_ptr
        to its moved copy, so a weight tied to the embedding stays one tensor."""
        if self.packed is not None and device.type != "cpu":
            if self.weight is None:
                raise ValueError("a oneDNN-packed weight cannot leave the CPU; build the engine with device=...")
            self.packed = None  # fp32: the plain weight moves, F.linear multiplies it there
        if self.weight is not None:
            moved = shared.get(self.weight.data_ptr())
            self.weight = moved if moved is not None else self.weight.to(device)
        if self.wide is not None:
            self.wide = self.wide.to(device)

    def _mul(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")
        if self.wide is not None and x.numel() >= self.WIDE_ROWS * x.shape[-1]:
            return F.linear(x.float(), self.wide).to(x.dtype)
        return F.linear(x, self.weight)


_NATIVE_BF16 = None


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (oneDNN's own test)."""
    global _NATIVE_BF16
    if _NATIVE_BF16 is None:
        try:
            _NATIVE_BF16 = bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (RuntimeError, AttributeError):
            _NATIVE_BF16 = False
    return _NATIVE_BF16


class Layer:
    __slots__ = ("attn_norm", "wqkv", "wo", "mlp_norm", "w_gate_up", "w_down")


def load_checkpoint(ckpt: Path, dtype: torch.dtype):
    """Read config + safetensors of a Hugging Face Llama checkpoint directory."""
    cfg = json.loads((ckpt / "config.json").read_text())
    shape = LlamaShape.from_config(cfg)
    tensors = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    if not tensors:
        raise FileNotFoundError(f"no *.safetensors in {ckpt}")
    return shape, {k.removeprefix("model."): v.to(dtype) if v.is_floating_point() else v for k, v in tensors.items()}


def random_weights(shape: LlamaShape, dtype: torch.dtype, device: str | torch.device = "cpu",
                   seed: int = 0) -> dict:
    """Weights of `shape` drawn at random (N(0, 0.02) matrices, unit norms), made on `device`:
    a model's step costs without its checkpoint (bench/gpu_step_costs.py times an 8B layout on a
    GPU machine that cannot download one). Names as load_checkpoint returns them."""
    gen = torch.Generator(device=device).manual_seed(seed)
    s, qd, kd = shape, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def mat(rows: int, cols: int) -> torch.Tensor:
        return (torch.randn(rows, cols, generator=gen, device=device, dtype=torch.float32) * 0.02).to(dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype, device=device)

    w = {"embed_tokens.weight": mat(s.vocab, s.hidden), "norm.weight": ones(s.hidden)}
    if not s.tie_embeddings:
        w["lm_head.weight"] = mat(s.vocab, s.hidden)
    for i in range(s.layers):
        p = f"layers.{i}."
        w.update({p + "input_layernorm.weight": ones(s.hidden), p + "post_attention_layernorm.weight": ones(s.hidden),
                  p + "self_attn.q_proj.weight": mat(qd, s.hidden), p + "self_attn.k_proj.weight": mat(kd, s.hidden),
                  p + "self_attn.v_proj.weight": mat(kd, s.hidden), p + "self_attn.o_proj.weight": mat(s.hidden, qd),
                  p + "mlp.gate_proj.weight": mat(s.intermediate, s.hidden),
                  p + "mlp.up_proj.weight": mat(s.intermediate, s.hidden),
                  p + "mlp.down_proj.weight": mat(s.hidden, s.intermediate)})
    return w


class TorchLlama:
    """Ragged-batch Llama forward over a slot-contiguous preallocated KV cache.

    batch_invariant (default on; bf16 only, fp32 ignores it): a position's logits and hidden
    state are bit-identical whatever else shares the forward (other sequences, draft tokens,
    padding) and whichever slot holds the sequence, so verifying k drafts in one forward
    gives exactly what decoding them one at a time gives (lossless greedy speculation).
    Off, bf16 logits of the same token move by 0.1-0.5 between batch shapes (argmax
    flips). A drafter's engine needs no invariance (its drafts are verified): pass False. It fixes the kernels' shapes: linear layers get >= Linear.MIN_ROWS rows, and
    attention gets one token per flash-kernel batch entry and keys in whole KV_TILEs (see
    _attend_invariant). Cost: bench/bench_batch_invariance.py.
    """

    KV_TILE = 512  # batch-invariant attention: keys per call in whole 512-key blocks of the flash kernel

    def __init__(self, ckpt: str | Path | None, *, dtype: str = "bf16", max_slots: int = 8, max_context: int = 2048,
                 batch_invariant: bool = True, device: str | torch.device = "cpu",
                 weights: tuple[LlamaShape, dict] | None = None):
        """device: where weights, RoPE tables and the KV cache live (a model drafter beside
        TensorRT-LLM runs on its GPU; the CPU engines are "cpu", the default). weights: a
        (shape, tensors) pair used instead of reading `ckpt` (random_weights' timing runs)."""
        self.dtype = DTYPES[dtype]
        self.device = torch.device(device)
        self.batch_invariant = batch_invariant and self.dtype == torch.bfloat16
        if weights is not None:
            self.shape, w = weights[0], {k: v.to(self.dtype) if v.is_floating_point() else v
                                         for k, v in weights[1].items()}
        else:
            self.shape, w = load_checkpoint(Path(ckpt), self.dtype)
        if self.device.type != "cpu":
            w = {k: v.to(self.device) for k, v in w.items()}
        s = self.shape
        if max_context > s.max_positions:
            raise ValueError(f"max_context {max_context} exceeds the model's {s.max_positions} positions")
        self.max_slots, self.max_context = max_slots, max_context
        self.embed = w["embed_tokens.weight"]
        bi = self.batch_invariant
        self.lm_head = Linear(w["embed_tokens.weight"] if s.tie_embeddings or "lm_head.weight" not in w
                              else w["lm_head.weight"], bi)
        self.final_norm = w["norm.weight"]
        # A drafter's head may cover only a draft vocabulary: logit column j is token draft_vocab[j].
        self.draft_vocab = w.get("draft_vocab")
        self.layers = []
        for i in range(s.layers):
            p = f"layers.{i}."
            L = Layer()
            L.attn_norm = w[p + "input_layernorm.weight"]
            L.wqkv = Linear(torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"]), bi)
            L.wo = Linear(w[p + "self_attn.o_proj.weight"], bi)
            L.mlp_norm = w[p + "post_attention_layernorm.weight"]
            L.w_gate_up = Linear(torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]]), bi)
            L.w_down = Linear(w[p + "mlp.down_proj.weight"], bi)
            self.layers.append(L)
        # RoPE tables for positions 0..max_context (the last one is the scratch position).
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float32) / s.head_dim))
        ang = torch.outer(torch.arange(max_context + 1, dtype=torch.float32), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.cos, self.sin = ang.cos().to(self.dtype).to(self.device), ang.sin().to(self.dtype).to(self.device)
        self._alloc_cache()

    def _alloc_cache(self) -> None:
        """KV cache: [slots, kv_heads, ctx + 1 scratch, head_dim] per layer; on the CPU torch.zeros
        pages in lazily, so a generous max_slots costs memory only when used."""
        s = self.shape
        cache_shape = (self.max_slots, s.kv_heads, self.max_context + 1, s.head_dim)
        self.k_cache = [torch.zeros(cache_shape, dtype=self.dtype, device=self.device) for _ in range(s.layers)]
        self.v_cache = [torch.zeros(cache_shape, dtype=self.dtype, device=self.device) for _ in range(s.layers)]

    # -- placement (a model drafter parked in host memory and brought back to its GPU) -----------
    def to(self, device: str | torch.device, *, cache: bool = True) -> "TorchLlama":
        """Move weights and RoPE tables to `device` (tied weights stay one tensor). cache=True moves
        the KV cache too (or allocates a zeroed one there if it was freed); cache=False frees it and
        forgets its contents (a parked drafter keeps no sequence). Returns self."""
        dev = torch.device(device)
        shared = {}

        def move(t):
            if t is None:
                return None
            moved = shared.get(t.data_ptr())
            if moved is None:
                moved = shared[t.data_ptr()] = t.to(dev)
            return moved

        self.embed, self.final_norm, self.cos, self.sin = (move(t) for t in (self.embed, self.final_norm,
                                                                             self.cos, self.sin))
        self.draft_vocab = move(self.draft_vocab)
        self.lm_head.to(dev, shared)
        for L in self.layers:
            L.attn_norm, L.mlp_norm = move(L.attn_norm), move(L.mlp_norm)
            for lin in (L.wqkv, L.wo, L.w_gate_up, L.w_down):
                lin.to(dev, shared)
        self.device = dev
        if not cache:
            self.k_cache = self.v_cache = []
        elif self.k_cache:
            self.k_cache, self.v_cache = [t.to(dev) for t in self.k_cache], [t.to(dev) for t in self.v_cache]
        else:
            self._alloc_cache()
        return self

    # -- the engine contract's metadata (backend/engines/contract.py) ----------------
    supports_hidden = True  # forward(return_hidden=True) gives the final-normed hidden states

    @property
    def name(self) -> str:
        if self.dtype != torch.bfloat16:
            return "torch/fp32"
        return "torch/bf16" if self.batch_invariant else "torch/bf16-variant"  # other logits, other costs

    @property
    def kv_bytes_per_token(self) -> int:
        s = self.shape
        return 2 * s.layers * s.kv_heads * s.head_dim * torch.empty(0, dtype=self.dtype).element_size()

    @property
    def kv_capacity_tokens(self) -> int:
        """Every slot is preallocated to max_context positions (plus one scratch position
        per slot that padding writes to, not counted here)."""
        return self.max_slots * self.max_context

    # -- forward ---------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, slots: Sequence[int], starts: Sequence[int], tokens: Sequence[Sequence[int]],
                logit_rows: Sequence[Sequence[int]] | None = None, return_hidden: bool = False,
                embeds: Sequence[torch.Tensor] | None = None):
        """Append `tokens[b]` to slot `slots[b]` at positions starts[b].. and return logits.

        logit_rows[b] lists which of sequence b's new positions need logits
        (default: all). Returns float32 logits [sum of len(logit_rows[b]), vocab],
        rows in batch order; with `return_hidden`, (logits, features): features are the
        final-normed hidden states (what the head reads; a feature drafter's input) of
        every new position, [sum of len(tokens[b]), hidden] in batch order. `embeds[b]`
        ([len(tokens[b]), hidden]), when given, replaces the token embeddings (a feature
        drafter's inputs); `tokens` then only sets the lengths. `embeds`, and a head over a
        drafter's draft vocabulary, are this engine's extensions for model drafters; the rest
        is the engine contract (backend/engines/contract.py), whose limits raise ValueError
        before anything is written.
        """
        s = self.shape
        B = len(slots)
        lens = [len(t) for t in tokens]
        check_forward_args(self, slots, starts, tokens if embeds is None else None, logit_rows, lens=lens)
        S = max(lens)
        ids = torch.zeros(B, S, dtype=torch.long)
        pos = torch.empty(B, S, dtype=torch.long)
        valid = torch.zeros(B, S, dtype=torch.bool)
        for b in range(B):
            ids[b, : lens[b]] = torch.tensor(tokens[b], dtype=torch.long)
            valid[b, : lens[b]] = True
            pos[b] = torch.arange(starts[b], starts[b] + S)
        dev = self.device
        if dev.type != "cpu":  # built here, used where the weights are (a GPU drafter)
            ids, pos, valid = ids.to(dev), pos.to(dev), valid.to(dev)
        rope_pos = pos.clamp(max=self.max_context)
        write_pos = torch.where(valid, pos, torch.full_like(pos, self.max_context))  # padding -> scratch
        slot_t = torch.tensor(slots, dtype=torch.long, device=dev)
        ctx_len = max(st + n for st, n in zip(starts, lens))
        g = s.heads // s.kv_heads
        if self.batch_invariant:  # whole key blocks: see _attend_invariant
            ctx_len = min(-(-ctx_len // self.KV_TILE) * self.KV_TILE, self.max_context + 1)
        # Flat cache row for (slot, kv_head, position): [B, kv_heads, S]
        C = self.max_context + 1
        heads_t = torch.arange(s.kv_heads, device=dev).view(1, -1, 1)
        flat_idx = ((slot_t.view(-1, 1, 1) * s.kv_heads + heads_t) * C + write_pos.unsqueeze(1)).reshape(-1)
        # Causal mask over the cache prefix: query at position p sees keys 0..p.  [B, 1, S, ctx_len]
        mask = torch.arange(ctx_len, device=dev).view(1, 1, 1, -1) <= pos.view(B, 1, S, 1)
        if self.batch_invariant:  # per token: [B, S, 1, g, ctx_len]
            mask = mask.view(B, S, 1, 1, ctx_len).expand(B, S, 1, g, ctx_len)
        elif g > 1:
            mask = mask.expand(B, 1, S, ctx_len).repeat(1, 1, g, 1)  # [B, 1, g*S, ctx_len]
        cos, sin = self.cos[rope_pos].unsqueeze(2), self.sin[rope_pos].unsqueeze(2)  # [B, S, 1, hd]
        contiguous = list(slots) == list(range(slots[0], slots[0] + B))

        if embeds is None:
            x = self.embed[ids]  # [B, S, H]
        else:
            x = self.embed.new_zeros(B, S, s.hidden)
            for b in range(B):
                x[b, : lens[b]] = embeds[b]
        qd, kd = s.heads * s.head_dim, s.kv_heads * s.head_dim
        for i, L in enumerate(self.layers):
            h = F.rms_norm(x, (s.hidden,), L.attn_norm, s.rms_eps)
            qkv = L.wqkv(h)  # [B, S, qd + 2kd]
            q = qkv[..., :qd].view(B, S, s.heads, s.head_dim)
            k = qkv[..., qd: qd + kd].view(B, S, s.kv_heads, s.head_dim)
            v = qkv[..., qd + kd:].view(B, S, s.kv_heads, s.head_dim)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kc, vc = self.k_cache[i], self.v_cache[i]
            kc.view(-1, s.head_dim).index_copy_(0, flat_idx, k.transpose(1, 2).reshape(-1, s.head_dim))
            vc.view(-1, s.head_dim).index_copy_(0, flat_idx, v.transpose(1, 2).reshape(-1, s.head_dim))
            if self.batch_invariant:
                o = self._attend_invariant(q, kc, vc, slots, lens, mask)
            else:
                if contiguous:
                    keys, values = kc[slots[0]: slots[0] + B, :, :ctx_len], vc[slots[0]: slots[0] + B, :, :ctx_len]
                else:
                    keys, values = kc[slot_t, :, :ctx_len], vc[slot_t, :, :ctx_len]
                # Fold the g query heads of each kv head into the query axis: [B, kvh, g*S, hd]
                qg = q.view(B, S, s.kv_heads, g, s.head_dim).permute(0, 2, 3, 1, 4).reshape(B, s.kv_heads, g * S, s.head_dim)
                o = F.scaled_dot_product_attention(qg, keys, values, attn_mask=mask)
                o = o.view(B, s.kv_heads, g, S, s.head_dim).permute(0, 3, 1, 2, 4).reshape(B, S, qd)
            x = x + L.wo(o)
            h = F.rms_norm(x, (s.hidden,), L.mlp_norm, s.rms_eps)
            gu = L.w_gate_up(h)
            x = x + L.w_down(F.silu(gu[..., : s.intermediate]) * gu[..., s.intermediate:])
        if return_hidden:
            x = F.rms_norm(x, (s.hidden,), self.final_norm, s.rms_eps)
        if logit_rows is None:
            rows = x[valid]
        else:
            bi = [b for b in range(B) for _ in logit_rows[b]]
            si = [r for b in range(B) for r in logit_rows[b]]
            rows = x[bi, si]
        if not return_hidden:
            rows = F.rms_norm(rows, (s.hidden,), self.final_norm, s.rms_eps)
        logits = self.lm_head(rows).float()
        return (logits, x[valid]) if return_hidden else logits

    def _attend_invariant(self, q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, slots: Sequence[int],
                          lens: Sequence[int], mask: torch.Tensor) -> torch.Tensor:
        """Batch-invariant attention of q [B, S, heads, hd] over the cache of `slots`, under
        `mask` [B, S, 1, g, ctx] (ctx a multiple of KV_TILE, or the whole cache); [B, S, heads*hd].

        The CPU flash kernel cuts a batch entry's query rows into blocks of 32 (64/256 from
        192/768 rows) and its keys into blocks of 512 (the last one shorter), and MKL's bf16
        gemm inside sums differently for different block shapes. Measured: a query's output
        moves with the number of queries beside it (S, folded heads), and, for ~1 row in 1000,
        with the key count even in whole 32- or 64-key tiles. So here every block has one
        shape: each token is its own batch entry (its g query heads of one kv head are the
        g rows of the only query block), and the key count is a multiple of 512 (or the whole
        cache, which every row near its end gets too): a row's keys always sit in full
        512-key blocks, keys past its position are masked to exact zeros, and blocks wholly
        past it add exactly nothing. A sequence's tokens share its keys by a stride-0 view.
        """
        B, S, heads, hd = q.shape
        kvh, ctx = kc.shape[1], mask.shape[-1]
        g = heads // kvh
        q = q.view(B, S, kvh, g, hd)
        if S == 1:  # decoding: one entry per sequence, one call
            if list(slots) == list(range(slots[0], slots[0] + B)):  # a view, no copy
                keys, values = kc[slots[0]: slots[0] + B, :, :ctx], vc[slots[0]: slots[0] + B, :, :ctx]
            else:
                idx = torch.tensor(slots, dtype=torch.long, device=kc.device)
                keys, values = kc[idx, :, :ctx], vc[idx, :, :ctx]
            o = F.scaled_dot_product_attention(q[:, 0], keys, values, attn_mask=mask[:, 0])
            return o.reshape(B, 1, heads * hd)
        out = q.new_zeros(B, S, kvh, g, hd)  # a sequence's padding tokens keep zeros (their rows are dropped)
        for b, (slot, n) in enumerate(zip(slots, lens)):
            keys = kc[slot, :, :ctx].expand(n, kvh, ctx, hd)
            values = vc[slot, :, :ctx].expand(n, kvh, ctx, hd)
            out[b, :n] = F.scaled_dot_product_attention(q[b, :n], keys, values, attn_mask=mask[b, :n])
        return out.view(B, S, heads * hd)

    # -- cache management ------------------------------------------------------
    def truncate(self, slot: int, length: int) -> None:
        """Forget the slot's positions >= length: nothing to do here, because the cached
        length is the caller's number and a forward at start s overwrites positions >= s
        (attention only reads positions < s + new tokens). Checks its arguments only."""
        check_slot(self, slot)
        if not 0 <= length <= self.max_context:
            raise ValueError(f"truncate length {length} is outside [0, {self.max_context}]")

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` cached positions of slot src into slot dst. The contract
        calls src empty afterwards; here its tensors keep their values, unread until a
        forward at start 0 overwrites them."""
        check_slot(self, src, "source slot")
        check_slot(self, dst, "destination slot")
        if src == dst:
            raise ValueError(f"move_slot from slot {src} to itself")
        if not 0 <= length <= self.max_context:
            raise ValueError(f"move_slot length {length} is outside [0, {self.max_context}]")
        for kc, vc in zip(self.k_cache, self.v_cache):
            kc[dst, :, :length] = kc[src, :, :length]
            vc[dst, :, :length] = vc[src, :, :length]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)
