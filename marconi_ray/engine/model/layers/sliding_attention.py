"""Sliding-window attention: `Attention` whose every query sees only the last `window`
positions, itself included (key k visible from query p when p - window < k <= p, as
transformers' `sliding_window` masks it).

Decode and packed prefills pass the window to the kernel set's paged attention kernels;
one sequence's prefill runs SDPA with a windowed mask over the last window + L keys only
(on a pool it reads only the last `window` past rows). Served, a windowed block keeps its
KV in a pool of its own (`paged_kv.SplitPools`) whose rows the window has left are freed
(`engine.window_rows`): nothing here reads them.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from marconi_ray.engine.model.layers.attention import Attention, PrefillKV
from marconi_ray.engine.model.layers.linear import row
from marconi_ray.engine.model.model_config import SlidingAttentionConfig
from marconi_ray.engine.model.paged_kv import DecodeKV, PackedPrefill, PagedPrefill
from marconi_ray.engine.model.parallel import Segment, TPGroup


def windowed_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, scale: float | None
) -> torch.Tensor:
    """Causal attention of the last Lq of Lk positions, each query over its last `window`
    positions. q [H, Lq, hd]; k, v [KV, Lk, hd] (Lq <= Lk, H % KV == 0); query i sits at
    position Lk - Lq + i. Returns [H, Lq, hd]. Keys before the first query's window are
    not read."""
    n_q, n_k = q.shape[1], k.shape[1]
    first = max(0, n_k - n_q - window + 1)
    k, v = k[:, first:], v[:, first:]
    position = torch.arange(n_k - n_q, n_k, device=q.device)[:, None]
    key = torch.arange(first, n_k, device=q.device)[None, :]
    mask = (key <= position) & (key > position - window)
    out = sdpa(
        q[None], k[None], v[None], attn_mask=mask, enable_gqa=q.shape[0] != k.shape[0], scale=scale
    )
    return out[0]


class SlidingWindowAttention(Attention):
    """`Attention` (heads split across ranks alike) over a window of `cfg.window`
    positions; o_proj has a bias when `cfg.output_bias` (RecurrentGemma: q/k/v without)."""

    def __init__(
        self,
        d_model: int,
        cfg: SlidingAttentionConfig,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        eps: float = 1e-6,
        unit_offset_norms: bool = False,
    ) -> None:
        super().__init__(d_model, cfg.attention, prefix, tp, dtype, eps, unit_offset_norms)
        self.window = cfg.window
        attn = cfg.attention
        if cfg.output_bias and not attn.bias:
            q = (Segment(attn.n_heads * attn.head_dim),)
            self.o = row(q, d_model, True, f"{prefix}.o_proj", tp, dtype, True, attn.output_scale)

    def prefill(self, x: torch.Tensor, positions: torch.Tensor, kv: PrefillKV) -> torch.Tensor:
        """x [L, D] at absolute `positions` [L]; extends `kv` (every row kept); returns
        [L, D]."""
        q, k, v, gate = self._qkv(x, positions)
        if isinstance(kv, PackedPrefill):
            return self._out(kv.attend(q, k, v, self.cfg.scale, window=self.window), gate)
        if isinstance(kv, PagedPrefill) and len(kv.past) > self.window:
            kv = dataclasses.replace(kv, past=kv.past[len(kv.past) - self.window :])
        keys, values = kv.extend(k, v)
        out = windowed_attention(q, keys, values, self.window, self.cfg.scale)
        return self._out(out.transpose(0, 1).reshape(x.shape[0], -1), gate)

    def decode(self, x: torch.Tensor, positions: torch.Tensor, kv: DecodeKV) -> torch.Tensor:
        """One new token per sequence: x [B, D], positions [B]; attends over each
        sequence's last `window` positions."""
        q, k, v, gate = self._qkv(x, positions)
        return self._out(kv.attend(q, k, v, self.cfg.scale, window=self.window), gate)
