"""Mamba-1 mixer as in Jamba and Mamba: in_proj -> (x, gate); causal conv1d on x; x_proj ->
(dt, B, C), with RMSNorms (Jamba's weighted, Falcon-Mamba's weightless; Mamba has none);
dt_proj; selective scan (with an initial state, so prefill can resume);
out_proj. Channels are split across ranks; x_proj is row-parallel (its dt/B/C output is
all-reduced, so every rank sees the full dt, B and C).

States per sequence (this rank's shard): conv [d_inner_local, d_conv] in the model dtype,
ssm [d_inner_local, d_state] in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from marconi_kernels import KernelSet
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.norm import rms_norm
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
from marconi_ray.engine.model.model_config import Mamba1Config
from marconi_ray.engine.model.parallel import Segment, TPGroup


class Mamba1Mixer(PackedMixer, nn.Module):
    """One Mamba-1 layer's shard; weights under the HF sub-module `prefix` (`mamba`).
    `prefill` (one sequence) is `prefill_packed` of one part."""

    KERNEL_OPS: ClassVar[tuple[str, ...]] = (
        "causal_conv1d",
        "causal_conv1d_update",
        "causal_conv1d_varlen",
        "selective_scan",
        "selective_scan_varlen",
        "mamba1_state_update",
    )
    """The `KernelSet` ops this mixer calls (prefill and decode)."""

    def __init__(
        self,
        d_model: int,
        cfg: Mamba1Config,
        eps: float,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.eps = eps
        self.prefix = prefix
        self.kernels = kernels
        self.d_inner = tp.local(cfg.d_inner)
        inner = Segment(cfg.d_inner)
        self.in_proj = column(
            d_model, (inner, inner), cfg.proj_bias, f"{prefix}.in_proj", tp, dtype
        )
        self.x_proj = row(
            (inner,), cfg.dt_rank + 2 * cfg.d_state, False, f"{prefix}.x_proj", tp, dtype
        )
        self.dt_proj = column(cfg.dt_rank, (inner,), True, f"{prefix}.dt_proj", tp, dtype)
        self.out_proj = row((inner,), d_model, cfg.proj_bias, f"{prefix}.out_proj", tp, dtype)

        def param(*shape: int, fill: float = 0.0) -> nn.Parameter:
            return nn.Parameter(torch.full(shape, fill, dtype=dtype), requires_grad=False)

        self.conv_weight = param(self.d_inner, 1, cfg.d_conv)
        self.conv_bias = param(self.d_inner) if cfg.conv_bias else None
        self.A_log = param(self.d_inner, cfg.d_state)
        self.D = param(self.d_inner, fill=1.0)
        self.norm_eps = eps if cfg.inner_norm_eps is None else cfg.inner_norm_eps
        if cfg.inner_norms and cfg.inner_norm_weights:
            self.dt_norm = param(cfg.dt_rank, fill=1.0)
            self.b_norm = param(cfg.d_state, fill=1.0)
            self.c_norm = param(cfg.d_state, fill=1.0)
        else:
            ones = (torch.ones(n, dtype=dtype) for n in (cfg.dt_rank, cfg.d_state, cfg.d_state))
            for name, unit in zip(("dt_norm", "b_norm", "c_norm"), ones, strict=True):
                self.register_buffer(name, unit, persistent=False)

    def empty_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        conv = torch.zeros(
            self.d_inner, self.cfg.d_conv, dtype=self.conv_weight.dtype, device=device
        )
        return conv, torch.zeros(self.d_inner, self.cfg.d_state, dtype=torch.float32, device=device)

    def _ssm_inputs(self, xc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """xc [..., d_inner_local] -> delta [..., d_inner_local] (before bias), B, C [..., N]."""
        n = self.cfg.d_state
        dt, b, c = torch.split(self.x_proj(xc), [self.cfg.dt_rank, n, n], dim=-1)
        if self.cfg.inner_norms:
            dt, b, c = (
                rms_norm(t, w, self.norm_eps)
                for t, w in ((dt, self.dt_norm), (b, self.b_norm), (c, self.c_norm))
            )
        return dt @ self.dt_proj.weight.t(), b, c

    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        """Same contract as `Mamba2Mixer.prefill_packed`; ssm states are
        [d_inner_local, N]. in_proj, x_proj / dt_proj and out_proj run once over all rows;
        the conv and the selective scan once for all parts (`selective_scan_varlen`, each
        part from its own state)."""
        xs, gate = self.in_proj(x).chunk(2, dim=-1)
        k = self.kernels
        xc, convs = packed_conv(k, xs, self.conv_weight[:, 0], self.conv_bias, parts, "silu")
        delta, b, c = self._ssm_inputs(xc)
        a = -torch.exp(self.A_log.float())
        scan = {"D": self.D, "delta_bias": self.dt_proj.bias, "delta_softplus": True}
        if len(parts) == 1:
            (p,) = parts
            y, final, emitted = k.selective_scan(
                xc.t()[None], delta.t()[None], a, b.t()[None], c.t()[None], z=gate.t()[None],
                initial_state=None if p.ssm is None else p.ssm[None], emit_at=p.emit_at, **scan,
            )  # fmt: skip
            ssms = [(final[0], emitted[:, 0])]
            y = y[0].t()
        else:
            y, finals, emitted = k.selective_scan_varlen(
                xc.t(), delta.t(), a, b.t(), c.t(), z=gate.t(), cu_seqlens=cu_seqlens(parts),
                initial_states=stacked_states(
                    [p.ssm for p in parts], lambda: self.empty_state(x.device)[1]
                ),
                emit_at=[p.emit_at for p in parts], **scan,
            )  # fmt: skip
            ssms = split_states(parts, finals, emitted)
            y = y.t()
        return self.out_proj(y), part_states(convs, ssms)

    def decode(self, x: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """x [B, d_model]; conv [B, C, K] and ssm [B, D, N] updated in place."""
        xs, gate = self.in_proj(x).chunk(2, dim=-1)
        k = self.kernels
        xc = k.causal_conv1d_update(
            xs, conv, self.conv_weight[:, 0], self.conv_bias, activation="silu"
        )
        delta, b, c = self._ssm_inputs(xc)
        y = k.mamba1_state_update(
            ssm,
            xc,
            delta,
            -torch.exp(self.A_log.float()),
            b,
            c,
            D=self.D,
            z=gate,
            delta_bias=self.dt_proj.bias,
            delta_softplus=True,
        )
        return self.out_proj(y)

    def weight_specs(self) -> dict[str, WeightSpec]:
        p = self.prefix
        inner = (Segment(self.cfg.d_inner),)
        out: dict[str, WeightSpec] = {}
        for name in ("in_proj", "x_proj", "dt_proj", "out_proj"):
            mod = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in mod.weight_specs().items()})
        out["conv_weight"] = WeightSpec(f"{p}.conv1d.weight", 0, inner)
        if self.conv_bias is not None:
            out["conv_bias"] = WeightSpec(f"{p}.conv1d.bias", 0, inner)
        out["A_log"] = WeightSpec(f"{p}.A_log", 0, inner)
        out["D"] = WeightSpec(f"{p}.D", 0, inner)
        if self.cfg.inner_norms and self.cfg.inner_norm_weights:
            out["dt_norm"] = WeightSpec(f"{p}.dt_layernorm.weight")
            out["b_norm"] = WeightSpec(f"{p}.b_layernorm.weight")
            out["c_norm"] = WeightSpec(f"{p}.c_layernorm.weight")
        return out
