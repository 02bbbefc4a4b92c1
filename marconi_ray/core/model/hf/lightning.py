"""`LightningConfig`: MiniMax's lightning attention (linear attention with a constant
per-head decay), as `families.minimax.parse_minimax` reads it (pure data)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from marconi_ray.core.model.spec_checks import require_positive

KIND_LIGHTNING: Final = "lightning"
LIGHTNING_NORM_EPS: Final = 1e-6
"""Epsilon of the output RMSNorm: transformers' `MiniMaxLightningAttention.norm` keeps the
`MiniMaxRMSNorm` default, not the config's `rms_norm_eps`."""


@dataclass(frozen=True)
class LightningConfig:
    """MiniMax lightning attention over `n_heads` heads of `head_dim` (MiniMax-Text-01,
    MiniMax-M1; transformers' `MiniMaxLightningAttention`).

    `qkv_proj` (D -> 3 * n_heads * head_dim, rows [q, k, v] of each head in turn) then
    `activation` over all of it; per head h the recurrence S = exp(-s_h) S + k v^T,
    o = q^T S (q, k neither normalised nor scaled); an RMSNorm over the concatenation of
    all heads' outputs (eps `LIGHTNING_NORM_EPS`), times sigmoid(`output_gate`(x)), then
    `out_proj` back to D. No projection has a bias.

    The decay rate of head h (0-based) in HF layer `i` of `n_layers` is `slope(h, i)`:
    2^(-8 (h + 1) / n_heads) times (1 - i / (n_layers - 1 + 1e-5) + 1e-5), as
    `get_slope_rate` computes it (the engine computes them the same way, in float32), so
    one config serves every layer.

    Attributes:
        n_layers: the model's `num_hidden_layers` (the slopes depend on it).
        chunk_size: tokens per chunk of the chunked prefill (any value gives the same
            result up to rounding; transformers' `block_size` only sets its own chunks).
    """

    kind: ClassVar[str] = KIND_LIGHTNING
    n_heads: int
    head_dim: int
    n_layers: int
    activation: str = "silu"
    chunk_size: int = 64

    def __post_init__(self) -> None:
        for name in ("n_heads", "head_dim", "n_layers", "chunk_size"):
            require_positive(name, getattr(self, name))

    @property
    def width(self) -> int:
        """n_heads * head_dim: the width of q, k, v, the gate and the norm."""
        return self.n_heads * self.head_dim
