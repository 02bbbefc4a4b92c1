"""Multi-head latent attention (MLA, Kimi Linear's NoPE variant) on the engine's KV pool,
heads split across ranks.

What a token caches is its normed latent c [kv_lora_rank] and the key part shared by every
head, k_rope [qk_rope_head_dim]: the row [c | k_rope] of `cache_width` values, never the
expanded per-head keys and values. The KV pool holds two tensors per attention block, k
and v, of one "head" each; an MLA block stores the first half of the row in k and the
second half in v (`kv_shape`: (1, cache_width / 2)), so one pool row is exactly the
cached row and the cost model prices exactly those values per token.

A prefill expands the rows it attends over with `kv_b_proj` (per head k_nope and v) and
attends causally with SDPA. A decode step multiplies each query into the latent instead:
with kv_b_proj's per-head blocks W_uk [dn, r] and W_uv [dv, r], a score is
q_nope . (W_uk c) + q_rope . k_rope = (W_uk^T q_nope) . c + q_rope . k_rope, so the query
[W_uk^T q_nope | q_rope] attends over the cached rows themselves, and the output
W_uv (sum_j p_j c_j) is the value expansion applied once to the attention-weighted latent.

Ling's variant (`MLAConfig.rope_theta`, `head_gate`): q_rope and k_rope are rotated at
their positions (interleaved RoPE) before k_rope is cached, so a cached row never changes;
each head's output is scaled by sigmoid(g_proj(x))_h before o_proj.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn.functional import scaled_dot_product_attention as sdpa

from marconi_ray.core.model.hf.mla_arch import MLA_NORM_EPS
from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.layers.attention import PrefillKV, causal_attention
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.norm import RMSNorm
from marconi_ray.engine.model.layers.rope_interleaved import InterleavedRope
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import MLAConfig
from marconi_ray.engine.model.paged_kv import BufferDecode, DecodeKV, PackedPrefill, PagedDecode
from marconi_ray.engine.model.parallel import Segment, TPGroup


class MLAttention(nn.Module):
    """One MLA layer's shard: `q_proj` (or `q_a_proj` -> `q_a_layernorm` -> `q_b_proj`)
    and `kv_b_proj` column-parallel by heads, `kv_a_proj_with_mqa` and `kv_a_layernorm`
    replicated (every rank caches the whole row), `o_proj` row-parallel.

    `prefill(x, positions, kv)` and `decode(x, positions, kv)` have `Attention`'s
    signatures (positions are unused without `cfg.rope_theta`). `g_proj` (the per-head
    output gate, `cfg.head_gate`) is column-parallel by heads. ValueError when
    `cache_width` is odd (the row could not be split evenly over the pool's k and v)."""

    KERNEL_OPS: ClassVar[tuple[str, ...]] = ()
    """No kernel-set op: the attention over latents runs in torch."""

    def __init__(
        self,
        d_model: int,
        cfg: MLAConfig,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        if cfg.cache_width % 2:
            raise ValueError(
                f"kv_lora_rank + qk_rope_head_dim = {cfg.cache_width} must be even to split "
                "the cached row over the KV pool's k and v"
            )
        self.cfg = cfg
        self.dtype = dtype
        self.heads = tp.local(cfg.n_heads)
        self.n_kv = 1
        self.half_width = cfg.cache_width // 2
        qk, nv = cfg.qk_head_dim, cfg.qk_nope_head_dim + cfg.v_head_dim
        q_out = (Segment(cfg.n_heads * qk),)
        self.q_proj = self.q_a_proj = self.q_b_proj = None
        self.q_a_norm: RMSNorm | None = None
        if cfg.q_lora_rank is None:
            self.q_proj = column(d_model, q_out, False, f"{prefix}.q_proj", tp, dtype)
        else:
            rank = cfg.q_lora_rank
            self.q_a_proj = column(
                d_model, (Segment(rank, False),), cfg.bias, f"{prefix}.q_a_proj", tp, dtype
            )
            self.q_a_norm = RMSNorm(rank, MLA_NORM_EPS, f"{prefix}.q_a_layernorm.weight", dtype)
            self.q_b_proj = column(rank, q_out, False, f"{prefix}.q_b_proj", tp, dtype)
        self.kv_a_proj = column(
            d_model,
            (Segment(cfg.cache_width, False),),
            cfg.bias,
            f"{prefix}.kv_a_proj_with_mqa",
            tp,
            dtype,
        )
        self.kv_a_norm = RMSNorm(
            cfg.kv_lora_rank, MLA_NORM_EPS, f"{prefix}.kv_a_layernorm.weight", dtype
        )
        self.kv_b_proj = column(
            cfg.kv_lora_rank, (Segment(cfg.n_heads * nv),), False, f"{prefix}.kv_b_proj", tp, dtype
        )
        self.o_proj = row(
            (Segment(cfg.n_heads * cfg.v_head_dim),),
            d_model,
            cfg.bias,
            f"{prefix}.o_proj",
            tp,
            dtype,
        )
        self.g_proj = None
        if cfg.head_gate:
            self.g_proj = column(
                d_model, (Segment(cfg.n_heads),), False, f"{prefix}.g_proj", tp, dtype
            )
        self.rope = None
        if cfg.rope_theta is not None:
            self.rope = InterleavedRope(cfg.qk_rope_head_dim, cfg.rope_theta)

    @property
    def kv_shape(self) -> tuple[int, int]:
        """(heads, head_dim) of this block's pool tensors k and v: one half-row each."""
        return 1, self.half_width

    # ------------------------------------------------------------------ helpers
    def _queries(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [N, D] at positions [N] -> q [N, H', qk_head_dim] ([q_nope | q_rope] per
        head, q_rope rotated when the layer has RoPE)."""
        if self.q_proj is not None:
            q = self.q_proj(x)
        else:
            assert self.q_a_proj is not None and self.q_a_norm is not None
            assert self.q_b_proj is not None
            q = self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
        q = q.view(x.shape[0], self.heads, self.cfg.qk_head_dim)
        if self.rope is None:
            return q
        dn = self.cfg.qk_nope_head_dim
        return torch.cat([q[..., :dn], self.rope.apply(q[..., dn:], positions)], dim=-1)

    def _rows(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [N, D] at positions [N] -> the cached rows [N, cache_width]:
        [norm(latent) | k_rope] (k_rope rotated when the layer has RoPE)."""
        r = self.cfg.kv_lora_rank
        ckv = self.kv_a_proj(x)
        k_rope = ckv[:, r:]
        if self.rope is not None:
            k_rope = self.rope.apply(k_rope, positions)
        return torch.cat([self.kv_a_norm(ckv[:, :r]), k_rope], dim=-1)

    def _out(self, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """attn [N, H' * dv] (each head's output), the input x [N, D] -> o_proj of it,
        each head scaled by sigmoid(g_proj(x)) first when the layer has the gate; [N, D]."""
        if self.g_proj is not None:
            gate = torch.sigmoid(self.g_proj(x).float()).to(attn.dtype)
            attn = (attn.view(x.shape[0], self.heads, -1) * gate[..., None]).flatten(1)
        return self.o_proj(attn)

    def _halves(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows [N, w] -> the pool's k and v halves, [1, N, w/2] each."""
        return rows[None, :, : self.half_width], rows[None, :, self.half_width :]

    def _expand(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached rows [N, w] -> keys [H', N, qk_head_dim] and values [H', N, dv]."""
        c = self.cfg
        latent, k_rope = rows[:, : c.kv_lora_rank], rows[:, c.kv_lora_rank :]
        kv = self.kv_b_proj(latent).view(rows.shape[0], self.heads, -1).transpose(0, 1)
        k_nope, v = kv[..., : c.qk_nope_head_dim], kv[..., c.qk_nope_head_dim :]
        k = torch.cat([k_nope, k_rope[None].expand(self.heads, -1, -1)], dim=-1)
        return k, v

    def _attend_expanded(self, q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Queries q [L, H', qk] (the last L of the N positions) causally over the cached
        rows [N, w], expanded; returns [L, H' * dv]."""
        k, v = self._expand(rows)
        out = causal_attention(q.transpose(0, 1), k, v, self.cfg.scale)
        return out.transpose(0, 1).reshape(q.shape[0], -1)

    def empty_cache(self, device: torch.device) -> KVBuffer:
        return KVBuffer.empty(1, self.half_width, self.dtype, device)

    # ------------------------------------------------------------------ forward
    def prefill(self, x: torch.Tensor, positions: torch.Tensor, kv: PrefillKV) -> torch.Tensor:
        """x [L, D] (packed: every sequence's tokens in order); writes the new tokens'
        rows into `kv` and attends over each sequence's rows; returns [L, D]."""
        q, rows = self._queries(x, positions), self._rows(x, positions)
        a, b = self._halves(rows)
        if isinstance(kv, PackedPrefill):
            return self._out(self._packed(q, a, b, kv), x)
        ka, kb = kv.extend(a, b)
        return self._out(self._attend_expanded(q, torch.cat([ka[0], kb[0]], dim=-1)), x)

    def _packed(
        self, q: torch.Tensor, a: torch.Tensor, b: torch.Tensor, kv: PackedPrefill
    ) -> torch.Tensor:
        """Several sequences' packed queries q [T, H', qk] over their own pool rows, in one
        masked SDPA (as `paged_prefill_attention_ref` lays them out: queries padded to the
        longest part, every table row expanded); no host sync. Returns [T, H' * dv]."""
        r = kv.rows
        kv.k_pool.index_copy_(1, r.new, a.to(kv.k_pool.dtype))
        kv.v_pool.index_copy_(1, r.new, b.to(kv.v_pool.dtype))
        n_seq, width = r.table.shape
        total, dev = q.shape[0], q.device
        n_q = r.cu_q[1:] - r.cu_q[:-1]
        seq = torch.repeat_interleave(torch.arange(n_seq, device=dev), n_q, output_size=total)
        slot = torch.arange(total, device=dev) - r.cu_q[seq]
        padded = q.new_zeros(n_seq, r.max_q, self.heads, self.cfg.qk_head_dim)
        padded[seq, slot] = q
        cached = torch.cat([kv.k_pool[0][r.table], kv.v_pool[0][r.table]], dim=-1)
        k, v = self._expand(cached.to(q.dtype).reshape(n_seq * width, -1))
        k = k.view(self.heads, n_seq, width, -1).transpose(0, 1)
        v = v.view(self.heads, n_seq, width, -1).transpose(0, 1)
        position = (r.lens - n_q)[:, None] + torch.arange(r.max_q, device=dev)[None, :]
        mask = torch.arange(width, device=dev)[None, None, :] <= position[:, :, None]
        out = sdpa(padded.transpose(1, 2), k, v, attn_mask=mask[:, None], scale=self.cfg.scale)
        return out.transpose(1, 2)[seq, slot].reshape(total, -1)

    def decode(self, x: torch.Tensor, positions: torch.Tensor, kv: DecodeKV) -> torch.Tensor:
        """One new token per sequence, x [B, D]: its row joins `kv` and its query,
        multiplied into the latent, attends over each sequence's cached rows; [B, D]."""
        c = self.cfg
        q, rows = self._queries(x, positions), self._rows(x, positions)
        a, b = self._halves(rows)
        w_kv = self.kv_b_proj.weight.view(self.heads, -1, c.kv_lora_rank)
        w_uk, w_uv = w_kv[:, : c.qk_nope_head_dim], w_kv[:, c.qk_nope_head_dim :]
        q_lat = torch.einsum("bhn,hnr->bhr", q[..., : c.qk_nope_head_dim], w_uk)
        q_full = torch.cat([q_lat, q[..., c.qk_nope_head_dim :]], dim=-1)  # [B, H', w]
        cached, valid = self._decode_rows(a, b, kv)  # [B, W, w], [B, W]
        scores = torch.einsum("bhw,bnw->bhn", q_full, cached.to(q.dtype)) * c.scale
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        latent = torch.einsum("bhn,bnr->bhr", p, cached[..., : c.kv_lora_rank].to(q.dtype))
        out = torch.einsum("bhr,hvr->bhv", latent, w_uv)
        return self._out(out.reshape(x.shape[0], -1), x)

    @staticmethod
    def _decode_rows(
        a: torch.Tensor, b: torch.Tensor, kv: DecodeKV
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the step's half-rows a, b [1, B, w/2] and return every sequence's cached
        rows [B, W, w] (padded to the longest) with a mask [B, W] of the valid ones."""
        if isinstance(kv, PagedDecode):
            kv.k_pool.index_copy_(1, kv.new, a.to(kv.k_pool.dtype))
            kv.v_pool.index_copy_(1, kv.new, b.to(kv.v_pool.dtype))
            cached = torch.cat([kv.k_pool[0][kv.table], kv.v_pool[0][kv.table]], dim=-1)
            width = kv.table.shape[1]
            valid = torch.arange(width, device=a.device)[None, :] < kv.lens[:, None]
            return cached, valid
        if isinstance(kv, BufferDecode):
            seqs = []
            for i, buf in enumerate(kv.kvs):
                buf.append(a[:, i : i + 1], b[:, i : i + 1])
                ka, kb = buf.view()
                seqs.append(torch.cat([ka[0], kb[0]], dim=-1))
            lens = torch.tensor([len(s) for s in seqs], device=a.device)
            cached = nn.utils.rnn.pad_sequence(seqs, batch_first=True)
            valid = torch.arange(cached.shape[1], device=a.device)[None, :] < lens[:, None]
            return cached, valid
        raise TypeError(f"MLA decode cannot read KV from {type(kv).__name__}")

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        names = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj", "o_proj", "g_proj")
        for name in names:
            mod = getattr(self, name)
            if mod is not None:
                out.update({f"{name}.{k}": s for k, s in mod.weight_specs().items()})
        for name, norm in (("q_a_norm", self.q_a_norm), ("kv_a_norm", self.kv_a_norm)):
            if norm is not None:
                out[f"{name}.weight"] = WeightSpec(norm.key)
        return out
