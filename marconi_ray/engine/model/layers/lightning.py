"""MiniMax lightning attention mixer: qkv_proj -> activation -> per-head linear attention
with a constant decay -> RMSNorm over all heads -> sigmoid(output_gate) gate -> out_proj.

Per head h of HF layer i (see `LightningConfig`), token t:
    S = exp(-s_h) S + k_t v_t^T;   o_t = q_t^T S
with [q, k, v] = act(qkv_proj(x)) split per head (rows [q, k, v] of each head in turn),
s_h the slope transformers' `get_slope_rate` computes for layer i (in float32, the same
expression), then y = out_proj(sigmoid(output_gate(x)) * norm(o)), the norm an RMSNorm
over the concatenation of all heads (eps `LIGHTNING_NORM_EPS`, transformers' order: the
fp32 normalised values cast to the model dtype, then the weight).

Tensor parallelism splits the heads: qkv_proj and output_gate column-parallel by heads,
the norm weight by channels, out_proj row-parallel (one all-reduce). The norm's mean of
squares runs over every head, so each rank's sum of squares [T, 1] is all-reduced first
(a second, small all-reduce), which keeps tp > 1 equal to tp 1.

States per sequence (this rank's shard), in the shape every recurrent mixer has:
- conv [0, 0] in the model dtype: empty (the layer has no conv), priced at 0 bytes;
- ssm [heads_local, head_dim, head_dim] in float32: each head's S.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from marconi_kernels import KernelSet
from marconi_ray.core.model.hf.lightning import LIGHTNING_NORM_EPS
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.mlp import activation
from marconi_ray.engine.model.layers.packed import (
    PackedMixer,
    PackedPart,
    PartStates,
    cu_seqlens,
    part_states,
    split_states,
    stacked_states,
)
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import LightningConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup

MIN_CHUNK = 16
"""Shortest chunk a prefill uses (the Triton kernel's smallest tile)."""


def minimax_slopes(n_heads: int, layer: int, n_layers: int) -> torch.Tensor:
    """The decay rates [n_heads] (float32) of HF layer `layer` of `n_layers`, computed
    as transformers' `MiniMaxLightningAttention.get_slope_rate` does (same float32 ops)."""
    base = 1 / (2 ** (8 / n_heads))
    exponent = torch.arange(n_heads, device="cpu") + 1
    factor = 1 - layer / (n_layers - 1 + 1e-5) + 1e-5
    rate: torch.Tensor = (base**exponent) * factor
    return rate.to(torch.float32)


class LightningMixer(PackedMixer, nn.Module):
    """One lightning-attention layer's shard. `prefix` is the HF sub-module
    (`layers.{i}.self_attn`), holding `qkv_proj`, `output_gate`, `norm` and `out_proj`;
    `layer` is that HF layer's index (the decay slopes depend on it). `prefill` (one
    sequence) is `prefill_packed` of one part."""

    KERNEL_OPS: ClassVar[tuple[str, ...]] = (
        "lightning_chunk",
        "lightning_chunk_varlen",
        "lightning_step",
    )
    """The `KernelSet` ops this mixer calls (prefill and decode)."""

    def __init__(
        self,
        d_model: int,
        cfg: LightningConfig,
        layer: int,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.kernels = kernels
        self.prefix = prefix
        self.tp = tp
        self.heads = tp.local(cfg.n_heads)
        self.local = self.heads * cfg.head_dim
        self.act = activation(cfg.activation)
        width = (Segment(cfg.width),)
        self.qkv_proj = column(
            d_model, (Segment(3 * cfg.width),), False, f"{prefix}.qkv_proj", tp, dtype
        )
        self.output_gate = column(d_model, width, False, f"{prefix}.output_gate", tp, dtype)
        self.norm_weight = nn.Parameter(torch.ones(self.local, dtype=dtype), requires_grad=False)
        self.out_proj = row(width, d_model, False, f"{prefix}.out_proj", tp, dtype)
        start, stop = tp.part(cfg.n_heads)
        slopes = minimax_slopes(cfg.n_heads, layer, cfg.n_layers)[start:stop]
        self.slope: torch.Tensor
        self.register_buffer("slope", slopes.to(self.norm_weight.device), persistent=False)

    def _heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [..., D] -> q, k, v [..., heads_local, head_dim] (after the activation)."""
        qkv = self.act(self.qkv_proj(x))
        qkv = qkv.view(*x.shape[:-1], self.heads, 3 * self.cfg.head_dim)
        q, k, v = torch.split(qkv, self.cfg.head_dim, dim=-1)
        return q, k, v

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """o [..., heads_local, head_dim], the layer input x [..., D] -> out_proj(
        sigmoid(output_gate(x)) * norm(o)) [..., D]; the norm's mean of squares is over
        every rank's heads."""
        flat = o.reshape(*o.shape[:-2], self.local)
        of = flat.float()
        squares = of.pow(2).sum(-1, keepdim=True)
        mean = self.tp.all_reduce(squares) / self.cfg.width
        normed = (of * torch.rsqrt(mean + LIGHTNING_NORM_EPS)).to(o.dtype)
        y = torch.sigmoid(self.output_gate(x)) * (self.norm_weight * normed)
        return self.out_proj(y)

    def _chunk(self, n: int) -> int:
        """The chunk length for an n-token prefill: `cfg.chunk_size`, or the power of two
        (at least `MIN_CHUNK`) that covers a shorter prefill."""
        fit = max(MIN_CHUNK, 1 << max(0, n - 1).bit_length())
        return min(self.cfg.chunk_size, fit)

    def empty_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The empty conv [0, 0] (model dtype) and zero ssm [heads_local, hd, hd] (float32)."""
        hd = self.cfg.head_dim
        conv = torch.zeros(0, 0, dtype=self.norm_weight.dtype, device=device)
        return conv, torch.zeros(self.heads, hd, hd, dtype=torch.float32, device=device)

    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        """Several sequences' new tokens x [T, d_model] (packed, see `packed`): the
        projections, norm and gate once over all rows, the chunked recurrence once for
        all parts (`lightning_chunk_varlen`, each part from its own state). Returns
        y [T, d_model] and per part its final states (conv [0, 0], ssm [H', hd, hd]) and
        those at its `emit_at`."""
        q, k, v = self._heads(x)
        kern = self.kernels
        if len(parts) == 1:
            (p,) = parts
            o, final, emitted = kern.lightning_chunk(
                q[None], k[None], v[None], self.slope,
                chunk_size=self._chunk(p.length),
                initial_state=None if p.ssm is None else p.ssm[None],
                emit_at=p.emit_at,
            )  # fmt: skip
            o, ssms = o[0], [(final[0], emitted[:, 0])]
        else:
            o, finals, emitted = kern.lightning_chunk_varlen(
                q, k, v, self.slope, cu_seqlens=cu_seqlens(parts),
                chunk_size=self._chunk(max(p.length for p in parts)),
                initial_states=stacked_states(
                    [p.ssm for p in parts], lambda: self.empty_state(x.device)[1]
                ),
                emit_at=[p.emit_at for p in parts],
            )  # fmt: skip
            ssms = split_states(parts, finals, emitted)
        conv = self.empty_state(x.device)[0]
        convs = [(conv, conv.new_zeros(len(p.emit_at), 0, 0)) for p in parts]
        return self._output(o, x), part_states(convs, ssms)

    def decode(self, x: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """One token per sequence. x [B, d_model]; ssm [B, H', hd, hd] is updated in
        place; conv [B, 0, 0] is untouched. Returns [B, d_model]."""
        q, k, v = self._heads(x)
        o = self.kernels.lightning_step(ssm, q, k, v, self.slope)
        return self._output(o, x)

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        for name in ("qkv_proj", "output_gate", "out_proj"):
            mod = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in mod.weight_specs().items()})
        out["norm_weight"] = WeightSpec(f"{self.prefix}.norm.weight", 0, (Segment(self.cfg.width),))
        return out
