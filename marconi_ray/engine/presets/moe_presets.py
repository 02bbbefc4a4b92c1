"""Preset configs of the mixture-of-experts hybrids: NemotronH with MoE layers
(`nemotron_h_moe`, Nemotron 3 Nano's layout), Jamba with experts, Granite 4.0-H.

`nemotron_h_moe` is a make-model family, not a `model_type`: its checkpoint is a
NemotronH (`model_type` "nemotron_h") whose `-` layers are `E` (MoE) layers, so
`tiny:nemotron_h_moe` and `tiny:nemotron_h` are two folders of one architecture.

Each family takes the preset's widths with its own layer mix, and every one of them
lifts the printable logits (see `engine.presets.factory`) through the output-projection bias of
its last layer's mixer, not through an MLP bias (Jamba's and Granite's MLPs have none,
and NemotronH's `mlp_bias` would also give the shared experts and latent projections
biases):

- nemotron_h_moe: the pattern with every `-` an `E`, then one more Mamba-2 layer (`M`,
  whose `out_proj` bias, `use_bias`, carries the lift), which is the last block. Routed
  experts: `MOE_EXPERTS` relu2 experts together as wide as the MLP, top `MOE_TOP_K`
  within the best of 2 groups by sigmoid score plus a selection bias (random in the
  built weights), renormalised, times `NEMOTRON_ROUTED_SCALE`; they run between latent
  projections to half the hidden size; a shared expert of half the MLP width.
- jamba: one layer per mixer of the pattern (Mamba-1 of the preset's Mamba-2 d_inner
  and conv width, d_state half the preset's, at most `JAMBA_D_STATE`), attention every
  `period` layers at offset `period // 2` (period = layers / attention layers) so the
  last layer is Mamba-1, whose `out_proj` bias (`mamba_proj_bias`) carries the lift;
  MoE in every other layer (`JAMBA_EXPERTS` gated experts, top 2, unnormalised
  softmax); the dense MLPs and the experts are half the gated MLP width (Jamba has one
  `intermediate_size` for both).
- granitemoehybrid: one layer per mixer of the pattern, each followed by `MOE_EXPERTS`
  gated experts of an eighth of the gated MLP width and a shared MLP of a quarter; no RoPE
  (Granite 4.0-H's `position_embedding_type` "nope"); muP multipliers as in the
  released models (`GRANITE_SCALES`); the lift is the last layer's attention `o_proj`
  bias or Mamba-2 `out_proj` bias.

Exact parameter counts (from `factory.count_parameters`, meta device):

| preset          | nemotron_h_moe | jamba         | granitemoehybrid |
|-----------------|----------------|---------------|------------------|
| tiny            | 275,392        | 316,220       | 337,444          |
| small           | 52,923,456     | 55,018,496    | 56,310,784       |
| paper-7b-shape  | 7,400,395,264  | 7,665,068,800 | 7,769,669,632    |
"""

from __future__ import annotations

from typing import Any, Final

from marconi_ray.engine.presets.model_presets import (
    MOE_HYBRIDS,
    ModelPreset,
    common_kwargs,
    mamba2_kwargs,
    nemotron_h_kwargs,
)

MOE_EXPERTS: Final = 8
MOE_TOP_K: Final = 2
JAMBA_EXPERTS: Final = 4
JAMBA_D_STATE: Final = 16
"""Jamba's released Mamba-1 state size; a preset uses half its Mamba-2 d_state, at most this
(tiny: 8, which keeps the Triton-interpreter tests of Mamba-1 fast)."""
NEMOTRON_ROUTED_SCALE: Final = 2.5
GRANITE_SCALES: Final = {
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "logits_scaling": 8.0,
}
"""Granite 4.0-H's muP multipliers; the attention multiplier is 1 / head_dim."""


def _no_mlp_bias(p: ModelPreset, initializer_range: float) -> dict[str, Any]:
    out = common_kwargs(p, initializer_range)
    del out["mlp_bias"]
    return out


def nemotron_h_moe_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.NemotronHConfig` for `p` with MoE layers: the
    dense preset's (`nemotron_h_kwargs`) with every `-` an `E` and a last `M` layer."""
    block = {"M": "linear_attention", "*": "full_attention", "-": "moe"}
    return {
        **nemotron_h_kwargs(p, initializer_range),
        "mlp_bias": False,
        "use_bias": True,  # zero, but the last Mamba-2's out_proj lifts the logits
        "layers_block_type": [block[c] for c in p.pattern + "M"],
        "n_routed_experts": MOE_EXPERTS,
        "num_experts_per_tok": MOE_TOP_K,
        "moe_intermediate_size": p.intermediate_size // MOE_EXPERTS,
        "moe_shared_expert_intermediate_size": p.intermediate_size // 2,
        "moe_latent_size": p.hidden_size // 2,
        "n_group": 2,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": NEMOTRON_ROUTED_SCALE,
    }


def jamba_layout(n_layers: int, n_attention: int) -> tuple[int, int]:
    """(attn_layer_period, attn_layer_offset) spreading `n_attention` attention layers
    over `n_layers`, the last layer Mamba-1 (ValueError naming the counts otherwise)."""
    period = max(1, round(n_layers / max(1, n_attention)))
    offset = period // 2
    if period < 2 or (n_layers - 1) % period == offset:
        raise ValueError(
            f"jamba preset: {n_attention} attention layers in {n_layers} leave no Mamba-1 "
            "last layer"
        )
    return period, offset


def jamba_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.JambaConfig` for `p`."""
    mixers = p.mixers
    period, offset = jamba_layout(len(mixers), mixers.count("*"))
    return {
        **_no_mlp_bias(p, initializer_range),
        "num_hidden_layers": len(mixers),
        "attn_layer_period": period,
        "attn_layer_offset": offset,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": JAMBA_EXPERTS,
        "num_experts_per_tok": MOE_TOP_K,
        "intermediate_size": p.gated_intermediate_size // 2,
        "hidden_act": "silu",
        "mamba_d_state": min(JAMBA_D_STATE, p.ssm_state_size // 2),
        "mamba_d_conv": p.conv_kernel,
        "mamba_expand": 2,
        "mamba_proj_bias": True,  # zero, but the last layer's out_proj lifts the logits
    }


def granite_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.GraniteMoeHybridConfig` for `p`."""
    mixers = p.mixers
    last_attention = mixers[-1] == "*"
    return {
        **_no_mlp_bias(p, initializer_range),
        **GRANITE_SCALES,
        "attention_multiplier": 1.0 / p.head_dim,
        "num_hidden_layers": len(mixers),
        "layer_types": ["attention" if c == "*" else "mamba" for c in mixers],
        "position_embedding_type": "nope",
        "attention_bias": last_attention,
        "mamba_proj_bias": not last_attention,
        "num_local_experts": MOE_EXPERTS,
        "num_experts_per_tok": MOE_TOP_K,
        "intermediate_size": p.gated_intermediate_size // MOE_EXPERTS,
        "shared_intermediate_size": p.gated_intermediate_size // 4,
        "hidden_act": "silu",
        **mamba2_kwargs(p),
        "mamba_expand": 2,
    }


def moe_preset_config(p: ModelPreset, family: str, initializer_range: float = 0.02) -> Any:
    """The transformers config of preset `p` as one of `MOE_HYBRIDS`."""
    import transformers

    if family == "nemotron_h_moe":
        return transformers.NemotronHConfig(**nemotron_h_moe_kwargs(p, initializer_range))
    if family == "jamba":
        return transformers.JambaConfig(**jamba_kwargs(p, initializer_range))
    if family == "granitemoehybrid":
        return transformers.GraniteMoeHybridConfig(**granite_kwargs(p, initializer_range))
    raise ValueError(f"unknown MoE preset family {family!r}; valid: {list(MOE_HYBRIDS)}")
