"""MiniMax's config parse and the lightning layer's cost model: layer kinds from
`layer_types`, the original `attn_type_list` or the class default, the residual factors
under both their names, GQA attention with RoPE over the whole head, the MoE router, the
decay buffers the loader skips, and ValueErrors naming the bad key."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import MiniMaxConfig

from marconi_ray.core.model.hf.arch import AttentionConfig, MoEConfig
from marconi_ray.core.model.hf.lightning import LightningConfig
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config
from marconi_ray.core.model.lightning_layer import LightningLayer

SMALL: dict[str, Any] = {
    "model_type": "minimax",
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 32,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
}


def test_parse_matches_transformers_layers():
    raw = MiniMaxConfig(
        **{k: v for k, v in SMALL.items() if k != "model_type"},
        layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"],
        full_attn_alpha_factor=2.0,
        linear_attn_beta_factor=0.5,
        mlp_alpha_factor=1.5,
    ).to_dict()
    arch = parse_hf_config(raw)
    kinds = [b.kind for b in arch.blocks]
    assert kinds == ["lightning", "moe", "attention", "moe", "lightning", "moe", "lightning", "moe"]
    assert [b.hf_layer for b in arch.blocks] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert arch.norm_residual
    factors = [(b.residual_alpha, b.residual_beta) for b in arch.blocks]
    assert factors[:4] == [(1.0, 0.5), (1.5, 1.0), (2.0, 1.0), (1.5, 1.0)]
    lightning, attn, moe = arch.blocks[0].config, arch.blocks[2].config, arch.blocks[1].config
    assert lightning == LightningConfig(n_heads=4, head_dim=16, n_layers=4, activation="silu")
    assert isinstance(attn, AttentionConfig)
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim, attn.rotary_dim) == (4, 2, 16, 16)
    assert attn.rope_theta == 1000000.0 and not attn.bias
    assert moe == MoEConfig(32, 4, 2, "silu", gated=True, norm_topk=True, scoring="softmax")
    assert arch.skipped_weights == tuple(
        f"model.layers.{i}.self_attn.{b}"
        for i in (0, 2, 3)
        for b in ("slope_rate", "query_decay", "key_decay", "diagonal_decay")
    )


def test_original_checkpoint_keys():
    """MiniMax-Text-01's own config.json names: `attn_type_list` (1: softmax attention),
    `layernorm_*_alpha` / `_beta`, a legacy top-level `rope_theta`, and a rotary width
    the transformers model ignores (it rotates the whole head)."""
    raw = {
        **SMALL,
        "attn_type_list": [0, 0, 1, 0],
        "layernorm_full_attention_alpha": 3.5,
        "layernorm_linear_attention_alpha": 3.5,
        "layernorm_mlp_alpha": 3.5,
        "layernorm_mlp_beta": 1.0,
        "rope_theta": 10000000,
        "rotary_dim": 8,
    }
    arch = parse_hf_config(raw)
    assert [b.kind for b in arch.blocks[::2]] == [
        "lightning",
        "lightning",
        "attention",
        "lightning",
    ]
    assert {(b.residual_alpha, b.residual_beta) for b in arch.blocks} == {(3.5, 1.0)}
    attn = arch.blocks[4].config
    assert isinstance(attn, AttentionConfig)
    assert (attn.rope_theta, attn.rotary_dim) == (10000000.0, 16)


def test_default_layer_types_alternate_from_full_attention():
    arch = parse_hf_config(SMALL)
    assert [b.kind for b in arch.blocks[::2]] == ["attention", "lightning"] * 2
    assert parse_hf_config(SMALL).blocks == parse_hf_config(MiniMaxConfig(**{
        k: v for k, v in SMALL.items() if k != "model_type"}).to_dict()).blocks  # fmt: skip


def test_lightning_cost_model():
    """FLOPs per token and the state: qkv 2*D*3W, gate 2*D*W, recurrence 6*H*hd^2,
    norm and gate 5*W, out 2*W*D; the state H*hd^2 elements (float32: 4 bytes each)
    and no conv state, KV or quadratic term."""
    layer = LightningLayer(d_model=64, n_heads=4, head_dim=16)
    d, w = 64, 64
    c1 = 2 * d * 3 * w + 2 * d * w + 6 * 4 * 16 * 16 + 5 * w + 2 * w * d
    assert layer.total_flops_coeffs() == (float(c1), 0.0)
    assert (layer.state_bytes(4), layer.conv_bytes(4), layer.kv_bytes_per_token(4)) == (
        4 * 16 * 16 * 4,
        0,
        0,
    )
    spec = spec_from_hf_config(
        {**SMALL, "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
        dtype_bytes=2,
        state_dtype_bytes=4,
    )
    assert spec.ssm_state_bytes == 3 * 4 * 16 * 16 * 4
    assert spec.kv_bytes_per_token == 2 * 2 * 16 * 2
    assert (spec.n_ssm, spec.n_attention, spec.n_mlp) == (3, 1, 4)
    with pytest.raises(ValueError, match="head_dim"):
        LightningLayer(64, 4, 0)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"layer_types": ["linear_attention", "conv"] * 2}, "unknown layer type 'conv'"),
        ({"layer_types": ["linear_attention"] * 3}, "3 layer types for num_hidden_layers=4"),
        ({"attn_type_list": [0, 2, 1, 0]}, "'attn_type_list' must hold 0"),
        ({"sliding_window": 128}, "'sliding_window' must be null"),
        ({"mlp_beta_factor": float("inf")}, "'mlp_beta_factor' must be a finite number"),
        ({"layernorm_mlp_alpha": "x"}, "'mlp_alpha_factor' must be a number"),
        ({"num_local_experts": 0}, "'num_local_experts' must be a positive int"),
        ({"hidden_act": None}, "'hidden_act' must be a string"),
    ],
)
def test_bad_config_raises_naming_the_key(extra, needle):
    with pytest.raises(ValueError, match=needle):
        parse_hf_config({**SMALL, **extra})


def test_sliding_window_without_softmax_layers_is_accepted():
    """The window only concerns softmax attention layers."""
    arch = parse_hf_config({**SMALL, "layer_types": ["linear_attention"] * 4, "sliding_window": 8})
    assert {b.kind for b in arch.blocks} == {"lightning", "moe"}


def test_bare_config_parses_like_the_class_defaults():
    """Every field of a bare {"model_type": "minimax"} equals the parse of
    `MiniMaxConfig()`: the defaults in `hf.defaults` match transformers'."""
    full = parse_hf_config(MiniMaxConfig().to_dict())
    assert parse_hf_config({"model_type": "minimax"}) == full
    assert (full.hidden_size, full.vocab_size, full.max_position) == (4096, 32000, 131072)
    assert full.eos_token_ids == (2,) and not full.tie_embeddings
