"""Granite's gated MLP with fused gate and up projections: `input_linear` [2S, D] (the
gate's S rows, then the up projection's) and `output_linear` [D, S]."""

from __future__ import annotations

import torch
from torch import nn

from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.mlp import activation
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import MLPConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup


class FusedGatedMLP(nn.Module):
    """`output(act(gate) * up)` with `[gate | up] = input(x)`.

    Tensor parallelism: `input_linear` is column-parallel per half (each rank keeps its
    slice of the gate rows and of the up rows, so the local output is still [gate' | up']),
    `output_linear` row-parallel; `reduce=False` leaves the all-reduce to the caller (a
    MoE's shared expert). Shapes: x [..., D] -> [..., D].
    """

    def __init__(
        self,
        d_model: int,
        cfg: MLPConfig,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        reduce: bool = True,
    ) -> None:
        super().__init__()
        if not cfg.gated:
            raise ValueError(f"{prefix}: a fused input_linear MLP must be gated")
        self.act = activation(cfg.activation)
        half = Segment(cfg.intermediate_size)
        self.input = column(d_model, (half, half), cfg.bias, f"{prefix}.input_linear", tp, dtype)
        self.output = row((half,), d_model, cfg.bias, f"{prefix}.output_linear", tp, dtype, reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.input(x).chunk(2, dim=-1)
        return self.output(self.act(gate) * up)

    def weight_specs(self) -> dict[str, WeightSpec]:
        out = {f"input.{k}": v for k, v in self.input.weight_specs().items()}
        out.update({f"output.{k}": v for k, v in self.output.weight_specs().items()})
        return out
