"""Preset configs of Ling hybrid (`bailing_hybrid`): KDA and MLA layers, a dense first
MLP, then mixtures of experts.

Layers: `BAILING_GROUP` times the number of whole groups of that many mixers in the
preset's pattern (at least one group), three KDA layers then one MLA layer each
(`layer_group_size`), so the last layer is MLA, whose `o_proj` bias (`attention_bias`,
zero but for the lift channel) lifts the printable logits (see `engine.presets.factory`).
KDA: the preset's attention heads and head_dim, the preset's conv width, the safe gate
with Ling's lower bound -5. MLA: the preset's heads, no q low-rank, a latent of
`4 * head_dim`, head_dim no-position key channels and values, `head_dim / 2` rotated key
channels (Ling's 512 / 128 / 64 at head_dim 128), RoPE base `BAILING_ROPE_THETA`, the
per-head output gate. The first layer's feed-forward is a gated MLP of the preset's gated
width; the others `BAILING_EXPERTS` experts together 5/4 as wide as it, top
`BAILING_TOP_K` within the best of `BAILING_GROUPS` expert groups, plus one shared expert
(every width even, so two tensor-parallel ranks split them). No MTP layers.

Exact parameter counts (`factory.count_parameters`): tiny 296,452; small 46,315,504;
paper-7b-shape 7,962,008,288.
"""

from __future__ import annotations

from typing import Any, Final

from marconi_ray.engine.presets.model_presets import ModelPreset, common_kwargs

BAILING_GROUP: Final = 4
BAILING_EXPERTS: Final = 8
BAILING_TOP_K: Final = 2
BAILING_GROUPS: Final = 2
BAILING_ROUTED_SCALE: Final = 2.5
"""`BailingHybridConfig`'s `routed_scaling_factor`."""
BAILING_ROPE_THETA: Final = 10000.0
"""A small RoPE base, so that a 300-token prompt turns the rotated channels visibly."""


def bailing_hybrid_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.BailingHybridConfig` for preset `p` (see the
    module docstring)."""
    n = BAILING_GROUP * max(1, len(p.mixers) // BAILING_GROUP)
    out: dict[str, Any] = {
        **common_kwargs(p, initializer_range),
        "num_key_value_heads": p.num_attention_heads,
        "num_hidden_layers": n,
        "layer_group_size": BAILING_GROUP,
        "first_k_dense_replace": 1,
        "num_mtp_layers": 0,
        "hidden_act": "silu",
        "intermediate_size": p.gated_intermediate_size,
        "attention_bias": True,  # zero, but the last layer's o_proj lifts the printable logits
        "head_dim": p.head_dim,
        "short_conv_kernel_size": p.conv_kernel,
        "kda_safe_gate": True,
        "kda_lower_bound": -5.0,
        "kv_lora_rank": 4 * p.head_dim,
        "q_lora_rank": None,
        "qk_nope_head_dim": p.head_dim,
        "qk_rope_head_dim": p.head_dim // 2,
        "v_head_dim": p.head_dim,
        "rope_parameters": {"rope_type": "default", "rope_theta": BAILING_ROPE_THETA},
        "num_local_experts": BAILING_EXPERTS,
        "num_experts_per_tok": BAILING_TOP_K,
        "moe_intermediate_size": p.gated_intermediate_size * 5 // (4 * BAILING_EXPERTS),
        "n_shared_experts": 1,
        "n_group": BAILING_GROUPS,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": BAILING_ROUTED_SCALE,
    }
    del out["mlp_bias"]
    return out
