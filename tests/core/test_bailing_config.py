"""Ling hybrid's config parse: the checkpoint form (attribute_map names, layer_group_size,
first_k_dense_replace) and the form transformers saves (layer_types, mlp_layer_types,
linear_* keys, head_dim overwritten by qk_rope_head_dim) give the same architecture, as
`BailingHybridConfig` reads it; the cost model of Ling's KDA and MLA; bad values are
ValueErrors naming the key."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import BailingHybridConfig

from marconi_ray.core.model.hf.kda_arch import KDAConfig
from marconi_ray.core.model.hf.mla_arch import MLAConfig
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config
from marconi_ray.core.model.kimi_layers import KDALayer, MLALayer
from marconi_ray.core.model.layers import MLPLayer, MoELayer

HUB: dict[str, Any] = {
    "model_type": "bailing_hybrid",
    "architectures": ["BailingMoeV3ForCausalLM"],  # Ling 3's own files name this class
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 8,
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
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 2,
    "layer_group_size": 2,
    "short_conv_kernel_size": 4,
    "rope_theta": 600000.0,
    "model_max_length": 8192,
    "pad_token_id": 0,
    "eos_token_id": 1,
}
"""The shape of a Ling hybrid config.json, scaled down."""


def test_checkpoint_form_parses_like_transformers_reads_it():
    """The hub form and transformers' reading of it saved back (`to_dict`) give the same
    blocks: MLA at every second layer (layer_group_size 2), the first two feed-forwards
    dense; KDA with head_dim 8 although the saved `head_dim` is qk_rope_head_dim."""
    arch = parse_hf_config(HUB)
    kinds = [b.kind for b in arch.blocks]
    assert kinds == ["kda", "mlp", "mla", "mlp", "kda", "moe", "mla", "moe", "kda", "moe"]
    hf = BailingHybridConfig(**{k: v for k, v in HUB.items() if k != "model_type"})
    saved = hf.to_dict()
    assert saved["head_dim"] == 8 and saved["linear_head_dim"] == 8
    assert hf.layer_types[1] == "full_attention" and hf.mlp_layer_types[2] == "sparse"
    assert parse_hf_config(saved).blocks == arch.blocks
    bare = {
        k: v for k, v in saved.items() if k not in ("layer_group_size", "first_k_dense_replace")
    }
    assert parse_hf_config(bare).blocks == arch.blocks  # from layer_types, mlp_layer_types
    kda = arch.blocks[0].config
    assert kda == KDAConfig(
        n_heads=hf.linear_num_heads,
        head_dim=hf.linear_head_dim,
        d_conv=hf.linear_conv_kernel_dim,
        low_rank_gates=False,
        gate_lower_bound=hf.kda_lower_bound,
    )
    mla = arch.blocks[2].config
    assert mla == MLAConfig(
        4, 32, 16, 8, 16, None, False, rope_theta=hf.rope_parameters["rope_theta"], head_gate=True
    )
    moe = arch.blocks[5].config
    assert (moe.n_experts, moe.top_k) == (hf.num_local_experts, hf.num_experts_per_tok)
    assert (moe.n_group, moe.topk_group) == (hf.n_group, hf.topk_group)
    assert (moe.scoring, moe.selection_bias, moe.norm_topk) == ("sigmoid", True, True)
    assert (moe.n_shared_experts, moe.shared_intermediate_size) == (1, 16)
    assert moe.routed_scale == 2.5 and arch.max_position == 8192
    assert arch.eos_token_ids == (1,) and not arch.tie_embeddings


def test_unsafe_gate_and_rope_parameters():
    """kda_safe_gate false is Kimi's unbounded gate; rope_parameters' theta wins over the
    legacy key as transformers reads it."""
    arch = parse_hf_config(
        {
            **HUB,
            "kda_safe_gate": False,
            "rope_parameters": {"rope_type": "default", "rope_theta": 5e4},
        }
    )
    assert arch.blocks[0].config.gate_lower_bound is None
    assert arch.blocks[2].config.rope_theta == 5e4
    legacy = parse_hf_config({**HUB, "rope_scaling": None, "rope_theta": 123.0})
    assert legacy.blocks[2].config.rope_theta == 123.0  # Ling 3's files: rope_scaling null


def test_defaults_are_the_config_class_defaults():
    arch = parse_hf_config({"model_type": "bailing_hybrid"})
    hf = BailingHybridConfig()
    mixers = [b.kind for b in arch.blocks if b.kind in ("kda", "mla")]
    assert mixers == ["mla" if t == "full_attention" else "kda" for t in hf.layer_types]
    ffns = [b.kind for b in arch.blocks if b.kind in ("mlp", "moe")]
    assert ffns == ["mlp" if t == "dense" else "moe" for t in hf.mlp_layer_types]
    kda, mla = arch.blocks[0].config, arch.blocks[10].config
    assert (kda.n_heads, kda.head_dim, kda.d_conv) == (32, 128, 4)
    assert (mla.kv_lora_rank, mla.qk_rope_head_dim, mla.rope_theta) == (512, 64, 6e6)
    assert arch.vocab_size == hf.vocab_size and arch.norm_eps == hf.rms_norm_eps


def test_cost_model_prices_latent_rows_and_kda_states():
    spec = spec_from_hf_config(HUB, dtype_bytes=2, state_dtype_bytes=4)
    kda = KDALayer(64, 4, 8, 4, low_rank_gates=False)
    mla = MLALayer(64, 4, 32, 16, 8, 16, head_gate=True)
    assert spec.layers[0] == kda and spec.layers[2] == mla
    assert spec.kv_bytes_per_token == 2 * (32 + 8) * 2  # two MLA layers: latent + k_rope
    # three KDA layers: conv 3 * 32 channels x 4 taps (model dtype), state 4 x 8 x 8 (float32)
    assert spec.ssm_state_bytes == 3 * (2 * (3 * 32 * 4) + 4 * (4 * 8 * 8))
    k1, k2 = kda.total_flops_coeffs()
    proj = 2 * 64 * (3 * 32 + 4) + 2 * (2 * 64 * 32)  # q/k/v/beta, full-rank f and g
    assert (k1, k2) == (proj + 2 * 96 * 4 + 8 * 4 * 64 + 5 * 32 + 2 * 32 * 64, 0.0)
    c1, c2 = mla.total_flops_coeffs()
    q, kv_a, kv_b, o, gate = (
        2 * 64 * 4 * 24,
        2 * 64 * 40,
        2 * 32 * 4 * 32,
        2 * 4 * 16 * 64,
        2 * 64 * 4,
    )
    assert (c1, c2) == (q + kv_a + kv_b + o + gate, 2 * 4 * (24 + 16))
    assert spec.layers[1] == MLPLayer(64, 96, gated=True)
    assert isinstance(spec.layers[5], MoELayer)


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"layer_types": ["linear_attention"] * 4}, "layer_types"),
        ({"mlp_layer_types": ["dense", "moe", "dense", "dense", "dense"]}, "mlp_layer_types"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"num_expert_group": 3}, "n_group=3"),
        ({"kv_lora_rank": 0}, "kv_lora_rank"),
        ({"layer_group_size": 0}, "layer_group_size"),
        ({"kda_lower_bound": 1.0}, "kda_lower_bound"),
        ({"kda_safe_gate": "yes"}, "kda_safe_gate"),
        ({"expert_swiglu_limit_list": [0, 0, 7.0, 0, 0]}, "expert_swiglu_limit_list"),
        ({"share_expert_swiglu_limit_list": [0]}, "share_expert_swiglu_limit_list"),
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "rope_type 'yarn'"),
        ({"qk_rope_head_dim": 7}, "qk_rope_head_dim"),
        ({"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling"),
        ({"linear_head_dim": 0}, "linear_head_dim"),
        ({"architectures": ["BailingMoeV2_5ForCausalLM"]}, "'architectures'.*Ling 2.5"),
    ],
)  # fmt: skip
def test_bad_values_name_the_key(change, needle):
    with pytest.raises(ValueError, match=needle):
        parse_hf_config({**HUB, **change})
