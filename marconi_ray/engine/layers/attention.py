"""GQA self-attention, heads split across ranks, with or without RoPE."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from marconi_ray.engine.kv_buffer import KVBuffer
from marconi_ray.engine.layers.linear import column, row
from marconi_ray.engine.layers.rope import Rope
from marconi_ray.engine.layers.weights import WeightSpec
from marconi_ray.engine.model_config import AttentionConfig
from marconi_ray.engine.parallel import Segment, TPGroup


class Attention(nn.Module):
    """q/k/v column-parallel by heads (n_heads/world and n_kv_heads/world per rank),
    o row-parallel (one all-reduce). Scores are scaled by head_dim**-0.5.

    `prefix` is the HF sub-module name (`mixer` for NemotronH, `self_attn` for Bamba).
    """

    def __init__(
        self, d_model: int, cfg: AttentionConfig, prefix: str, tp: TPGroup, dtype: torch.dtype
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_heads = tp.local(cfg.n_heads)
        self.n_kv = tp.local(cfg.n_kv_heads)
        hd = cfg.head_dim
        q, kv = (Segment(cfg.n_heads * hd),), (Segment(cfg.n_kv_heads * hd),)
        self.q = column(d_model, q, cfg.bias, f"{prefix}.q_proj", tp, dtype)
        self.k = column(d_model, kv, cfg.bias, f"{prefix}.k_proj", tp, dtype)
        self.v = column(d_model, kv, cfg.bias, f"{prefix}.v_proj", tp, dtype)
        self.o = row(q, d_model, cfg.bias, f"{prefix}.o_proj", tp, dtype)
        self.rope: Rope | None = None
        self.dtype = dtype

    def _rope(self, device: torch.device) -> Rope | None:
        if self.cfg.rotary_dim and self.rope is None:
            self.rope = Rope(self.cfg.rotary_dim, self.cfg.rope_theta, device)
        return self.rope

    def _qkv(
        self, x: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [L, D] -> q [H, L, hd], k, v [KV, L, hd] with RoPE applied."""
        hd = self.cfg.head_dim
        q = self.q(x).view(-1, self.n_heads, hd).transpose(0, 1)
        k = self.k(x).view(-1, self.n_kv, hd).transpose(0, 1)
        v = self.v(x).view(-1, self.n_kv, hd).transpose(0, 1)
        rope = self._rope(x.device)
        if rope is not None:
            q, k = rope.apply(q, positions), rope.apply(k, positions)
        return q, k, v

    def empty_cache(self, device: torch.device) -> KVBuffer:
        return KVBuffer.empty(self.n_kv, self.cfg.head_dim, self.dtype, device)

    def prefill(self, x: torch.Tensor, positions: torch.Tensor, kv: KVBuffer) -> torch.Tensor:
        """x [L, D] at absolute `positions` [L]; appends to `kv`; returns [L, D]."""
        q, k, v = self._qkv(x, positions)
        kv.append(k, v)
        keys, values = kv.view()
        n_q, n_k = q.shape[1], keys.shape[1]
        mask = None
        if n_k != n_q:
            offset = n_k - n_q
            cols = torch.arange(n_k, device=x.device)
            rows = torch.arange(n_q, device=x.device)
            mask = cols[None, :] <= rows[:, None] + offset
        out = F.scaled_dot_product_attention(
            q[None],
            keys[None],
            values[None],
            attn_mask=mask,
            is_causal=mask is None,
            enable_gqa=self.n_heads != self.n_kv,
        )
        return self.o(out[0].transpose(0, 1).reshape(n_q, -1))

    def decode(
        self, x: torch.Tensor, positions: torch.Tensor, kvs: Sequence[KVBuffer]
    ) -> torch.Tensor:
        """One new token per sequence: x [B, D], positions [B]; appends to each `kvs[b]`."""
        q, k, v = self._qkv(x, positions)
        outs = []
        for b, kv in enumerate(kvs):
            kv.append(k[:, b : b + 1], v[:, b : b + 1])
            keys, values = kv.view()
            o = F.scaled_dot_product_attention(
                q[None, :, b : b + 1],
                keys[None],
                values[None],
                enable_gqa=self.n_heads != self.n_kv,
            )
            outs.append(o[0, :, 0])
        return self.o(torch.stack(outs).reshape(len(kvs), -1))

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        for name in ("q", "k", "v", "o"):
            mod = getattr(self, name)
            out.update({f"{name}.{k}": s for k, s in mod.weight_specs().items()})
        return out
