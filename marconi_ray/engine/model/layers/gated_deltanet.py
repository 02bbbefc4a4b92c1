"""Gated DeltaNet mixer (Qwen3.5, Qwen3-Next, OLMo Hybrid): input projections -> causal conv1d over
(q, k, v) -> gated delta rule -> per-head gated RMSNorm -> out_proj, split across ranks by
key heads (each rank keeps whole groups of a key head and the value heads it serves).

The delta rule per value head h, token t (q and k L2-normalised, q scaled by dk**-0.5):
    S = exp(g_t) S;  S += k_t (x) beta_t (v_t - k_t^T S);  o_t = q_t^T S
with beta = beta_scale * sigmoid(b) (OLMo Hybrid: 2) and the log decay
g = -exp(A_log) * softplus(a + dt_bias).

States per sequence (this rank's shard):
- conv [conv_local, d_conv] in the model dtype (the last d_conv inputs of the conv),
- ssm [v_heads_local, head_k_dim, head_v_dim] in float32 (the delta rule's S).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from marconi_kernels import KernelSet
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.norm import HeadGatedRMSNorm
from marconi_ray.engine.model.layers.packed import (
    PackedMixer,
    PackedPart,
    PartStates,
    delta_rule_parts,
    packed_conv,
    part_states,
)
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import GatedDeltaNetConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup, local_size

MIN_CHUNK = 16
"""Shortest chunk a prefill uses (the Triton kernel's smallest tile)."""

Projected = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
"""(qkv [..., conv_local], z [..., Hv', dv], b [..., Hv'], a [..., Hv'])."""


class GatedDeltaNetMixer(PackedMixer, nn.Module):
    """One Gated DeltaNet layer's shard. `prefix` is the HF sub-module (`linear_attn`).

    Projection layouts (`cfg.fused_projection`):
    - Qwen3.5: `in_proj_qkv` rows [q (Hk*dk), k (Hk*dk), v (Hv*dv)], `in_proj_z`,
      `in_proj_b`, `in_proj_a`; each part is split by heads.
    - Qwen3-Next: `in_proj_qkvz` rows grouped by key head, [q, k, v, z] of each key head
      and its r = Hv/Hk value heads; `in_proj_ba` rows [b, a] per key head. A rank's slice
      of whole groups is rearranged into Qwen3.5's order locally.
    - OLMo Hybrid (`cfg.separate_projections`): `q_proj`, `k_proj`, `v_proj`, `g_proj` (the
      gate z), `b_proj`, `a_proj`, and `o_proj` for out_proj, each split by heads; the
      checkpoint keeps one conv per q, k and v (`q_conv1d`, ...).
    The conv runs over [q, k, v] with channels in Qwen3.5's order in both layouts.
    `prefill` (one sequence) is `prefill_packed` of one part.
    """

    KERNEL_OPS: ClassVar[tuple[str, ...]] = (
        "causal_conv1d",
        "causal_conv1d_update",
        "causal_conv1d_varlen",
        "gated_delta_chunk",
        "gated_delta_chunk_varlen",
        "gated_delta_step",
    )
    """The `KernelSet` ops this mixer calls (prefill and decode)."""

    def __init__(
        self,
        d_model: int,
        cfg: GatedDeltaNetConfig,
        eps: float,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.kernels = kernels
        self.prefix = prefix
        self.k_heads = tp.local(cfg.n_k_heads)
        self.v_heads = tp.local(cfg.n_v_heads)
        self.ratio = cfg.n_v_heads // cfg.n_k_heads
        self.key_local = self.k_heads * cfg.head_k_dim
        self.value_local = self.v_heads * cfg.head_v_dim
        self.conv_segments = (Segment(cfg.key_dim), Segment(cfg.key_dim), Segment(cfg.value_dim))
        self.conv_dim = local_size(self.conv_segments, tp)
        heads = Segment(cfg.n_v_heads)
        if cfg.separate_projections:
            key, value = (Segment(cfg.key_dim),), (Segment(cfg.value_dim),)
            self.q_proj = column(d_model, key, False, f"{prefix}.q_proj", tp, dtype)
            self.k_proj = column(d_model, key, False, f"{prefix}.k_proj", tp, dtype)
            self.v_proj = column(d_model, value, False, f"{prefix}.v_proj", tp, dtype)
            self.g_proj = column(d_model, value, False, f"{prefix}.g_proj", tp, dtype)
            self.b_proj = column(d_model, (heads,), False, f"{prefix}.b_proj", tp, dtype)
            self.a_proj = column(d_model, (heads,), False, f"{prefix}.a_proj", tp, dtype)
        elif cfg.fused_projection:
            group = 2 * cfg.head_k_dim + 2 * self.ratio * cfg.head_v_dim
            qkvz = (Segment(cfg.n_k_heads * group),)
            self.in_proj_qkvz = column(d_model, qkvz, False, f"{prefix}.in_proj_qkvz", tp, dtype)
            self.in_proj_ba = column(
                d_model, (Segment(2 * cfg.n_v_heads),), False, f"{prefix}.in_proj_ba", tp, dtype
            )
        else:
            self.in_proj_qkv = column(
                d_model, self.conv_segments, False, f"{prefix}.in_proj_qkv", tp, dtype
            )
            self.in_proj_z = column(
                d_model, (Segment(cfg.value_dim),), False, f"{prefix}.in_proj_z", tp, dtype
            )
            self.in_proj_b = column(d_model, (heads,), False, f"{prefix}.in_proj_b", tp, dtype)
            self.in_proj_a = column(d_model, (heads,), False, f"{prefix}.in_proj_a", tp, dtype)
        self.conv_weight = nn.Parameter(
            torch.empty(self.conv_dim, 1, cfg.d_conv, dtype=dtype), requires_grad=False
        )
        self.dt_bias = nn.Parameter(torch.ones(self.v_heads, dtype=dtype), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.v_heads, dtype=dtype), requires_grad=False)
        self.norm = HeadGatedRMSNorm(
            cfg.head_v_dim, eps if cfg.norm_eps is None else cfg.norm_eps, dtype
        )
        out_name = "o_proj" if cfg.separate_projections else "out_proj"
        self.out_proj = row(
            (Segment(cfg.value_dim),), d_model, False, f"{prefix}.{out_name}", tp, dtype
        )

    # ------------------------------------------------------------------ helpers
    def _project(self, x: torch.Tensor) -> Projected:
        """x [..., D] -> the conv input (q, k, v concatenated, Qwen3.5's channel order),
        the output gate z, and the pre-activation b and a, for this rank's heads."""
        lead = x.shape[:-1]
        c = self.cfg
        if c.separate_projections:
            qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
            z = self.g_proj(x).view(*lead, self.v_heads, c.head_v_dim)
            return qkv, z, self.b_proj(x), self.a_proj(x)
        if not c.fused_projection:
            qkv = self.in_proj_qkv(x)
            z = self.in_proj_z(x).view(*lead, self.v_heads, c.head_v_dim)
            return qkv, z, self.in_proj_b(x), self.in_proj_a(x)
        rv = self.ratio * c.head_v_dim
        groups = self.in_proj_qkvz(x).view(*lead, self.k_heads, -1)
        q, k, v, z = torch.split(groups, [c.head_k_dim, c.head_k_dim, rv, rv], dim=-1)
        qkv = torch.cat([q.reshape(*lead, -1), k.reshape(*lead, -1), v.reshape(*lead, -1)], dim=-1)
        ba = self.in_proj_ba(x).view(*lead, self.k_heads, 2 * self.ratio)
        b, a = torch.split(ba, [self.ratio, self.ratio], dim=-1)
        z = z.reshape(*lead, self.v_heads, c.head_v_dim)
        return qkv, z, b.reshape(*lead, self.v_heads), a.reshape(*lead, self.v_heads)

    def _heads(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv output [..., conv_local] -> q, k [..., Hv', dk] (each key head repeated for
        the value heads it serves) and v [..., Hv', dv]."""
        c = self.cfg
        q, k, v = torch.split(qkv, [self.key_local, self.key_local, self.value_local], dim=-1)
        lead = qkv.shape[:-1]
        q = q.reshape(*lead, self.k_heads, c.head_k_dim)
        k = k.reshape(*lead, self.k_heads, c.head_k_dim)
        if self.ratio > 1:
            q = q.repeat_interleave(self.ratio, dim=-2)
            k = k.repeat_interleave(self.ratio, dim=-2)
        return q, k, v.reshape(*lead, self.v_heads, c.head_v_dim)

    def _gates(self, b: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(log decay g [..., Hv'] in float32, write strength beta [..., Hv'] in b's dtype,
        as transformers computes them)."""
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias)
        beta = b.sigmoid()
        return g, beta if self.cfg.beta_scale == 1.0 else beta * self.cfg.beta_scale

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o, z [..., Hv', dv] -> out_proj(norm(o) * silu(z)) [..., D]."""
        y = self.norm(o, z)
        return self.out_proj(y.reshape(*y.shape[:-2], self.value_local))

    def _chunk(self, n: int) -> int:
        """The chunk length for an n-token prefill: `cfg.chunk_size`, or the power of two
        (at least `MIN_CHUNK`) that covers a shorter prefill, so a short turn does not pay
        for a padded full chunk (the result is the same up to rounding)."""
        fit = max(MIN_CHUNK, 1 << max(0, n - 1).bit_length())
        return min(self.cfg.chunk_size, fit)

    def empty_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv [conv_local, d_conv] and ssm [Hv', dk, dv] (float32) states."""
        conv = torch.zeros(
            self.conv_dim, self.cfg.d_conv, dtype=self.conv_weight.dtype, device=device
        )
        ssm = torch.zeros(
            self.v_heads,
            self.cfg.head_k_dim,
            self.cfg.head_v_dim,
            dtype=torch.float32,
            device=device,
        )
        return conv, ssm

    # ------------------------------------------------------------------ forward
    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        """Several sequences' new tokens x [T, d_model] (packed, see `packed`): the
        projections, gates, norm and out_proj once over all rows, the conv and the
        chunked delta rule once for all parts (`gated_delta_chunk_varlen`, each part
        from its own state). Returns y [T, d_model] and per part
        its final states (conv [C, K], ssm [Hv', dk, dv]) and those at its `emit_at`."""
        qkv, z, b, a = self._project(x)
        k = self.kernels
        mixed, convs = packed_conv(k, qkv, self.conv_weight[:, 0], None, parts, "silu")
        q, kk, v = self._heads(mixed)
        g, beta = self._gates(b, a)
        o, ssms = delta_rule_parts(
            k.gated_delta_chunk, k.gated_delta_chunk_varlen, (q, kk, v, g, beta), parts,
            self._chunk, lambda: self.empty_state(x.device)[1],
        )  # fmt: skip
        return self._output(o, z), part_states(convs, ssms)

    def decode(self, x: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """One token per sequence. x [B, d_model]; conv [B, C, K] and ssm [B, Hv', dk, dv]
        are updated in place. Returns [B, d_model]."""
        qkv, z, b, a = self._project(x)
        k = self.kernels
        mixed = k.causal_conv1d_update(qkv, conv, self.conv_weight[:, 0], None, activation="silu")
        q, kk, v = self._heads(mixed)
        g, beta = self._gates(b, a)
        o = k.gated_delta_step(ssm, q, kk, v, g, beta, use_qk_l2norm=True)
        return self._output(o, z)

    def weight_specs(self) -> dict[str, WeightSpec]:
        p = self.prefix
        if self.cfg.separate_projections:
            names: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "a_proj")
        elif self.cfg.fused_projection:
            names = ("in_proj_qkvz", "in_proj_ba")
        else:
            names = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a")
        out: dict[str, WeightSpec] = {}
        for name in (*names, "out_proj"):
            mod = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in mod.weight_specs().items()})
        if self.cfg.separate_projections:
            convs = tuple(f"{p}.{x}_conv1d.weight" for x in "qkv")
            out["conv_weight"] = WeightSpec(convs[0], 0, self.conv_segments, parts=convs)
        else:
            out["conv_weight"] = WeightSpec(f"{p}.conv1d.weight", 0, self.conv_segments)
        heads = (Segment(self.cfg.n_v_heads),)
        for name in ("dt_bias", "A_log"):
            out[name] = WeightSpec(f"{p}.{name}", 0, heads)
        norm = "o_norm" if self.cfg.separate_projections else "norm"
        out["norm.weight"] = WeightSpec(f"{p}.{norm}.weight")
        return out
