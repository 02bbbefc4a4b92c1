"""Preset configs of the pure state-space families (`PURE_SSM_FAMILIES`): Mamba,
Falcon-Mamba and Mamba-2 (Codestral Mamba's architecture). They have no attention and
no feed-forward, so they keep no KV: every cached prefix is a state.

Each takes one Mamba layer per mixer of the preset's pattern (`ModelPreset.mixers`: tiny
5, small 8), at the preset's hidden size:
- mamba, falcon_mamba: Mamba-1 of expand 2 and the preset's conv width, d_state half the
  preset's, at most `MAMBA1_D_STATE` (tiny: 8, which keeps the Triton-interpreter tests
  fast), dt rank "auto" (hidden / 16);
- mamba2: the preset's Mamba-2 heads, head width, groups, state size, conv width and chunk.
The LM head is untied (the released Mamba-1 models tie it; the factory rewrites the
head's rows, which would rewrite a tied embedding table). Every in_proj / out_proj has a
bias (`use_bias`, zero but the last layer's `out_proj`, which lifts the printable logits:
see `engine.presets.factory`).

Exact parameter counts (from `factory.count_parameters`, meta device):

| preset          | mamba         | falcon_mamba  | mamba2        |
|-----------------|---------------|---------------|---------------|
| tiny            | 215,360       | 215,360       | 218,000       |
| small           | 17,502,720    | 17,502,720    | 19,080,320    |
| paper-7b-shape  | 3,211,464,704 | 3,211,464,704 | 3,332,704,256 |
"""

from __future__ import annotations

from typing import Any, Final

from marconi_ray.engine.presets.model_presets import (
    PURE_SSM_FAMILIES,
    ModelPreset,
    common_kwargs,
)

MAMBA1_D_STATE: Final = 16
"""The released Mamba / Falcon-Mamba state size; a preset uses half its Mamba-2 d_state, at
most this."""


def _ssm_common(p: ModelPreset, initializer_range: float) -> dict[str, Any]:
    out = common_kwargs(p, initializer_range)
    for key in ("num_attention_heads", "num_key_value_heads", "mlp_bias"):
        del out[key]
    return {
        **out,
        "num_hidden_layers": len(p.mixers),
        "conv_kernel": p.conv_kernel,
        "expand": 2,
        "use_bias": True,
        "use_conv_bias": True,
        "layer_norm_epsilon": 1e-5,
    }


def mamba1_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.MambaConfig` / `FalconMambaConfig` for `p`."""
    return {
        **_ssm_common(p, initializer_range),
        "state_size": min(MAMBA1_D_STATE, p.ssm_state_size // 2),
    }


def mamba2_ssm_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.Mamba2Config` for `p`."""
    return {
        **_ssm_common(p, initializer_range),
        "num_heads": p.mamba_num_heads,
        "head_dim": p.mamba_head_dim,
        "n_groups": p.n_groups,
        "state_size": p.ssm_state_size,
        "chunk_size": p.chunk_size,
    }


def ssm_preset_config(p: ModelPreset, family: str, initializer_range: float = 0.02) -> Any:
    """The transformers config of preset `p` as one of `PURE_SSM_FAMILIES`."""
    import transformers

    if family == "mamba":
        return transformers.MambaConfig(**mamba1_kwargs(p, initializer_range))
    if family == "falcon_mamba":
        return transformers.FalconMambaConfig(**mamba1_kwargs(p, initializer_range))
    if family == "mamba2":
        return transformers.Mamba2Config(**mamba2_ssm_kwargs(p, initializer_range))
    raise ValueError(f"unknown pure-SSM family {family!r}; valid: {list(PURE_SSM_FAMILIES)}")
