"""`MLSTMConfig`: xLSTM's mLSTM layer (matrix memory with exponential gating), as
`xlstm.parse_xlstm` reads it (pure data)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Final

from marconi_ray.core.model.spec_checks import require_positive

KIND_MLSTM: Final = "mlstm"


@dataclass(frozen=True)
class MLSTMConfig:
    """One mLSTM layer over `n_heads` heads (transformers' `xLSTMLayer`, weight_mode
    "single"): q, k (D -> n_heads * qk_head_dim), v and the output gate
    (D -> n_heads * v_head_dim), no biases; input and forget gates (D -> n_heads, with
    biases) soft-capped, cap * tanh(x / cap) (`gate_soft_cap`, None: not capped). Per
    head the recurrence of `marconi_kernels.mlstm` (q scaled by qk_head_dim**-0.5,
    stabiliser m, normaliser n, `eps` in the denominator), then a layer norm over each
    head's v_head_dim channels (no mean over heads; epsilon `norm_eps`, a weight over all
    channels, no bias), times sigmoid(output gate), then `out_proj` back to D.

    Attributes:
        chunk_size: tokens per chunk of the chunked prefill (any value gives the same
            result up to rounding).
    """

    kind: ClassVar[str] = KIND_MLSTM
    n_heads: int
    qk_head_dim: int
    v_head_dim: int
    gate_soft_cap: float | None
    eps: float
    norm_eps: float
    chunk_size: int = 64

    def __post_init__(self) -> None:
        for name in ("n_heads", "qk_head_dim", "v_head_dim", "chunk_size"):
            require_positive(name, getattr(self, name))
        for name in ("eps", "norm_eps"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        cap = self.gate_soft_cap
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise ValueError(f"gate_soft_cap must be a positive number or None, got {cap!r}")

    @property
    def qk_width(self) -> int:
        """n_heads * qk_head_dim: the width of q and k."""
        return self.n_heads * self.qk_head_dim

    @property
    def v_width(self) -> int:
        """n_heads * v_head_dim: the width of v, the output gate and the norm."""
        return self.n_heads * self.v_head_dim
