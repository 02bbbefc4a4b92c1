"""Cost-model layer specs of Kimi Linear's mixers: KDA (linear attention with a
per-channel decay) and MLA (latent attention that caches the latent, not K and V).

Same contract as `marconi_ray.core.model.layers` (FLOPs c1*n + c2*n*n over a from-scratch
sequence; cached bytes per token or per state). What they price is what the engine's
store holds: KDA's conv window and float32 recurrent state, MLA's latent row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from marconi_ray.core.model.layers import KIND_ATTENTION, KIND_SSM, LayerSpec
from marconi_ray.core.model.spec_checks import require_positive


@dataclass(frozen=True)
class KDALayer(LayerSpec):
    """KDA with H heads of width dk (q, k and v alike; key_dim = H*dk).

    FLOPs per token: q/k/v and beta projections 2*D*(3*key_dim + H), the two low-rank
    projections of the decay and of the output gate 2*(2*D*dk + 2*dk*key_dim), the conv
    2*3*key_dim*d_conv, the delta rule 8*H*dk*dk, the gated norm 5*key_dim, o_proj
    2*key_dim*D. Cached state: recurrent H*dk*dk elements, conv 3*key_dim*d_conv.
    Without `low_rank_gates` (Ling) the decay and the gate are full-rank projections,
    2*(2*D*key_dim) in place of the low-rank pairs; the state is the same.
    """

    kind: ClassVar[str] = KIND_SSM
    d_model: int
    n_heads: int
    head_dim: int
    d_conv: int
    low_rank_gates: bool = True

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "head_dim", "d_conv"):
            require_positive(name, getattr(self, name))

    @property
    def key_dim(self) -> int:
        return self.n_heads * self.head_dim

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, kd, dk, h = self.d_model, self.key_dim, self.head_dim, self.n_heads
        gates = 2 * (2 * d * dk + 2 * dk * kd) if self.low_rank_gates else 2 * (2 * d * kd)
        proj = 2 * d * (3 * kd + h) + gates
        conv = 2 * 3 * kd * self.d_conv
        rule = 8 * h * dk * dk
        return float(proj + conv + rule + 5 * kd + 2 * kd * d), 0.0

    def state_elements(self) -> int:
        return self.n_heads * self.head_dim * self.head_dim

    def conv_elements(self) -> int:
        return 3 * self.key_dim * self.d_conv


@dataclass(frozen=True)
class MLALayer(LayerSpec):
    """Multi-head latent attention: H heads, keys of qk = dn + dr, values of dv, a latent
    of rank r (`kv_lora_rank`) and dr (`qk_rope_head_dim`) shared key channels.

    FLOPs per token: queries 2*D*H*qk (or 2*D*ql + 2*ql*H*qk through a rank-ql
    bottleneck), kv_a 2*D*(r + dr), kv_b 2*r*H*(dn + dv), o_proj 2*H*dv*D; over n tokens
    the scores and AV add 2*n*n*H*(qk + dv) (the full n x n products, as
    `AttentionLayer` counts them). Cached per token: r + dr elements (the latent and the
    shared key part), never the expanded keys and values. A `head_gate` (Ling) adds
    its D -> H projection, 2*D*H (RoPE's few FLOPs are not counted).
    """

    kind: ClassVar[str] = KIND_ATTENTION
    d_model: int
    n_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None
    head_gate: bool = False

    def __post_init__(self) -> None:
        for name in ("d_model", "n_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            require_positive(name, getattr(self, name))
        if self.q_lora_rank is not None:
            require_positive("q_lora_rank", self.q_lora_rank)

    def total_flops_coeffs(self) -> tuple[float, float]:
        d, h, r = self.d_model, self.n_heads, self.kv_lora_rank
        qk = self.qk_nope_head_dim + self.qk_rope_head_dim
        ql = self.q_lora_rank
        q = 2 * d * h * qk if ql is None else 2 * d * ql + 2 * ql * h * qk
        kv = 2 * d * (r + self.qk_rope_head_dim) + 2 * r * h * (
            self.qk_nope_head_dim + self.v_head_dim
        )
        c1 = q + kv + 2 * h * self.v_head_dim * d + (2 * d * h if self.head_gate else 0)
        return float(c1), float(2 * h * (qk + self.v_head_dim))

    def kv_elements_per_token(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim
