"""Mamba-2 mixer: in_proj -> causal conv1d over (x, B, C) -> chunked SSD scan -> gated
grouped RMSNorm (or, without `cfg.gated_norm`, the gate alone: y * silu(z)) -> out_proj,
split across ranks by heads (and by groups when they divide). The muP multipliers of
`cfg` (input, per in_proj segment, output) are folded into in_proj and out_proj at load.

States per sequence (this rank's shard):
- conv [conv_local, d_conv] in the model dtype (the last d_conv inputs of the conv),
- ssm [heads_local, head_dim, d_state] in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from marconi_kernels import KernelSet
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.norm import GatedGroupRMSNorm
from marconi_ray.engine.model.layers.packed import (
    PackedMixer,
    PackedPart,
    PartStates,
    cu_seqlens,
    packed_conv,
    part_states,
    split_states,
    stacked_states,
)
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import Mamba2Config
from marconi_ray.engine.model.parallel import Segment, TPGroup, local_size


class Mamba2Mixer(PackedMixer, nn.Module):
    """One Mamba-2 layer's shard. `prefix` is the HF sub-module (`mixer` or `mamba`).
    `prefill` (one sequence: y, final conv [C, K] and ssm [H, P, N], emitted ones) is
    `prefill_packed` of one part.
    With `reduce=False` out_proj leaves its all-reduce to the caller (see
    `ParallelLinear`)."""

    KERNEL_OPS: ClassVar[tuple[str, ...]] = (
        "causal_conv1d",
        "causal_conv1d_update",
        "causal_conv1d_varlen",
        "ssd_chunk_scan",
        "ssd_chunk_scan_varlen",
        "mamba2_state_update",
    )
    """The `KernelSet` ops this mixer calls (prefill and decode)."""

    head_group: torch.Tensor

    def __init__(
        self,
        d_model: int,
        cfg: Mamba2Config,
        eps: float,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
        reduce: bool = True,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.kernels = kernels
        self.prefix = prefix
        self.heads = tp.local(cfg.n_heads)
        self.d_inner = tp.local(cfg.d_inner)
        groups_split = cfg.n_groups % tp.world == 0
        gn = cfg.n_groups * cfg.d_state
        self.conv_segments = (
            Segment(cfg.d_inner),
            Segment(gn, groups_split),
            Segment(gn, groups_split),
        )
        self.groups = tp.local(cfg.n_groups) if groups_split else cfg.n_groups
        self.bc = self.groups * cfg.d_state
        self.conv_dim = local_size(self.conv_segments, tp)
        heads = Segment(cfg.n_heads)
        self.in_proj = column(
            d_model,
            (Segment(cfg.d_inner), *self.conv_segments, heads),
            cfg.proj_bias,
            f"{prefix}.in_proj",
            tp,
            dtype,
            cfg.input_scale,
            cfg.in_proj_scales,
        )
        self.conv_weight = nn.Parameter(
            torch.empty(self.conv_dim, 1, cfg.d_conv, dtype=dtype), requires_grad=False
        )
        self.conv_bias = (
            nn.Parameter(torch.zeros(self.conv_dim, dtype=dtype), requires_grad=False)
            if cfg.conv_bias
            else None
        )
        self.dt_bias = nn.Parameter(torch.zeros(self.heads, dtype=dtype), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.heads, dtype=dtype), requires_grad=False)
        self.D = nn.Parameter(torch.ones(self.heads, dtype=dtype), requires_grad=False)
        self.norm = (
            GatedGroupRMSNorm(cfg.d_inner, cfg.n_groups, eps, tp, dtype, cfg.norm_before_gate)
            if cfg.gated_norm
            else None
        )
        self.out_proj = row(
            (Segment(cfg.d_inner),),
            d_model,
            cfg.proj_bias,
            f"{prefix}.out_proj",
            tp,
            dtype,
            reduce,
            cfg.output_scale,
        )
        head0, _ = tp.part(cfg.n_heads)
        per_group = cfg.n_heads // cfg.n_groups
        self.register_buffer(
            "head_group", (torch.arange(self.heads) + head0) // per_group, persistent=False
        )

    # ------------------------------------------------------------------ helpers
    @property
    def dt_limit(self) -> tuple[float, float]:
        return (self.cfg.dt_min, self.cfg.dt_max)

    def _split(self, zxbcdt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        z, xbc, dt = torch.split(zxbcdt, [self.d_inner, self.conv_dim, self.heads], dim=-1)
        return z, xbc, dt

    def _bc(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split conv output [..., conv_local] into x, B, C; B and C as [..., G', N] where
        G' is the local group count, or the local head count when groups are replicated
        (each local head then gets its own group's B and C)."""
        x, b, c = torch.split(xbc, [self.d_inner, self.bc, self.bc], dim=-1)
        n = self.cfg.d_state
        b = b.reshape(*b.shape[:-1], self.groups, n)
        c = c.reshape(*c.shape[:-1], self.groups, n)
        if self.groups * (self.cfg.n_heads // self.cfg.n_groups) != self.heads:
            b = b.index_select(-2, self.head_group)
            c = c.index_select(-2, self.head_group)
        return x, b, c

    def _gate(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Scan output y [B, d_inner_local] gated by z: the gated norm, or y * silu(z)."""
        if self.norm is not None:
            normed: torch.Tensor = self.norm(y, z)
            return normed
        return (y.float() * F.silu(z.float())).to(y.dtype)

    def empty_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv [conv_local, d_conv] and ssm [heads_local, head_dim, d_state] states."""
        conv = torch.zeros(
            self.conv_dim, self.cfg.d_conv, dtype=self.conv_weight.dtype, device=device
        )
        ssm = torch.zeros(
            self.heads, self.cfg.head_dim, self.cfg.d_state, dtype=torch.float32, device=device
        )
        return conv, ssm

    # ------------------------------------------------------------------ forward
    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        """Several sequences' new tokens x [T, d_model] (packed, see `packed`): in_proj,
        the gate and out_proj once over all rows, the conv and the SSD scan once for all
        parts (`ssd_chunk_scan_varlen`, each part from its own states). Returns y
        [T, d_model] and per part its final states (conv [C, K], ssm [H, P, N]) and those
        emitted at its `emit_at`."""
        z, xbc, dt = self._split(self.in_proj(x))
        k = self.kernels
        xbc, convs = packed_conv(k, xbc, self.conv_weight[:, 0], self.conv_bias, parts, "silu")
        xs, b, c = self._bc(xbc)
        a = -torch.exp(self.A_log.float())

        scan = {
            "chunk_size": self.cfg.chunk_size, "D": self.D, "dt_bias": self.dt_bias,
            "dt_softplus": True, "dt_limit": self.dt_limit,
        }  # fmt: skip
        heads = (self.heads, self.cfg.head_dim)
        if len(parts) == 1:
            (p,) = parts
            y, final, emitted = k.ssd_chunk_scan(
                xs.reshape(1, p.length, *heads), dt[None], a, b[None], c[None],
                initial_state=None if p.ssm is None else p.ssm[None], emit_at=p.emit_at, **scan,
            )  # fmt: skip
            ssms = [(final[0], emitted[:, 0])]
        else:
            y, finals, emitted = k.ssd_chunk_scan_varlen(
                xs.reshape(x.shape[0], *heads), dt, a, b, c, cu_seqlens=cu_seqlens(parts),
                initial_states=stacked_states(
                    [p.ssm for p in parts], lambda: self.empty_state(x.device)[1]
                ),
                emit_at=[p.emit_at for p in parts], **scan,
            )  # fmt: skip
            ssms = split_states(parts, finals, emitted)
        y = y.reshape(x.shape[0], self.d_inner)
        out = self.out_proj(self._gate(y, z))
        return out, part_states(convs, ssms)

    def decode(self, x: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """One token per sequence. x [B, d_model]; conv [B, C, K] and ssm [B, H, P, N]
        are updated in place. Returns [B, d_model]."""
        z, xbc, dt = self._split(self.in_proj(x))
        k = self.kernels
        xbc = k.causal_conv1d_update(
            xbc, conv, self.conv_weight[:, 0], self.conv_bias, activation="silu"
        )
        xs, b, c = self._bc(xbc)
        y = k.mamba2_state_update(
            ssm,
            xs.reshape(x.shape[0], self.heads, self.cfg.head_dim),
            dt,
            -torch.exp(self.A_log.float()),
            b,
            c,
            D=self.D,
            dt_bias=self.dt_bias,
            dt_softplus=True,
            dt_limit=self.dt_limit,
        )
        return self.out_proj(self._gate(y.reshape(x.shape[0], self.d_inner), z))

    def weight_specs(self) -> dict[str, WeightSpec]:
        p = self.prefix
        heads = (Segment(self.cfg.n_heads),)
        out = {f"in_proj.{k}": v for k, v in self.in_proj.weight_specs().items()}
        out.update({f"out_proj.{k}": v for k, v in self.out_proj.weight_specs().items()})
        out["conv_weight"] = WeightSpec(f"{p}.conv1d.weight", 0, self.conv_segments)
        if self.conv_bias is not None:
            out["conv_bias"] = WeightSpec(f"{p}.conv1d.bias", 0, self.conv_segments)
        for name in ("dt_bias", "A_log", "D"):
            out[name] = WeightSpec(f"{p}.{name}", 0, heads)
        if self.norm is not None:
            out["norm.weight"] = WeightSpec(f"{p}.norm.weight", 0, (Segment(self.cfg.d_inner),))
        return out
