"""parse_hf_config: the one parse of a HF config (HfArchitecture) and the ModelSpec derived
from it, on configs built by transformers' own config classes (configs only)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import pytest
from transformers import (
    BambaConfig,
    FalconH1Config,
    GraniteMoeHybridConfig,
    JambaConfig,
    NemotronHConfig,
    Zamba2Config,
)

from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    HfArchitecture,
    LinearConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    MoEConfig,
)
from marconi_ray.core.model.hf.parse import (
    layer_spec,
    parse_hf_config,
    spec_from_architecture,
    spec_from_hf_config,
)

FAMILIES: dict[str, Callable[..., Any]] = {
    "nemotron_h": NemotronHConfig,
    "bamba": BambaConfig,
    "jamba": JambaConfig,
    "zamba2": Zamba2Config,
    "falcon_h1": FalconH1Config,
    "granitemoehybrid": GraniteMoeHybridConfig,
}


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_bare_config_parses_like_the_class_defaults(model_type: str) -> None:
    """Every field (engine details included) of a bare {"model_type": ...} equals the parse
    of the config class's own defaults: hf.defaults matches transformers."""
    full = parse_hf_config(FAMILIES[model_type]().to_dict())
    assert parse_hf_config({"model_type": model_type}) == full
    assert full.family == model_type


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_spec_is_derived_from_the_parse(model_type: str) -> None:
    arch = parse_hf_config({"model_type": model_type})
    spec = spec_from_hf_config({"model_type": model_type}, dtype_bytes=4)
    assert spec == spec_from_architecture(arch, 4, model_type)
    assert spec.layers == tuple(layer_spec(b.config, arch.hidden_size) for b in arch.blocks)
    assert (spec.vocab_size, spec.max_position) == (arch.vocab_size, arch.max_position)


def test_nemotron_h_details() -> None:
    cfg = NemotronHConfig(
        hidden_size=64, layers_block_type=["mamba", "mlp", "attention", "moe"],
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, mamba_num_heads=8,
        mamba_head_dim=16, n_groups=2, chunk_size=32, time_step_min=0.01, use_bias=True,
        layer_norm_epsilon=1e-4, tie_word_embeddings=True, eos_token_id=[2, 5],
        n_routed_experts=4, moe_intermediate_size=32,
    ).to_dict()  # fmt: skip
    arch = parse_hf_config(json.loads(json.dumps(cfg)))
    assert [b.kind for b in arch.blocks] == ["mamba2", "mlp", "attention", "moe"]
    assert [b.hf_layer for b in arch.blocks] == [0, 1, 2, 3]
    mamba, mlp, attn, moe = (b.config for b in arch.blocks)
    assert mamba == Mamba2Config(8, 16, 2, 128, 4, 32, True, True, 0.01, math.inf)
    assert mlp == MLPConfig(cfg["intermediate_size"], "relu2", gated=False)
    assert attn == AttentionConfig(4, 2, 16, rotary_dim=0, rope_theta=0.0)
    assert isinstance(moe, MoEConfig) and moe.activation == "relu2" and moe.n_shared_experts == 1
    assert (arch.norm_eps, arch.tie_embeddings, arch.eos_token_ids) == (1e-4, True, (2, 5))
    # legacy keys from hub configs
    legacy = {"model_type": "nemotron_h", "mamba_chunk_size": 64, "mamba_conv_bias": False}
    (legacy_mamba,) = parse_hf_config({**legacy, "hybrid_override_pattern": "M"}).configs_of(
        "mamba2"
    )
    assert isinstance(legacy_mamba, Mamba2Config)
    assert (legacy_mamba.chunk_size, legacy_mamba.conv_bias) == (64, False)


def test_bamba_details() -> None:
    cfg = BambaConfig(
        hidden_size=64, num_hidden_layers=3, attn_layer_indices=[1], num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=8, mamba_chunk_size=16, rms_norm_eps=1e-6,
        time_step_limit=(0.001, 100.0),
    ).to_dict()  # fmt: skip
    arch = parse_hf_config(cfg)
    assert [b.kind for b in arch.blocks] == ["mamba2", "mlp", "attention", "mlp", "mamba2", "mlp"]
    assert [b.hf_layer for b in arch.blocks] == [0, 0, 1, 1, 2, 2]
    (attn,) = arch.configs_of("attention")
    assert attn == AttentionConfig(4, 2, 16, rotary_dim=8, rope_theta=10000.0)
    (mamba,) = arch.configs_of("mamba2")
    assert isinstance(mamba, Mamba2Config)
    assert (mamba.head_dim, mamba.chunk_size, mamba.dt_min, mamba.dt_max) == (16, 16, 0.001, 100)
    assert arch.norm_eps == 1e-6 and arch.eos_token_ids == (2,)
    # transformers saves infinity as {"__float__": "Infinity"}
    inf = {**cfg, "time_step_limit": [0.0, {"__float__": "Infinity"}]}
    (mamba,) = parse_hf_config(inf).configs_of("mamba2")
    assert isinstance(mamba, Mamba2Config) and mamba.dt_max == math.inf


def test_jamba_details() -> None:
    cfg = JambaConfig(
        hidden_size=64, num_hidden_layers=2, attn_layer_period=2, attn_layer_offset=1,
        num_attention_heads=4, num_key_value_heads=2, num_experts=1, mamba_d_state=8,
        mamba_conv_bias=False,
    ).to_dict()  # fmt: skip
    arch = parse_hf_config(cfg)
    assert [b.kind for b in arch.blocks] == ["mamba1", "mlp", "attention", "mlp"]
    (mamba,) = arch.configs_of("mamba1")
    assert mamba == Mamba1Config(128, 8, 4, 4, conv_bias=False, proj_bias=False)
    (attn,) = arch.configs_of("attention")
    assert isinstance(attn, AttentionConfig) and attn.rotary_dim == 0


def test_zamba2_shared_block_and_falcon_parallel_mixers() -> None:
    cfg = Zamba2Config(
        hidden_size=64, num_hidden_layers=2, layers_block_type=["mamba", "hybrid"],
        num_attention_heads=4, n_mamba_heads=4, adapter_rank=8, use_mem_rope=True,
    ).to_dict()  # fmt: skip
    zamba = parse_hf_config(cfg)
    hybrid = [b for b in zamba.blocks if b.hf_layer == 1]
    assert [b.kind for b in hybrid] == ["attention", "mlp", "linear", "linear", "linear", "mamba2"]
    assert [b.shared for b in hybrid] == [True, True, False, False, False, False]
    assert [b.source_layer for b in hybrid] == [1] * 6  # one hybrid layer: its own copy
    attn = hybrid[0].config
    assert isinstance(attn, AttentionConfig)
    assert (attn.input_dim, attn.head_dim, attn.rotary_dim) == (128, 32, 32)
    assert attn.scale == 16**-0.5  # transformers scales by (head_dim / 2) ** -0.5
    assert hybrid[2].config == LinearConfig(64, 8)
    assert hybrid[1].config == MLPConfig(256, "gelu", gated=True)
    assert zamba.tie_embeddings and not zamba.parallel_mixers
    two = parse_hf_config({**cfg, "num_hidden_layers": 4, "num_mem_blocks": 2,
                           "layers_block_type": ["hybrid"] * 3 + ["mamba"]})  # fmt: skip
    copies = [(b.hf_layer, b.weights_layer) for b in two.blocks if b.shared]
    assert copies == [(0, 0), (0, 0), (1, 1), (1, 1), (2, 0), (2, 0)]
    falcon = parse_hf_config({"model_type": "falcon_h1", "num_hidden_layers": 2})
    assert falcon.parallel_mixers
    assert [b.kind for b in falcon.blocks[:3]] == ["attention", "mamba2", "mlp"]


def test_granite_rope_only_when_asked() -> None:
    base = {"model_type": "granitemoehybrid", "layer_types": ["attention"]}
    (plain,) = parse_hf_config(base).configs_of("attention")
    (roped,) = parse_hf_config({**base, "position_embedding_type": "rope"}).configs_of("attention")
    assert isinstance(plain, AttentionConfig) and isinstance(roped, AttentionConfig)
    assert (plain.rotary_dim, roped.rotary_dim) == (0, roped.head_dim)


def test_legacy_top_level_rope_keys_are_read() -> None:
    """config.json files written before transformers 5 (Falcon-H1's, Bamba's) keep
    rope_theta / partial_rotary_factor at the top level: they override the class default,
    and fill what a rope_parameters mapping lacks without overriding what it states."""
    legacy = {"model_type": "falcon_h1", "num_hidden_layers": 1, "rope_theta": 1e11}
    (attn,) = parse_hf_config(legacy).configs_of("attention")
    assert isinstance(attn, AttentionConfig) and attn.rope_theta == 1e11
    bamba = {"model_type": "bamba", "num_hidden_layers": 1, "attn_layer_indices": [0]}
    (half,) = parse_hf_config(bamba).configs_of("attention")
    (full,) = parse_hf_config({**bamba, "partial_rotary_factor": 1.0}).configs_of("attention")
    assert isinstance(half, AttentionConfig) and isinstance(full, AttentionConfig)
    assert (half.rotary_dim * 2, full.rotary_dim) == (half.head_dim, full.head_dim)
    stated = {**legacy, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}
    (attn,) = parse_hf_config(stated).configs_of("attention")
    assert isinstance(attn, AttentionConfig) and attn.rope_theta == 5e5


@pytest.mark.parametrize(
    ("config", "name"),
    [
        ({"model_type": "falcon_h1", "rope_parameters": 5}, "rope_parameters"),
        ({"model_type": "falcon_h1", "rope_parameters": {"rope_theta": "x"}}, "rope_theta"),
        ({"model_type": "bamba", "time_step_limit": [0.0]}, "time_step_limit"),
        ({"model_type": "bamba", "time_step_limit": [0.0, "big"]}, "time_step_limit"),
        ({"model_type": "nemotron_h", "eos_token_id": "x"}, "eos_token_id"),
        ({"model_type": "nemotron_h", "hybrid_override_pattern": ""}, "no layers"),
        ({"model_type": "nemotron_h", "mlp_hidden_act": None}, "mlp_hidden_act"),
        ({"model_type": "falcon_h1", "rms_norm_eps": "tiny"}, "rms_norm_eps"),
        ({"model_type": "falcon_h1", "num_attention_heads": 0}, "num_attention_heads"),
        ({"model_type": "zamba2", "chunk_size": 0}, "chunk_size"),
        ({"model_type": "bamba", "attn_layer_indices": [0], "num_key_value_heads": 3}, "n_kv"),
    ],
)
def test_bad_configs_name_the_key(config: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        parse_hf_config(config)


def test_architecture_needs_blocks() -> None:
    with pytest.raises(ValueError, match="no layers"):
        HfArchitecture("x", 10, 8, (), 1e-5, False, None)
