"""Preset configs of MiniMax (`minimax`: MiniMax-Text-01 / MiniMax-M1 shapes in small).

One layer per mixer of the preset's pattern: `M` a lightning-attention layer, `*` GQA
softmax attention (the preset's heads, head_dim and KV heads; lightning attention takes
the same heads and head_dim, as MiniMax does), each followed by `MINIMAX_EXPERTS` SwiGLU
experts (top `MINIMAX_TOP_K`, softmax router, renormalised) together as wide as the gated
MLP. The residual factors are `MINIMAX_FACTORS` (none is 1, so the tests exercise each);
transformers' own lightning chunk (`block_size`) is the preset's chunk, unlike the
engine's 64, so the tests also show the result does not depend on it.

MiniMax has no bias anywhere, so its printable logits are lifted through the embedding
table instead, and its blocks' writes to the post-norm residual are scaled so that the
tokens depend on every block (see `engine.presets.minimax_lift`).

Exact parameter counts (from `factory.count_parameters`, meta device):

| preset          | minimax       |
|-----------------|---------------|
| tiny            | 276,608       |
| small           | 44,075,520    |
| paper-7b-shape  | 6,209,409,024 |
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from marconi_ray.engine.presets.model_presets import ModelPreset, common_kwargs

MINIMAX_EXPERTS: Final = 4
MINIMAX_TOP_K: Final = 2
MINIMAX_FACTORS: Final[Mapping[str, float]] = MappingProxyType(
    {
        "full_attn_alpha_factor": 1.25,
        "full_attn_beta_factor": 0.8,
        "linear_attn_alpha_factor": 0.9,
        "linear_attn_beta_factor": 1.1,
        "mlp_alpha_factor": 1.1,
        "mlp_beta_factor": 0.75,
    }
)
"""The residual (alpha, beta) factors of every MiniMax preset."""


def minimax_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.MiniMaxConfig` for preset `p` (see the module
    docstring)."""
    out: dict[str, Any] = {
        **common_kwargs(p, initializer_range),
        "num_hidden_layers": len(p.mixers),
        "layer_types": ["full_attention" if c == "*" else "linear_attention" for c in p.mixers],
        "head_dim": p.head_dim,
        "intermediate_size": p.gated_intermediate_size // MINIMAX_EXPERTS,
        "num_local_experts": MINIMAX_EXPERTS,
        "num_experts_per_tok": MINIMAX_TOP_K,
        "hidden_act": "silu",
        "block_size": p.chunk_size,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        **MINIMAX_FACTORS,
    }
    del out["mlp_bias"]
    return out
