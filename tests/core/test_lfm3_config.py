"""LFM3's config parse: layer kinds from `layer_types` or the class's default cycle,
full and sliding-window attention with their own RoPE (proportional and default, the
frequencies equal transformers' rotary embedding), per-head gates, sandwich norms, LFM2's
short conv with LFM3's kernel, the cost numbers by hand, and ValueErrors naming the bad
key."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import Lfm3Config
from transformers.models.lfm3.modeling_lfm3 import Lfm3RotaryEmbedding

from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    MLPConfig,
    ShortConvConfig,
    SlidingAttentionConfig,
)
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config

SMALL: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 5,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 300,
    "sliding_window": 16,
    "layer_types": ["sliding_attention", "conv", "conv", "full_attention", "conv"],
}


def _raw(**kw: Any) -> dict[str, Any]:
    return Lfm3Config(**{**SMALL, **kw}).to_dict()


def _inv_freq(attn: AttentionConfig) -> torch.Tensor:
    """The per-pair frequencies the parse describes (see `AttentionConfig.rope_type`)."""
    hd = attn.head_dim
    if attn.rope_type == "proportional":
        turned = attn.rope_theta ** -(torch.arange(0, attn.rotary_dim, 2).float() / hd)
        return torch.cat((turned, torch.zeros(hd // 2 - attn.rotary_dim // 2)))
    return attn.rope_theta ** -(torch.arange(0, attn.rotary_dim, 2).float() / attn.rotary_dim)


def test_parse_matches_transformers_config():
    arch = parse_hf_config(_raw())
    kinds = [b.kind for b in arch.blocks]
    pairs = [("swa", "mlp"), ("shortconv", "mlp"), ("shortconv", "mlp"), ("attention", "mlp")]
    assert kinds == [k for pair in [*pairs, ("shortconv", "mlp")] for k in pair]
    assert [b.hf_layer for b in arch.blocks] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert arch.sandwich_norms and arch.tie_embeddings and arch.norm_eps == 1e-5
    assert arch.max_position == 128_000 and arch.eos_token_ids == (124_900,)
    swa, conv, full, mlp = (arch.blocks[i].config for i in (0, 2, 6, 1))
    assert conv == ShortConvConfig(d_conv=7, bias=False)
    assert mlp == MLPConfig(96, "silu", gated=True)
    assert full == AttentionConfig(
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        rotary_dim=8,
        rope_theta=1e6,
        rope_type="proportional",
        qk_norm=True,
        head_gate=True,
    )
    assert isinstance(swa, SlidingAttentionConfig) and swa.window == 16 and not swa.output_bias
    assert swa.attention == AttentionConfig(
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        rotary_dim=16,
        rope_theta=1e4,
        qk_norm=True,
        head_gate=True,
    )


@pytest.mark.parametrize("factor", [0.25, 0.5, 1.0])
def test_rope_frequencies_equal_transformers(factor):
    """Each attention kind's frequencies are transformers' rotary embedding's for it."""
    kw = {
        "rope_parameters": {
            "full_attention": {
                "rope_type": "proportional",
                "rope_theta": 5e5,
                "partial_rotary_factor": factor,
            },
            "sliding_attention": {"rope_type": "default", "rope_theta": 3e3},
        }
    }
    config = Lfm3Config(**SMALL, **kw)
    rotary = Lfm3RotaryEmbedding(config)
    arch = parse_hf_config(config.to_dict())
    full, swa = arch.blocks[6].config, arch.blocks[0].config
    assert isinstance(full, AttentionConfig) and isinstance(swa, SlidingAttentionConfig)
    torch.testing.assert_close(_inv_freq(full), rotary.full_attention_inv_freq)
    torch.testing.assert_close(_inv_freq(swa.attention), rotary.sliding_attention_inv_freq)


def test_default_rope_type_turns_the_whole_head():
    """A full-attention entry labelled "default" with a partial_rotary_factor turns the
    whole head, as transformers reads it (its default RoPE ignores the factor)."""
    entry = {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}
    kw = {
        "rope_parameters": {"full_attention": entry, "sliding_attention": {"rope_type": "default"}}
    }
    config = Lfm3Config(**SMALL, **kw)
    full = parse_hf_config(config.to_dict()).blocks[6].config
    assert isinstance(full, AttentionConfig) and full.rotary_dim == 16
    torch.testing.assert_close(_inv_freq(full), Lfm3RotaryEmbedding(config).full_attention_inv_freq)


def test_defaults_and_gates_off():
    """The bare config: the class's layer cycle over 24 layers and its RoPE; no sandwich
    norms or gates when the flags are off, and q/k/v/o biases with attention_bias."""
    arch = parse_hf_config({"model_type": "lfm3"})
    layers = [arch.blocks[i].kind for i in range(0, len(arch.blocks), 2)]
    want = Lfm3Config().layer_types
    names = {"conv": "shortconv", "full_attention": "attention", "sliding_attention": "swa"}
    assert layers == [names[t] for t in want] and len(layers) == 24
    assert arch.hidden_size == 2048 and arch.vocab_size == 128_000
    full = arch.configs_of("attention")[0]
    assert isinstance(full, AttentionConfig)
    assert (full.rotary_dim, full.rope_theta, full.head_dim) == (64, 1e6, 128)
    off = parse_hf_config(
        _raw(use_sandwich_norm=False, use_attention_gate=False, attention_bias=True)
    )
    assert not off.sandwich_norms
    attn = off.configs_of("attention")[0]
    assert isinstance(attn, AttentionConfig) and not attn.head_gate and attn.bias


def test_rope_theta_defaults_to_the_class_theta():
    """An entry without rope_theta takes `default_theta` (1e6), as transformers fills it."""
    kw = {
        "rope_parameters": {
            "full_attention": {"rope_type": "default"},
            "sliding_attention": {"rope_type": "default"},
        }
    }
    raw = {"model_type": "lfm3", **SMALL, **kw}
    arch = parse_hf_config(raw)
    assert Lfm3Config(**SMALL, **kw).rope_parameters["full_attention"]["rope_theta"] == 1e6
    full = arch.blocks[6].config
    assert isinstance(full, AttentionConfig)
    assert (full.rotary_dim, full.rope_theta, full.rope_type) == (16, 1e6, "default")


def test_cost_numbers_by_hand():
    """D=64, 4 heads of 16 (2 KV), kernel 7, window 16, ff 96, two attention layers."""
    spec = spec_from_hf_config({"model_type": "lfm3", **SMALL}, dtype_bytes=2)
    d, k = 64, 7
    # KV per token: the full attention layer's, 2 * 2 * 16; the windowed layer's KV is in
    # each checkpoint, 16 positions of it (`ModelSpec.window_state`)
    assert spec.kv_bytes_per_token == 1 * (2 * 2 * 16) * 2
    assert spec.window_state == 16 and spec.window_bytes == 16 * (2 * 2 * 16) * 2
    # the three convs' windows, D * K elements each, and the attention window
    assert spec.ssm_state_bytes == 3 * d * k * 2 + spec.window_bytes
    conv = 2 * d * 3 * d + 2 * d * k + 2 * d * d
    attn = 2 * d * 64 + 2 * 2 * d * 32 + 2 * 64 * d + 2 * d * 4  # q, k+v, o, g_proj
    mlp = 3 * 2 * d * 96
    per_token = sum(layer.total_flops_coeffs()[0] for layer in spec.layers)
    assert per_token == 3 * conv + 2 * attn + 5 * mlp


@pytest.mark.parametrize(
    ("kw", "key"),
    [
        ({"layer_types": ["conv", "mamba", "conv", "conv", "conv"]}, "layer type"),
        ({"layer_types": ["conv"] * 4}, "layer_types"),
        ({"sliding_window": 0}, "sliding_window"),
        ({"sliding_window": None}, "sliding_window"),
        ({"conv_L_cache": 0}, "conv_L_cache"),
        ({"head_dim": 15}, "head_dim"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn"}}}, "rope_type"),
        ({"rope_parameters": {"full_attention": {}}}, "sliding_attention"),
        ({"rope_parameters": [1]}, "rope_parameters"),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "proportional", "factor": 2.0},
                    "sliding_attention": {},
                }
            },
            "factor",
        ),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_theta": -1.0},
                    "sliding_attention": {},
                }
            },
            "rope_theta",
        ),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 2},
                    "sliding_attention": {},
                }
            },
            "partial_rotary_factor",
        ),
    ],
)
def test_bad_values_name_their_key(kw, key):
    with pytest.raises(ValueError, match=key):
        parse_hf_config({"model_type": "lfm3", **SMALL, **kw})


def test_vl_wrapper_parses_its_text_model():
    """LFM3-VL: the text_config's LFM3 under model.language_model., the vision tower and
    projector skipped, tie_word_embeddings the outer config's; the bare config is
    Lfm3VlConfig's (an Lfm3Config text model, tied)."""
    from transformers import Lfm3VlConfig

    raw = Lfm3VlConfig(text_config={"model_type": "lfm3", **SMALL}, tie_word_embeddings=False)
    arch = parse_hf_config(raw.to_dict())
    text = parse_hf_config(_raw())
    assert arch.family == "lfm3_vl" and arch.blocks == text.blocks and arch.sandwich_norms
    assert arch.weights_prefix == "model.language_model."
    assert arch.skipped_weights == ("model.vision_tower.", "model.multi_modal_projector.")
    assert not arch.tie_embeddings
    bare = parse_hf_config(Lfm3VlConfig().to_dict())
    assert bare.tie_embeddings and len(bare.blocks) == 48 and bare.hidden_size == 2048
