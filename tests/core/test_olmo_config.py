"""OLMo Hybrid's parser (`core.model.hf.olmo`): transformers' config class read the same
way, the layout of its two layer kinds, its RoPE / NoPE reading and bad values named."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import OlmoHybridConfig

from marconi_ray.core.model.hf.arch import AttentionConfig, GatedDeltaNetConfig, MLPConfig
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config

SMALL: dict[str, Any] = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 4}


def _parse(**kwargs: Any):
    return parse_hf_config({"model_type": "olmo_hybrid", **SMALL, **kwargs})


def test_default_layout_equals_what_transformers_builds() -> None:
    ours = _parse()
    theirs = parse_hf_config(OlmoHybridConfig(**SMALL).to_dict())
    assert ours.blocks == theirs.blocks
    kinds = [(b.kind, b.hf_layer, b.post_norm) for b in ours.blocks]
    assert kinds == [
        *((k, i, False) for i in range(3) for k in ("gdn", "mlp")),
        ("attention", 3, True),
        ("mlp", 3, True),
    ]
    gdn = ours.blocks[0].config
    assert isinstance(gdn, GatedDeltaNetConfig)
    # transformers' derivations: heads = attention heads, dk = 0.75 D / heads, dv = 2 dk
    assert (gdn.n_k_heads, gdn.n_v_heads, gdn.head_k_dim, gdn.head_v_dim) == (4, 4, 12, 24)
    assert (gdn.separate_projections, gdn.beta_scale, gdn.norm_eps) == (True, 2.0, 1e-5)
    attn = ours.blocks[6].config
    assert isinstance(attn, AttentionConfig) and attn.qk_norm and attn.qk_norm_whole
    assert isinstance(ours.blocks[7].config, MLPConfig)


@pytest.mark.parametrize(
    ("rope_parameters", "rotary"),
    [
        ({"rope_type": "default", "rope_theta": 500000.0}, 16),
        (None, 16),  # transformers standardises a null to its default RoPE
        ({"rope_type": "default", "rope_theta": None}, 0),  # NoPE: no rotary embedding
    ],
)
def test_rope_or_nope_as_transformers_reads_it(rope_parameters: object, rotary: int) -> None:
    attn = _parse(rope_parameters=rope_parameters).blocks[6].config
    assert isinstance(attn, AttentionConfig) and attn.rotary_dim == rotary
    from transformers import OlmoHybridForCausalLM

    cfg = OlmoHybridConfig(**SMALL, rope_parameters=rope_parameters)
    has_rope = OlmoHybridForCausalLM(cfg).model.rotary_emb is not None
    assert has_rope == (rotary > 0)


def test_negative_eigenvalues_off_and_costs() -> None:
    gdn = _parse(linear_allow_neg_eigval=False).blocks[0].config
    assert isinstance(gdn, GatedDeltaNetConfig) and gdn.beta_scale == 1.0
    spec = spec_from_hf_config({"model_type": "olmo_hybrid", **SMALL})
    assert spec.n_attention == 1 and spec.n_ssm == 3
    assert spec.kv_bytes_per_token == 2 * 4 * 16 * 2  # K and V of 4 heads of 16, bf16


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"layer_types": ["linear_attention", "sliding_attention"] * 2}, "layer_types"),
        ({"layer_types": ["linear_attention"] * 3}, "must give 4"),
        ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim"),
        ({"rope_parameters": 3}, "rope_parameters"),
    ],
)
def test_bad_values_are_named(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _parse(**kwargs)
