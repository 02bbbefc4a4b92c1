"""`KDAConfig`: Kimi Delta Attention (Kimi Linear's linear attention), pure data."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Final

from marconi_ray.core.model.spec_checks import require_positive

KIND_KDA: Final = "kda"


@dataclass(frozen=True)
class KDAConfig:
    """KDA: the gated delta rule with a per-channel decay (Kimi Linear).

    q, k and v each have `n_heads` heads of `head_dim` (`linear_attn_config.num_heads`,
    `head_dim`), from separate projections `q_proj`, `k_proj`, `v_proj`; one depthwise
    causal conv (kernel `d_conv`, no bias, SiLU) runs over their concatenation [q, k, v]
    (`conv_dim` channels). beta = sigmoid(b_proj(x)) per head; the log decay per head and
    key channel is g = -exp(A_log_h) * softplus(f_b(f_a(x)) + dt_bias) (a low-rank
    projection D -> head_dim -> n_heads * head_dim); the output is RMS-normed per head
    and gated by sigmoid(g_b(g_a(x))) before `o_proj`.

    Ling's variant (`bailing_hybrid`) differs only in how the decay and the output gate
    are projected and bounded:

    Attributes:
        chunk_size: tokens per chunk of the chunked prefill.
        low_rank_gates: the decay's and the output gate's projections go through a rank
            `head_dim` bottleneck (`f_a_proj`/`f_b_proj`, `g_a_proj`/`g_b_proj`, Kimi);
            False: one full-rank projection each, D -> n_heads * head_dim (`f_proj`,
            `g_proj`, Ling).
        gate_lower_bound: None: g as above (Kimi); a negative bound b: the "safe" gate
            g = b * sigmoid(exp(A_log_h) * (f(x) + dt_bias)), within (b, 0) (Ling's
            `kda_safe_gate` with `kda_lower_bound`).
    """

    kind: ClassVar[str] = KIND_KDA
    n_heads: int
    head_dim: int
    d_conv: int
    chunk_size: int = 64
    low_rank_gates: bool = True
    gate_lower_bound: float | None = None

    def __post_init__(self) -> None:
        require_positive("linear_attn_config.num_heads", self.n_heads)
        require_positive("linear_attn_config.head_dim", self.head_dim)
        require_positive("linear_attn_config.short_conv_kernel_size", self.d_conv)
        require_positive("chunk_size", self.chunk_size)
        bound = self.gate_lower_bound
        if bound is not None and not (math.isfinite(bound) and bound < 0):
            raise ValueError(f"kda_lower_bound must be a finite negative number, got {bound!r}")

    @property
    def key_dim(self) -> int:
        """Channels of q (and of k, and of v): n_heads * head_dim."""
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return 3 * self.key_dim
