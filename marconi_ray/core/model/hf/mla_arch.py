"""`MLAConfig`: multi-head latent attention (DeepSeek-V2/V3 style, Kimi Linear), pure data."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from marconi_ray.core.model.spec_checks import require_positive

KIND_MLA: Final = "mla"
MLA_NORM_EPS: Final = 1e-6
"""Epsilon of the latent RMSNorms (`kv_a_layernorm`, `q_a_layernorm`): transformers builds
them with the RMSNorm's default, not the model's `rms_norm_eps`."""


@dataclass(frozen=True)
class MLAConfig:
    """Multi-head latent attention without positional encoding (Kimi Linear's "NoPE" MLA).

    Per token, `kv_a_proj_with_mqa` (D -> kv_lora_rank + qk_rope_head_dim) gives a latent,
    RMS-normed (`kv_a_layernorm`), and a key part shared by every head (`k_rope`: the part
    DeepSeek rotates; Kimi Linear applies no rotation). `kv_b_proj` expands the latent into
    each head's key part (qk_nope_head_dim) and value (v_head_dim); a head's key is
    [k_nope_h | k_rope]. Queries come from `q_proj` (or `q_a_proj` -> `q_a_layernorm` ->
    `q_b_proj` when `q_lora_rank` is set), [q_nope | q_rope] per head. Scores are scaled
    by (qk_nope_head_dim + qk_rope_head_dim) ** -0.5.

    What a token caches is the normed latent and k_rope: `cache_width` values per token.

    Ling's variant (`bailing_hybrid`) rotates the k_rope and q_rope channels and gates
    each head's output:

    Attributes:
        bias: q_a_proj, kv_a_proj_with_mqa and o_proj have biases (`attention_bias`).
        rope_theta: None: no positional encoding (Kimi); else the base of the RoPE that
            rotates q_rope and k_rope in DeepSeek's interleaved layout (channel pairs
            (2i, 2i+1) rotate by frequency i; the rotated channels are written evens then
            odds, as transformers' `apply_rotary_pos_emb_interleave`). What is cached is
            k_rope rotated.
        head_gate: each head's attention output is scaled by sigmoid(g_proj(x))_h, a
            D -> n_heads projection, before o_proj (Ling).
    """

    kind: ClassVar[str] = KIND_MLA
    n_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    bias: bool = False
    rope_theta: float | None = None
    head_gate: bool = False

    def __post_init__(self) -> None:
        for name in ("n_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            require_positive(name, getattr(self, name))
        if self.qk_rope_head_dim < 0:
            raise ValueError(f"qk_rope_head_dim must be >= 0, got {self.qk_rope_head_dim}")
        if self.q_lora_rank is not None:
            require_positive("q_lora_rank", self.q_lora_rank)
        if self.rope_theta is not None:
            if not self.rope_theta > 0:
                raise ValueError(f"rope_theta must be > 0, got {self.rope_theta!r}")
            if self.qk_rope_head_dim % 2:
                raise ValueError(
                    f"qk_rope_head_dim must be even to be rotated, got {self.qk_rope_head_dim}"
                )

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cache_width(self) -> int:
        """Values cached per token: the latent and the shared key part."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def scale(self) -> float:
        return float(self.qk_head_dim**-0.5)
