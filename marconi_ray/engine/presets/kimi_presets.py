"""Preset configs of Kimi Linear (`kimi_linear`): KDA and MLA layers, a dense first MLP,
then mixtures of experts.

Layers: `KIMI_ATTENTION_INTERVAL` times the number of whole groups of that many mixers in
the preset's pattern (at least one group), three KDA layers then one MLA layer each (the
released model's 3 : 1), so the last layer is MLA, whose `o_proj` bias (`attention_bias`,
zero but for the lift channel) lifts the printable logits (see `engine.presets.factory`).
KDA: the preset's attention heads and head_dim (q, k, v alike), the preset's conv
width. MLA: the preset's heads, no q low-rank, a latent of `4 * head_dim`, head_dim
no-position key channels and values, `head_dim / 2` shared key channels (Kimi Linear's
512 / 128 / 64 at head_dim 128). The first layer's feed-forward is a gated MLP of the
preset's gated width; the others `KIMI_EXPERTS` experts together 5/4 as wide as it, top
`KIMI_TOP_K` within the best of `KIMI_GROUPS` expert groups, plus one shared expert
(every width even, so two tensor-parallel ranks split them).

Exact parameter counts (`factory.count_parameters`): tiny 283,908; small 43,948,016;
paper-7b-shape 7,300,487,904.
"""

from __future__ import annotations

from typing import Any, Final

from marconi_ray.engine.presets.model_presets import ModelPreset, common_kwargs

KIMI_ATTENTION_INTERVAL: Final = 4
KIMI_EXPERTS: Final = 8
KIMI_TOP_K: Final = 2
KIMI_GROUPS: Final = 2
KIMI_ROUTED_SCALE: Final = 2.446
"""Kimi-Linear-48B-A3B's `routed_scaling_factor`."""


def kimi_linear_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.KimiLinearConfig` for preset `p` (see the
    module docstring)."""
    n = KIMI_ATTENTION_INTERVAL * max(1, len(p.mixers) // KIMI_ATTENTION_INTERVAL)
    types = ["full_attention" if (i + 1) % KIMI_ATTENTION_INTERVAL == 0 else "linear_attention"
             for i in range(n)]  # fmt: skip
    out: dict[str, Any] = {
        **common_kwargs(p, initializer_range),
        "num_key_value_heads": p.num_attention_heads,
        "num_hidden_layers": n,
        "layer_types": types,
        "mlp_layer_types": ["dense"] + ["sparse"] * (n - 1),
        "hidden_act": "silu",
        "intermediate_size": p.gated_intermediate_size,
        "attention_bias": True,  # zero, but the last layer's o_proj lifts the printable logits
        "linear_num_heads": p.num_attention_heads,
        "linear_head_dim": p.head_dim,
        "linear_conv_kernel_dim": p.conv_kernel,
        "kv_lora_rank": 4 * p.head_dim,
        "q_lora_rank": None,
        "qk_nope_head_dim": p.head_dim,
        "qk_rope_head_dim": p.head_dim // 2,
        "v_head_dim": p.head_dim,
        "num_local_experts": KIMI_EXPERTS,
        "num_experts_per_tok": KIMI_TOP_K,
        "moe_intermediate_size": p.gated_intermediate_size * 5 // (4 * KIMI_EXPERTS),
        "n_shared_experts": 1,
        "n_group": KIMI_GROUPS,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": KIMI_ROUTED_SCALE,
    }
    del out["mlp_bias"]
    return out
