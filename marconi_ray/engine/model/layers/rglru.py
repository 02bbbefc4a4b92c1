"""RecurrentGemma's recurrent block (Griffin): linear_y -> act (the output gate);
linear_x -> causal conv1d (with bias, no activation) -> RG-LRU; linear_out(lru * gate).

The RG-LRU per channel, with u the conv output and blocks of `block_width` channels:
    i_t = sigmoid(u_t W_i + b_i),  r_t = sigmoid(u_t W_r + b_r)     (block-diagonal)
    log a_t = -8 r_t softplus(Lambda),  a_t = exp(log a_t)
    h_t = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t u_t)
At a sequence's first token (absolute position 0) transformers resets: a_0 = 0 and the
input is not normalised (multiplier 1). Here that is the token a part without states
starts with (`PackedPart.ssm is None`: a fresh sequence); a part resumed from states
(any depth >= 1) and every decode step run the plain recurrence, so a resumed sequence
is exact at any depth. The recurrence runs on the kernel set's `rglru_*` ops.

Tensor parallelism splits the lru_width channels by gate blocks (heads): linear_x and
linear_y column-parallel, the conv, Lambda and the gate blocks by channel, linear_out
row-parallel (one all-reduce).

States per sequence (this rank's shard), in the shape every recurrent mixer has:
- conv [W_local, K] in the model dtype: the last K conv inputs;
- ssm [W_local] float32: the LRU state h.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from marconi_kernels import KernelSet
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.mlp import activation
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
from marconi_ray.engine.model.model_config import RGLRUConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup

DECAY_SCALE = 8.0
"""The constant c of log a = -c r softplus(Lambda) (Griffin's)."""


class RGLRUMixer(PackedMixer, nn.Module):
    """One recurrent block's shard. `prefix` is the HF sub-module (`layers.{i}.temporal_block`)
    holding `linear_x`, `linear_y`, `linear_out`, `conv_1d` (weight [W, 1, K], bias) and
    `rg_lru` (`recurrent_param` [W], `input_gate_weight` / `recurrent_gate_weight`
    [H, bw, bw], `input_gate_bias` / `recurrent_gate_bias` [H, bw])."""

    KERNEL_OPS: ClassVar[tuple[str, ...]] = (
        "causal_conv1d",
        "causal_conv1d_update",
        "causal_conv1d_varlen",
        "rglru_scan",
        "rglru_scan_varlen",
        "rglru_step",
    )
    """The `KernelSet` ops this mixer calls (prefill and decode)."""

    def __init__(
        self,
        d_model: int,
        cfg: RGLRUConfig,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.kernels = kernels
        self.prefix = prefix
        self.act = activation(cfg.activation)
        w = cfg.lru_width
        self.heads = tp.local(cfg.n_heads)
        self.channels = self.heads * cfg.block_width
        lru = (Segment(w),)
        self.linear_x = column(d_model, lru, True, f"{prefix}.linear_x", tp, dtype)
        self.linear_y = column(d_model, lru, True, f"{prefix}.linear_y", tp, dtype)
        self.linear_out = row(lru, d_model, True, f"{prefix}.linear_out", tp, dtype)

        def param(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.zeros(*shape, dtype=dtype), requires_grad=False)

        bw = cfg.block_width
        self.conv_weight = param(self.channels, 1, cfg.d_conv)
        self.conv_bias = param(self.channels)
        self.recurrent_param = param(self.channels)
        self.input_gate_weight = param(self.heads, bw, bw)
        self.input_gate_bias = param(self.heads, bw)
        self.recurrent_gate_weight = param(self.heads, bw, bw)
        self.recurrent_gate_bias = param(self.heads, bw)

    def _gate(self, u: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        """sigmoid of the block-diagonal product: u [T, W_local] -> [T, W_local]."""
        blocks = u.reshape(u.shape[0], self.heads, -1).transpose(0, 1)  # [H, T, bw]
        out = torch.baddbmm(bias[:, None, :], blocks, weight)
        return torch.sigmoid(out.transpose(0, 1).reshape(u.shape))

    def _recurrence_inputs(
        self, u: torch.Tensor, first: Sequence[int] = ()
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv outputs u [T, W_local] -> the recurrence's (x, a, b), each [T, W_local]:
        x = i * u, a the decay, b = sqrt(1 - a^2); rows `first` are sequences' first
        tokens (a = 0, b = 1)."""
        gate_x = self._gate(u, self.input_gate_weight, self.input_gate_bias)
        gate_a = self._gate(u, self.recurrent_gate_weight, self.recurrent_gate_bias)
        log_a = -DECAY_SCALE * gate_a * F.softplus(self.recurrent_param)
        a = torch.exp(log_a)
        b = torch.sqrt(1 - torch.exp(2 * log_a))
        if first:
            rows = torch.tensor(list(first), device=u.device)
            a = a.index_fill(0, rows, 0.0)
            b = b.index_fill(0, rows, 1.0)
        return u * gate_x, a, b

    def empty_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv [W_local, K] (model dtype) and LRU state [W_local] (float32)."""
        conv = torch.zeros(
            self.channels, self.cfg.d_conv, dtype=self.conv_weight.dtype, device=device
        )
        return conv, torch.zeros(self.channels, dtype=torch.float32, device=device)

    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        """Several sequences' new tokens x [T, d_model] (packed, see `packed`): the
        projections and gates once over all rows, the conv and the recurrence once for all
        parts, each from its states (a part without states starts its sequence: the
        RG-LRU's position-0 reset on its first row). Returns y [T, d_model] and per part
        its final states and those at its `emit_at`."""
        gate = self.act(self.linear_y(x))
        u, convs = packed_conv(
            self.kernels, self.linear_x(x), self.conv_weight[:, 0], self.conv_bias, parts, None
        )
        first = [p.start for p in parts if p.ssm is None and p.length > 0]
        xs, a, b = self._recurrence_inputs(u, first)
        if len(parts) == 1:
            (p,) = parts
            h, final, emitted = self.kernels.rglru_scan(
                xs.t()[None], a.t()[None], b.t()[None],
                initial_state=None if p.ssm is None else p.ssm[None], emit_at=p.emit_at,
            )  # fmt: skip
            h = h[0].t()
            ssms = [(final[0], emitted[:, 0])]
        else:
            h, finals, emitted = self.kernels.rglru_scan_varlen(
                xs.t(), a.t(), b.t(), cu_seqlens=cu_seqlens(parts),
                initial_states=stacked_states(
                    [p.ssm for p in parts],
                    lambda: torch.zeros(self.channels, dtype=torch.float32, device=x.device),
                ),
                emit_at=[p.emit_at for p in parts],
            )  # fmt: skip
            h = h.t()
            ssms = split_states(parts, finals, emitted)
        return self.linear_out(h * gate), part_states(convs, ssms)

    def decode(self, x: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """One token per sequence (never a sequence's first). x [B, d_model]; conv
        [B, W_local, K] and ssm [B, W_local] are updated in place. Returns [B, d_model]."""
        gate = self.act(self.linear_y(x))
        u = self.kernels.causal_conv1d_update(
            self.linear_x(x), conv, self.conv_weight[:, 0], self.conv_bias, activation=None
        )
        xs, a, b = self._recurrence_inputs(u)
        h = self.kernels.rglru_step(xs, a, b, ssm)
        return self.linear_out(h * gate)

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        for name in ("linear_x", "linear_y", "linear_out"):
            mod = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in mod.weight_specs().items()})
        channels = (Segment(self.cfg.lru_width),)
        heads = (Segment(self.cfg.n_heads),)
        out["conv_weight"] = WeightSpec(f"{self.prefix}.conv_1d.weight", 0, channels)
        out["conv_bias"] = WeightSpec(f"{self.prefix}.conv_1d.bias", 0, channels)
        lru = f"{self.prefix}.rg_lru"
        out["recurrent_param"] = WeightSpec(f"{lru}.recurrent_param", 0, channels)
        for name in ("input_gate", "recurrent_gate"):
            out[f"{name}_weight"] = WeightSpec(f"{lru}.{name}_weight", 0, heads)
            out[f"{name}_bias"] = WeightSpec(f"{lru}.{name}_bias", 0, heads)
        return out
