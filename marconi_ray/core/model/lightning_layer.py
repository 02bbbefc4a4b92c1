"""The cost model of MiniMax's lightning attention layer (see `core/model/layers.py` for
the contract every layer spec follows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from marconi_ray.core.model.layers import KIND_SSM, LayerSpec
from marconi_ray.core.model.spec_checks import require_positive


@dataclass(frozen=True)
class LightningLayer(LayerSpec):
    """Lightning attention (MiniMax linear attention): W = n_heads * head_dim.

    FLOPs per token: qkv_proj 2*D*3W, output_gate 2*D*W, the recurrence 6*H*hd*hd (per
    state element: decay, write k v^T, read q^T S, about three multiply-adds), norm and
    gate 5*W, out_proj 2*W*D; no term in n^2 (the state is carried, not the keys).
    Cached state: the recurrent S of every head, H*hd*hd elements (float32 in the engine:
    price it with `ModelSpec.state_dtype_bytes`); no conv state, no KV.
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    n_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "head_dim"):
            require_positive(name, getattr(self, name))

    @property
    def width(self) -> int:
        return self.n_heads * self.head_dim

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, w, hd = self.d_model, self.width, self.head_dim
        c1 = 2 * d * 3 * w + 2 * d * w + 6 * self.n_heads * hd * hd + 5 * w + 2 * w * d
        return float(c1), 0.0

    def state_elements(self) -> int:
        return self.n_heads * self.head_dim * self.head_dim
