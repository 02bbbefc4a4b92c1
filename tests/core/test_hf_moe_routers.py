"""The MoE families' router fields and muP multipliers as parsed from transformers' own
configs (NemotronH grouped sigmoid, Jamba unnormalised softmax, Granite 4.0-H)."""

from __future__ import annotations

from transformers import GraniteMoeHybridConfig, JambaConfig, NemotronHConfig

from marconi_ray.core.model.hf.arch import AttentionConfig, MoEConfig, Scales
from marconi_ray.core.model.hf.parse import parse_hf_config


def _moe(arch) -> MoEConfig:
    (moe,) = arch.configs_of("moe")
    assert isinstance(moe, MoEConfig)
    return moe


def test_nemotron_h_router_is_a_grouped_biased_sigmoid() -> None:
    cfg = NemotronHConfig(
        hidden_size=64, layers_block_type=["moe", "full_attention"], n_routed_experts=8,
        num_experts_per_tok=2, n_group=4, topk_group=2, norm_topk_prob=False,
        routed_scaling_factor=2.5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    ).to_dict()  # fmt: skip
    moe = _moe(parse_hf_config(cfg))
    assert (moe.scoring, moe.selection_bias, moe.n_group, moe.topk_group) == (
        "sigmoid", True, 4, 2,
    )  # fmt: skip
    assert (moe.norm_topk, moe.routed_scale, moe.gated) == (False, 2.5, False)


def test_jamba_router_is_an_unnormalised_softmax() -> None:
    cfg = JambaConfig(num_experts=4, num_experts_per_tok=2, num_hidden_layers=2).to_dict()
    moe = _moe(parse_hf_config(cfg))
    assert (moe.scoring, moe.norm_topk, moe.selection_bias, moe.routed_scale) == (
        "softmax", False, False, 1.0,
    )  # fmt: skip


def test_granite_router_and_multipliers() -> None:
    cfg = GraniteMoeHybridConfig(
        hidden_size=64, num_hidden_layers=2, layer_types=["mamba", "attention"],
        num_attention_heads=4, num_local_experts=4, embedding_multiplier=12.0,
        residual_multiplier=0.22, logits_scaling=8.0, attention_multiplier=0.015625,
    ).to_dict()  # fmt: skip
    arch = parse_hf_config(cfg)
    moe = _moe(arch)
    assert (moe.scoring, moe.norm_topk, moe.n_shared_experts) == ("softmax", True, 1)
    assert arch.scales == Scales(embedding=12.0, residual=0.22, logits=0.125)
    (attn,) = arch.configs_of("attention")
    assert isinstance(attn, AttentionConfig) and attn.scale == 0.015625


def test_granite_defaults_scale_attention_by_one() -> None:
    """transformers scales Granite's scores by attention_multiplier (default 1.0), not by
    head_dim**-0.5."""
    arch = parse_hf_config({"model_type": "granitemoehybrid", "layer_types": ["attention"]})
    (attn,) = arch.configs_of("attention")
    assert isinstance(attn, AttentionConfig) and attn.scale == 1.0
    assert arch.scales == Scales()
