"""LFM2's gated short convolution: in_proj -> (B, C, x); y = C * conv(B * x); out_proj.

conv is a depthwise causal conv1d of kernel K (`conv_L_cache`) with no activation, run by
the kernel set's `causal_conv1d` ops (`activation=None`). Each channel is independent, so
tensor parallelism splits the D channels: in_proj column-parallel by channel (each rank
keeps its slice of B, of C and of x), the conv by channel, out_proj row-parallel (one
all-reduce).

States per sequence (this rank's shard), in the shape every recurrent mixer has:
- conv [D_local, K] in the model dtype: the last K inputs B * x, the layer's only state;
- ssm [0], float32: empty, so the store, the decode batch and the cache price it at 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from marconi_kernels import KernelSet
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.packed import (
    PackedMixer,
    PackedPart,
    PartStates,
    packed_conv,
    part_states,
)
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import ShortConvConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup


class ShortConvMixer(PackedMixer, nn.Module):
    """One short-conv layer's shard. `prefix` is the HF sub-module (`layers.{i}.conv`),
    holding `in_proj` (rows [B | C | x], D each), `conv` (weight [D, 1, K]) and
    `out_proj`, all with biases when `cfg.bias`. `prefill` (one sequence: final ssm [0],
    emitted ssm [E, 0]) is `prefill_packed` of one part."""

    KERNEL_OPS: ClassVar[tuple[str, ...]] = (
        "causal_conv1d",
        "causal_conv1d_update",
        "causal_conv1d_varlen",
    )
    """The `KernelSet` ops this mixer calls (prefill and decode)."""

    def __init__(
        self,
        d_model: int,
        cfg: ShortConvConfig,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.kernels = kernels
        self.prefix = prefix
        self.channels = tp.local(d_model)
        self.d_model = d_model
        parts = (Segment(d_model),) * 3
        self.in_proj = column(d_model, parts, cfg.bias, f"{prefix}.in_proj", tp, dtype)
        self.conv_weight = nn.Parameter(
            torch.empty(self.channels, 1, cfg.d_conv, dtype=dtype), requires_grad=False
        )
        self.conv_bias: nn.Parameter | None = None
        if cfg.bias:
            self.conv_bias = nn.Parameter(
                torch.zeros(self.channels, dtype=dtype), requires_grad=False
            )
        self.out_proj = row((Segment(d_model),), d_model, cfg.bias, f"{prefix}.out_proj", tp, dtype)

    def _gates(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., D] -> (the conv input B * x, the output gate C), each [..., D_local]."""
        b, c, h = torch.split(self.in_proj(x), self.channels, dim=-1)
        return b * h, c

    def empty_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv [D_local, K] (model dtype) and the empty ssm state [0] (float32)."""
        conv = torch.zeros(
            self.channels, self.cfg.d_conv, dtype=self.conv_weight.dtype, device=device
        )
        return conv, torch.zeros(0, dtype=torch.float32, device=device)

    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        """Several sequences' new tokens x [T, d_model] (packed, see `packed`): in_proj,
        the gate and out_proj once over all rows, the conv once for all parts, each from
        its conv state ([D_local, K]; the ssm state is empty, [0], and ignored). Returns
        y [T, d_model] and per part its final states and those at its `emit_at`."""
        u, gate = self._gates(x)
        y, convs = packed_conv(self.kernels, u, self.conv_weight[:, 0], self.conv_bias, parts, None)
        empty = torch.zeros(0, dtype=torch.float32, device=x.device)
        ssms = [(empty, empty.new_zeros(len(p.emit_at), 0)) for p in parts]
        return self.out_proj(gate * y), part_states(convs, ssms)

    def decode(self, x: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """One token per sequence. x [B, d_model]; conv [B, D_local, K] is updated in
        place; ssm [B, 0] is untouched. Returns [B, d_model]."""
        u, gate = self._gates(x)
        y = self.kernels.causal_conv1d_update(
            u, conv, self.conv_weight[:, 0], self.conv_bias, activation=None
        )
        return self.out_proj(gate * y)

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        for name in ("in_proj", "out_proj"):
            mod = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in mod.weight_specs().items()})
        channels = (Segment(self.d_model),)
        out["conv_weight"] = WeightSpec(f"{self.prefix}.conv.weight", 0, channels)
        if self.conv_bias is not None:
            out["conv_bias"] = WeightSpec(f"{self.prefix}.conv.bias", 0, channels)
        return out
