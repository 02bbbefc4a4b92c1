"""The cost model of xLSTM's mLSTM layer (see `core/model/layers.py` for the contract
every layer spec follows)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from marconi_ray.core.model.layers import KIND_SSM, LayerSpec
from marconi_ray.core.model.spec_checks import require_positive


@dataclass(frozen=True)
class MLSTMLayer(LayerSpec):
    """The mLSTM layer: H heads, Wqk = H * dqk, Wv = H * dv.

    FLOPs per token: q and k 2*D*2Wqk, v and the output gate 2*D*2Wv, the input and
    forget gates 2*D*2H, the recurrence 6*H*dqk*dv (per memory element: decay, write
    k v^T, read q^T C) plus 6*Wqk for the normaliser, norm and gate 8*Wv, out_proj
    2*Wv*D; no term in n^2 (the state is carried, not the keys).
    Cached state: per head the matrix memory C (dqk*dv), the normaliser n (dqk) and the
    stabiliser m (1), float32 in the engine (price it with `ModelSpec.state_dtype_bytes`);
    no conv state, no KV.
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    n_heads: int
    qk_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "qk_head_dim", "v_head_dim"):
            require_positive(name, getattr(self, name))

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, h = self.d_model, self.n_heads
        wqk, wv = h * self.qk_head_dim, h * self.v_head_dim
        c1 = (
            2 * d * 2 * wqk
            + 2 * d * 2 * wv
            + 2 * d * 2 * h
            + 6 * h * self.qk_head_dim * self.v_head_dim
            + 6 * wqk
            + 8 * wv
            + 2 * wv * d
        )
        return float(c1), 0.0

    def state_elements(self) -> int:
        return self.n_heads * (self.qk_head_dim * self.v_head_dim + self.qk_head_dim + 1)
