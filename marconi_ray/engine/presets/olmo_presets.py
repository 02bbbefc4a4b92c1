"""Preset configs of OLMo Hybrid (`olmo_hybrid`): Gated DeltaNet layers with OLMo's
separate projections and negative eigenvalues, and post-norm attention layers with
whole-projection q/k norms (see `core.model.hf.olmo`).

Layers as the Qwen presets lay them out (`model_presets.qwen_kwargs`): three Gated
DeltaNet layers then one attention layer, `QWEN_ATTENTION_INTERVAL` at a time, so the
last layer is attention; Gated DeltaNet with the preset's Mamba-2 value heads and widths
and half as many key heads; RoPE over the whole head (OLMo's attention is plain MHA/GQA
of hidden / heads). OLMo has no MLP biases: the last attention layer's `o_proj` bias
(`attention_bias`, zero but that one) carries the lift (see `engine.presets.factory`).

Exact parameter counts (from `factory.count_parameters`, meta device):

| preset          | olmo_hybrid   |
|-----------------|---------------|
| tiny            | 280,024       |
| small           | 40,007,232    |
| paper-7b-shape  | 7,163,498,048 |
"""

from __future__ import annotations

from typing import Any

from marconi_ray.engine.presets.model_presets import (
    QWEN_ATTENTION_INTERVAL,
    ModelPreset,
    common_kwargs,
)


def olmo_hybrid_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.OlmoHybridConfig` for `p`."""
    groups = max(1, len(p.mixers) // QWEN_ATTENTION_INTERVAL)
    types = (["linear_attention"] * (QWEN_ATTENTION_INTERVAL - 1) + ["full_attention"]) * groups
    out = common_kwargs(p, initializer_range)
    del out["mlp_bias"]
    return {
        **out,
        "num_hidden_layers": len(types),
        "layer_types": types,
        "intermediate_size": p.gated_intermediate_size,
        "hidden_act": "silu",
        "attention_bias": True,
        "linear_num_value_heads": p.mamba_num_heads,
        "linear_num_key_heads": p.mamba_num_heads // 2,
        "linear_key_head_dim": p.mamba_head_dim,
        "linear_value_head_dim": p.mamba_head_dim,
        "linear_conv_kernel_dim": p.conv_kernel,
        "linear_allow_neg_eigval": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    }


def olmo_preset_config(p: ModelPreset, initializer_range: float = 0.02) -> Any:
    """The transformers config of preset `p` as OLMo Hybrid."""
    import transformers

    return transformers.OlmoHybridConfig(**olmo_hybrid_kwargs(p, initializer_range))
