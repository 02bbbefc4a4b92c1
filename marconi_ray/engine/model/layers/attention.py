"""GQA self-attention, heads split across ranks, with or without RoPE, optionally with
q/k norms and a sigmoid output gate (Qwen3.5, Qwen3-Next)."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn.attention.bias import causal_lower_right
from torch.nn.functional import scaled_dot_product_attention as sdpa

from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.layers.linear import ParallelLinear, column, row
from marconi_ray.engine.model.layers.norm import RMSNorm, ShardedRMSNorm
from marconi_ray.engine.model.layers.rope import Rope
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import AttentionConfig
from marconi_ray.engine.model.paged_kv import DecodeKV, PackedPrefill, PagedPrefill
from marconi_ray.engine.model.parallel import Segment, TPGroup

PrefillKV = KVBuffer | PagedPrefill | PackedPrefill
"""Where one attention layer's prefill keeps its KV: one sequence's buffer or pool rows,
or the pool rows of several sequences packed into one forward."""


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None
) -> torch.Tensor:
    """Causal attention of the last Lq of Lk positions, without an O(Lq x Lk) mask.

    q [H, Lq, hd]; k, v [KV, Lk, hd] with Lq <= Lk and H % KV == 0. Query i sits at
    position Lk - Lq + i (a prefill resumed after Lk - Lq cached tokens). Scores are
    scaled by `scale` (None: hd**-0.5). Returns [H, Lq, hd]. A fresh prefill (Lq == Lk)
    is SDPA's own causal case; a resumed one uses the lower-right causal bias, which runs
    on flash / memory-efficient kernels on GPU where an explicit boolean mask would fall
    back to the math kernel and materialise Lq x Lk scores. Those kernels take equal head
    counts, so grouped KV heads are expanded for that case only.
    """
    n_q, n_k = q.shape[1], k.shape[1]
    gqa = q.shape[0] != k.shape[0]
    if n_q == n_k or n_q == 1:
        out = sdpa(q[None], k[None], v[None], is_causal=n_q > 1, enable_gqa=gqa, scale=scale)
        return out[0]
    if gqa:
        group = q.shape[0] // k.shape[0]
        k, v = k.repeat_interleave(group, dim=0), v.repeat_interleave(group, dim=0)
    out = sdpa(q[None], k[None], v[None], attn_mask=causal_lower_right(n_q, n_k), scale=scale)
    return out[0]


def prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv: PrefillKV, scale: float | None
) -> torch.Tensor:
    """Store a prefill's k, v [KV, L, hd] in `kv` and attend q [H, L, hd] causally over
    what it holds; returns [L, H * hd]. A packed `kv` is one kernel call for all its
    sequences (their L tokens packed); the others attend one sequence with SDPA."""
    if isinstance(kv, PackedPrefill):
        return kv.attend(q, k, v, scale)
    keys, values = kv.extend(k, v)
    out = causal_attention(q, keys, values, scale)
    return out.transpose(0, 1).reshape(q.shape[1], -1)


class Attention(nn.Module):
    """q/k/v column-parallel by heads (n_heads/world and n_kv_heads/world per rank),
    o row-parallel (one all-reduce; with `reduce=False` the caller all-reduces, see
    `ParallelLinear`). Scores are scaled by `cfg.scale` (None: head_dim**-0.5).
    `cfg.input_scale` and `cfg.output_scale` are folded into the q/k/v and o weights.

    With `cfg.output_gate` q_proj emits, per head, head_dim query channels then head_dim
    gate channels (so a rank's slice holds whole heads of both); the attention output is
    multiplied by sigmoid(gate) before o. With `cfg.qk_norm` each q and k head is
    RMS-normed over head_dim (scale 1 + w when `unit_offset_norms`) before RoPE; with
    `cfg.qk_norm_whole` the whole q and the whole k projection are (OLMo Hybrid: the
    sums of squares all-reduced across ranks, see `ShardedRMSNorm`). With `cfg.head_gate`
    a column-parallel `g_proj` (D -> n_heads, a rank's slice its own heads) gives one gate
    per head; each head's output is multiplied by sigmoid(g) before o (LFM3).

    `prefix` is the HF sub-module name (`mixer` for NemotronH, `self_attn` for the rest).

    A pooled decode step runs the kernel set's `paged_decode_attention` (one call for the
    batch, see `paged_kv`); a pooled prefill of several sequences its
    `paged_prefill_attention` (one call for all of them); one sequence's prefill runs
    torch's SDPA.
    """

    KERNEL_OPS: ClassVar[tuple[str, ...]] = ("paged_decode_attention", "paged_prefill_attention")

    def __init__(
        self,
        d_model: int,
        cfg: AttentionConfig,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        eps: float = 1e-6,
        unit_offset_norms: bool = False,
        reduce: bool = True,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_heads = tp.local(cfg.n_heads)
        self.n_kv = tp.local(cfg.n_kv_heads)
        hd = cfg.head_dim
        q, kv = (Segment(cfg.n_heads * hd),), (Segment(cfg.n_kv_heads * hd),)
        q_out = (Segment(cfg.n_heads * hd * 2),) if cfg.output_gate else q
        scale = cfg.input_scale
        self.q = column(d_model, q_out, cfg.bias, f"{prefix}.q_proj", tp, dtype, scale)
        self.k = column(d_model, kv, cfg.bias, f"{prefix}.k_proj", tp, dtype, scale)
        self.v = column(d_model, kv, cfg.bias, f"{prefix}.v_proj", tp, dtype, scale)
        self.o = row(q, d_model, cfg.bias, f"{prefix}.o_proj", tp, dtype, reduce, cfg.output_scale)
        self.q_norm = self.k_norm = None
        self.q_whole = self.k_whole = None
        if cfg.qk_norm and cfg.qk_norm_whole:
            self.q_whole = ShardedRMSNorm(
                cfg.n_heads * hd, eps, f"{prefix}.q_norm.weight", tp, dtype
            )
            self.k_whole = ShardedRMSNorm(
                cfg.n_kv_heads * hd, eps, f"{prefix}.k_norm.weight", tp, dtype
            )
        elif cfg.qk_norm:
            off = unit_offset_norms
            self.q_norm = RMSNorm(hd, eps, f"{prefix}.q_norm.weight", dtype, off)
            self.k_norm = RMSNorm(hd, eps, f"{prefix}.k_norm.weight", dtype, off)
        self.g: ParallelLinear | None = None
        if cfg.head_gate:
            self.g = column(d_model, (Segment(cfg.n_heads),), False, f"{prefix}.g_proj", tp, dtype)
        self.rope: Rope | None = None
        self.dtype = dtype

    def _rope(self, device: torch.device) -> Rope | None:
        cfg = self.cfg
        if cfg.rotary_dim and self.rope is None:
            if cfg.rope_type == "proportional":
                self.rope = Rope.proportional(cfg.rotary_dim, cfg.head_dim, cfg.rope_theta, device)
            else:
                self.rope = Rope(cfg.rotary_dim, cfg.rope_theta, device)
        return self.rope

    def _qkv(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x [L, D] -> q [H, L, hd], k, v [KV, L, hd] (q/k normed, RoPE applied) and the
        output gate [L, H*hd] (None without one)."""
        hd = self.cfg.head_dim
        gate = None
        if self.cfg.output_gate:
            qg = self.q(x).view(-1, self.n_heads, 2 * hd)
            q, g = qg[..., :hd], qg[..., hd:]
            gate = g.reshape(x.shape[0], -1)
        elif self.q_whole is not None:
            q = self.q_whole(self.q(x)).view(-1, self.n_heads, hd)
        else:
            q = self.q(x).view(-1, self.n_heads, hd)
        if self.g is not None:
            per_head = self.g(x)[:, :, None].expand(-1, self.n_heads, hd)
            gate = per_head.reshape(x.shape[0], -1)
        k = self.k(x)
        k = (k if self.k_whole is None else self.k_whole(k)).view(-1, self.n_kv, hd)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(0, 1), k.transpose(0, 1)
        v = self.v(x).view(-1, self.n_kv, hd).transpose(0, 1)
        rope = self._rope(x.device)
        if rope is not None:
            q, k = rope.apply(q, positions), rope.apply(k, positions)
        return q, k, v, gate

    def _out(self, attn: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        """attn [L, H*hd] (gated when the layer has an output gate) -> o -> [L, D]."""
        if gate is not None:
            attn = attn * torch.sigmoid(gate)
        return self.o(attn)

    def empty_cache(self, device: torch.device) -> KVBuffer:
        return KVBuffer.empty(self.n_kv, self.cfg.head_dim, self.dtype, device)

    def prefill(self, x: torch.Tensor, positions: torch.Tensor, kv: PrefillKV) -> torch.Tensor:
        """x [L, D] at absolute `positions` [L] (packed: every sequence's tokens in
        order); extends `kv`; returns [L, D]."""
        q, k, v, gate = self._qkv(x, positions)
        return self._out(prefill_attention(q, k, v, kv, self.cfg.scale), gate)

    def decode(self, x: torch.Tensor, positions: torch.Tensor, kv: DecodeKV) -> torch.Tensor:
        """One new token per sequence: x [B, D], positions [B]; `kv` stores the step's
        keys and values and attends over each sequence's (see `paged_kv`)."""
        q, k, v, gate = self._qkv(x, positions)
        return self._out(kv.attend(q, k, v, self.cfg.scale), gate)

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        for name in ("q", "k", "v", "o", "g"):
            mod = getattr(self, name)
            if mod is None:
                continue
            out.update({f"{name}.{k}": s for k, s in mod.weight_specs().items()})
        for name, norm in (("q_norm", self.q_norm), ("k_norm", self.k_norm)):
            if norm is not None:
                out[f"{name}.weight"] = WeightSpec(norm.key)
        for name, whole in (("q_whole", self.q_whole), ("k_whole", self.k_whole)):
            if whole is not None:
                out[f"{name}.weight"] = whole.weight_specs()["weight"]
        return out
