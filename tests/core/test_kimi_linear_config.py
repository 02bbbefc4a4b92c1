"""Kimi Linear's config parse: the checkpoint's own config.json form (linear_attn_config,
first_k_dense_replace, the attribute_map names) and the form transformers saves
(layer_types, mlp_layer_types, linear_* keys) give the same architecture; the cost model
of KDA and MLA; bad values are ValueErrors naming the key."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import KimiLinearConfig

from marconi_ray.core.model.hf.kda_arch import KDAConfig
from marconi_ray.core.model.hf.mla_arch import MLAConfig
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config
from marconi_ray.core.model.kimi_layers import KDALayer, MLALayer
from marconi_ray.core.model.layers import MLPLayer, MoELayer

HUB: dict[str, Any] = {
    "model_type": "kimi_linear",
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "q_lora_rank": None,
    "num_experts": 8,
    "num_experts_per_token": 2,
    "num_shared_experts": 1,
    "num_expert_group": 2,
    "topk_group": 1,
    "moe_renormalize": True,
    "routed_scaling_factor": 2.446,
    "first_k_dense_replace": 2,
    "model_max_length": 8192,
    "linear_attn_config": {
        "full_attn_layers": [4],
        "kda_layers": [1, 2, 3, 5],
        "head_dim": 8,
        "num_heads": 2,
        "short_conv_kernel_size": 4,
    },
}
"""The shape of Kimi-Linear-48B-A3B's config.json, scaled down."""


def test_checkpoint_form_parses_like_transformers_reads_it():
    """The hub form, and transformers' own reading of it saved back (`to_dict`), give the
    same blocks: KDA at the 1-indexed kda_layers, MLA at full_attn_layers, the first two
    feed-forwards dense."""
    arch = parse_hf_config(HUB)
    kinds = [b.kind for b in arch.blocks]
    assert kinds == ["kda", "mlp", "kda", "mlp", "kda", "moe", "mla", "moe", "kda", "moe"]
    saved = KimiLinearConfig(**{k: v for k, v in HUB.items() if k != "model_type"}).to_dict()
    assert saved["layer_types"][3] == "full_attention" and saved["linear_head_dim"] == 8
    assert parse_hf_config(saved).blocks == arch.blocks
    bare = {
        k: v for k, v in saved.items() if k not in ("linear_attn_config", "first_k_dense_replace")
    }
    assert parse_hf_config(bare).blocks == arch.blocks  # from layer_types and linear_*
    kda = arch.blocks[0].config
    assert kda == KDAConfig(n_heads=2, head_dim=8, d_conv=4)
    mla = arch.blocks[6].config
    assert mla == MLAConfig(4, 32, 16, 8, 16, None, False)
    moe = arch.blocks[5].config
    assert (moe.n_experts, moe.top_k, moe.n_group, moe.topk_group) == (8, 2, 2, 1)
    assert (moe.scoring, moe.selection_bias, moe.norm_topk) == ("sigmoid", True, True)
    assert (moe.n_shared_experts, moe.shared_intermediate_size) == (1, 16)
    assert moe.routed_scale == 2.446 and arch.max_position == 8192


def test_cost_model_prices_latent_rows_and_kda_states():
    spec = spec_from_hf_config(HUB, dtype_bytes=2, state_dtype_bytes=4)
    kda = KDALayer(64, 2, 8, 4)
    mla = MLALayer(64, 4, 32, 16, 8, 16)
    assert spec.layers[0] == kda and spec.layers[6] == mla
    assert spec.kv_bytes_per_token == (32 + 8) * 2  # the latent and k_rope, not K and V
    assert spec.ssm_state_bytes == 4 * (2 * (3 * 16 * 4) + 4 * (2 * 8 * 8))
    c1, c2 = mla.total_flops_coeffs()
    q, kv_a, kv_b, o = 2 * 64 * 4 * 24, 2 * 64 * 40, 2 * 32 * 4 * 32, 2 * 4 * 16 * 64
    assert (c1, c2) == (q + kv_a + kv_b + o, 2 * 4 * (24 + 16))
    lora = MLALayer(64, 4, 32, 16, 8, 16, q_lora_rank=12)
    assert lora.total_flops_coeffs()[0] == c1 - q + 2 * 64 * 12 + 2 * 12 * 4 * 24
    k1, k2 = kda.total_flops_coeffs()
    proj = 2 * 64 * (3 * 16 + 2) + 2 * (2 * 64 * 8 + 2 * 8 * 16)
    assert (k1, k2) == (proj + 2 * 48 * 4 + 8 * 2 * 64 + 5 * 16 + 2 * 16 * 64, 0.0)
    assert spec.layers[1] == MLPLayer(64, 96, gated=True)
    assert isinstance(spec.layers[5], MoELayer)


def test_defaults_put_attention_every_fourth_layer():
    arch = parse_hf_config({"model_type": "kimi_linear", "num_hidden_layers": 9})
    mixers = [b.kind for b in arch.blocks if b.kind in ("kda", "mla")]
    assert mixers == ["kda"] * 4 + ["mla"] + ["kda"] * 3 + ["mla"]
    assert [b.kind for b in arch.blocks][1] == "mlp"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"linear_attn_config": {**HUB["linear_attn_config"], "kda_layers": [1, 2, 3]}},
         r"gives no type to layers \[5\]"),
        ({"linear_attn_config": {**HUB["linear_attn_config"], "kda_layers": [0, 1, 2, 3, 5]}},
         "linear_attn_config.kda_layers"),
        ({"linear_attn_config": {**HUB["linear_attn_config"], "num_heads": 0}},
         "linear_attn_config.num_heads"),
        ({"layer_types": ["linear_attention"] * 4}, "layer_types"),
        ({"mlp_layer_types": ["dense", "moe", "dense", "dense", "dense"]}, "mlp_layer_types"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_expert_group": 3}, "n_group=3"),
        ({"kv_lora_rank": 0}, "kv_lora_rank"),
    ],
)  # fmt: skip
def test_bad_values_name_the_key(change, needle):
    with pytest.raises(ValueError, match=needle):
        parse_hf_config({**HUB, **change})
