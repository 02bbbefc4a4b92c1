"""Feed-forward block: `down(act(up(x)))` or gated `down(act(gate(x)) * up(x))`."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import MLPConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup


def _relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "relu2": _relu2,
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_pytorch_tanh": _gelu_tanh,
}


def activation(name: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """The activation called `name`; ValueError naming it when unknown."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; known: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class MLP(nn.Module):
    """Column-parallel up/gate, row-parallel down (one all-reduce).

    `prefix` is the HF sub-module name (`mixer` for NemotronH, `feed_forward` for Bamba).
    `reduce=False` leaves the down projection's all-reduce to the caller (a MoE's shared
    expert, summed with the routed experts first). `cfg.gate_scale` and `cfg.down_scale`
    are folded into the gate and down weights.
    Shapes: x [..., d_model] -> [..., d_model].
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
        self.act = activation(cfg.activation)
        ff = (Segment(cfg.intermediate_size),)
        self.up = column(d_model, ff, cfg.bias, f"{prefix}.up_proj", tp, dtype)
        gate = (cfg.gate_scale,)
        self.gate = (
            column(d_model, ff, cfg.bias, f"{prefix}.gate_proj", tp, dtype, out_scales=gate)
            if cfg.gated
            else None
        )
        self.down = row(
            ff, d_model, cfg.bias, f"{prefix}.down_proj", tp, dtype, reduce, cfg.down_scale
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.up(x)) if self.gate is None else self.act(self.gate(x)) * self.up(x)
        return self.down(h)

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        for name, mod in (("up", self.up), ("gate", self.gate), ("down", self.down)):
            if mod is not None:
                out.update({f"{name}.{k}": v for k, v in mod.weight_specs().items()})
        return out
