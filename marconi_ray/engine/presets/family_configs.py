"""`preset_config`: the transformers config (no weights) of a named preset built as one
family: the dense and Gated DeltaNet families from `model_presets`' keywords, the
mixture-of-experts hybrids (`MOE_HYBRIDS`) from `moe_presets`, the pure state-space
families (`PURE_SSM_FAMILIES`) from `ssm_presets`, OLMo Hybrid from `olmo_presets`.

transformers is imported on the first call, so importing this module stays light.
"""

from __future__ import annotations

from typing import Any

from marconi_ray.engine.presets.bailing_presets import bailing_hybrid_kwargs
from marconi_ray.engine.presets.kimi_presets import kimi_linear_kwargs
from marconi_ray.engine.presets.lfm3_presets import lfm3_kwargs
from marconi_ray.engine.presets.minimax_presets import minimax_kwargs
from marconi_ray.engine.presets.model_presets import (
    LFM2_FAMILIES,
    MOE_HYBRIDS,
    PURE_SSM_FAMILIES,
    ModelPreset,
    bamba_kwargs,
    check_family,
    falcon_kwargs,
    get_preset,
    lfm2_kwargs,
    nemotron_h_kwargs,
    qwen_kwargs,
    zamba2_kwargs,
)
from marconi_ray.engine.presets.moe_presets import moe_preset_config
from marconi_ray.engine.presets.olmo_presets import olmo_preset_config
from marconi_ray.engine.presets.rgemma_presets import recurrent_gemma_kwargs
from marconi_ray.engine.presets.ssm_presets import ssm_preset_config
from marconi_ray.engine.presets.xlstm_presets import xlstm_kwargs


def _vision_kwargs(p: ModelPreset) -> dict[str, Any]:
    """The smallest vision tower of a multimodal Qwen3.5 checkpoint (its weights are saved
    and skipped by the engine, which serves text)."""
    return {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": p.hidden_size,
    }


def preset_config(preset: str, family: str, *, initializer_range: float = 0.02) -> Any:
    """The transformers config (no weights) of `preset` built as `family`.

    ValueError naming the value for an unknown preset or family.
    """
    p = get_preset(preset)
    check_family(family)
    import transformers

    if family == "nemotron_h":
        return transformers.NemotronHConfig(**nemotron_h_kwargs(p, initializer_range))
    if family == "bamba":
        return transformers.BambaConfig(**bamba_kwargs(p, initializer_range))
    if family == "falcon_h1":
        return transformers.FalconH1Config(**falcon_kwargs(p, initializer_range))
    if family == "zamba2":
        return transformers.Zamba2Config(**zamba2_kwargs(p, initializer_range))
    if family in LFM2_FAMILIES:
        cls = transformers.Lfm2Config if family == "lfm2" else transformers.Lfm2MoeConfig
        return cls(**lfm2_kwargs(p, family, initializer_range))
    if family == "kimi_linear":
        return transformers.KimiLinearConfig(**kimi_linear_kwargs(p, initializer_range))
    if family in MOE_HYBRIDS:
        return moe_preset_config(p, family, initializer_range)
    if family in PURE_SSM_FAMILIES:
        return ssm_preset_config(p, family, initializer_range)
    if family == "olmo_hybrid":
        return olmo_preset_config(p, initializer_range)
    if family == "recurrent_gemma":
        return transformers.RecurrentGemmaConfig(**recurrent_gemma_kwargs(p))
    if family == "minimax":
        return transformers.MiniMaxConfig(**minimax_kwargs(p, initializer_range))
    if family == "bailing_hybrid":
        return transformers.BailingHybridConfig(**bailing_hybrid_kwargs(p, initializer_range))
    if family == "lfm3":
        return transformers.Lfm3Config(**lfm3_kwargs(p))
    if family == "xlstm":
        return transformers.xLSTMConfig(**xlstm_kwargs(p))
    text = qwen_kwargs(p, family, initializer_range)
    if family in ("qwen3_5", "qwen3_5_moe"):
        outer = transformers.Qwen3_5Config if family == "qwen3_5" else transformers.Qwen3_5MoeConfig
        return outer(text_config=text, vision_config=_vision_kwargs(p), tie_word_embeddings=False)
    classes = {
        "qwen3_5_text": transformers.Qwen3_5TextConfig,
        "qwen3_5_moe_text": transformers.Qwen3_5MoeTextConfig,
        "qwen3_next": transformers.Qwen3NextConfig,
    }
    return classes[family](**text)
