"""RMSNorm (plain or zero-centred), the RMSNorm of a projection split across ranks, the
gated, grouped RMSNorm of Mamba-2 and the per-head gated RMSNorm of Gated DeltaNet."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.parallel import Segment, TPGroup


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool = False
) -> torch.Tensor:
    """`scale * x / rms(x)` over the last dim, computed in fp32; returns x's dtype.
    `scale` is `weight`, or `1 + weight` with `unit_offset` (zero-centred weights, as
    Qwen3.5 and Qwen3-Next store them)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    scale = weight.float() + 1.0 if unit_offset else weight.float()
    return (scale * xf).to(x.dtype)


class RMSNorm(nn.Module):
    """Replicated RMSNorm over the last dim (the hidden size, or a head's width for q/k
    norms); `unit_offset`: the scale is 1 + weight."""

    def __init__(
        self, size: int, eps: float, key: str, dtype: torch.dtype, unit_offset: bool = False
    ) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.eps = eps
        self.key = key
        self.unit_offset = unit_offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, self.unit_offset)

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec(self.key)}


class ShardedRMSNorm(nn.Module):
    """RMSNorm over a whole projection whose channels are split across ranks by heads
    (OLMo Hybrid's q and k norms span all heads): each rank holds its slice of the weight,
    and the sum of squares is all-reduced so every rank divides by the whole width's RMS.
    Shapes: x [..., local] -> [..., local], in x's dtype (fp32 compute)."""

    def __init__(self, size: int, eps: float, key: str, tp: TPGroup, dtype: torch.dtype) -> None:
        super().__init__()
        self.size = size
        self.eps = eps
        self.key = key
        self.tp = tp
        self.weight = nn.Parameter(torch.ones(tp.local(size), dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        sq = self.tp.all_reduce(xf.pow(2).sum(-1, keepdim=True))
        return (self.weight.float() * xf * torch.rsqrt(sq / self.size + self.eps)).to(x.dtype)

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec(self.key, 0, (Segment(self.size),))}


class GatedGroupRMSNorm(nn.Module):
    """`weight * rmsnorm_g(x * silu(gate))` where the RMS is taken per group of
    `d_inner / n_groups` channels (Mamba-2's norm, `norm_before_gate=False`); with
    `norm_before_gate`, `weight * rmsnorm_g(x) * silu(gate)` (a FalconH1 option).

    Channels are split across ranks by heads. When a rank holds whole groups the norm is
    local; when a group spans ranks (n_groups % world != 0) the sum of squares of each
    group is all-reduced. Shapes: x, gate [..., d_inner_local] -> [..., d_inner_local].
    """

    def __init__(
        self,
        d_inner: int,
        n_groups: int,
        eps: float,
        tp: TPGroup,
        dtype: torch.dtype,
        norm_before_gate: bool = False,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.eps = eps
        self.norm_before_gate = norm_before_gate
        self.d_inner = d_inner
        self.local = tp.local(d_inner)
        self.group_size = d_inner // n_groups
        self.groups_local = n_groups % tp.world == 0
        self.weight = nn.Parameter(torch.ones(self.local, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        h = x.float() if self.norm_before_gate else x.float() * F.silu(gate.float())
        if self.groups_local:
            g = h.view(*h.shape[:-1], -1, self.group_size)
            g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)
            h = g.view_as(h)
        else:
            h = self._spanning(h)
        if self.norm_before_gate:
            return (self.weight.float() * h * F.silu(gate.float())).to(x.dtype)
        return self.weight * h.to(x.dtype)

    def _spanning(self, h: torch.Tensor) -> torch.Tensor:
        """Groups that span ranks: all-reduce each group's sum of squares."""
        start, _ = self.tp.part(self.d_inner)
        n_groups = self.d_inner // self.group_size
        group_of = (torch.arange(self.local, device=h.device) + start) // self.group_size
        sq = torch.zeros(*h.shape[:-1], n_groups, dtype=h.dtype, device=h.device)
        sq.index_add_(-1, group_of, h.pow(2))
        self.tp.all_reduce(sq)
        var = sq / self.group_size
        return h * torch.rsqrt(var.index_select(-1, group_of) + self.eps)


class HeadGatedRMSNorm(nn.Module):
    """Gated DeltaNet's output norm: per head, `(weight * x / rms(x)) * silu(gate)`, the
    norm before the gate, one weight of `head_dim` shared by every head (so it is
    replicated and needs no communication under tensor parallelism).

    Shapes: x, gate [..., heads, head_dim] -> [..., heads, head_dim] in x's dtype. The
    normalised x is cast to x's dtype before the weight and the fp32 gate are applied,
    as transformers does.
    """

    def __init__(self, head_dim: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)
