"""The engine's HybridConfig and the core's ModelSpec are two views of one parse
(`core.hf_config.parse_hf_config`); configs the engine cannot run are rejected by name.

Replaces the idea of checking two parsers against each other: there is one parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import BambaConfig, GraniteMoeHybridConfig, JambaConfig, NemotronHConfig

from marconi_ray.core.hf_config import parse_hf_config, spec_from_hf_config
from marconi_ray.engine.hf_families import FAMILIES, hybrid_config
from marconi_ray.engine.loader import read_config
from marconi_ray.engine.model_presets import QWEN_FAMILIES, preset_config

CONFIGS: dict[str, dict[str, Any]] = {
    "nemotron_h": NemotronHConfig(
        hidden_size=64, hybrid_override_pattern="M-M*-", num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2,
    ).to_dict(),
    "bamba": BambaConfig(
        hidden_size=64, num_hidden_layers=3, attn_layer_indices=[1], num_attention_heads=4,
        num_key_value_heads=2, mamba_n_heads=8,
    ).to_dict(),
    "jamba": JambaConfig(
        hidden_size=64, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1,
        num_attention_heads=4, num_key_value_heads=2, num_experts=1,
    ).to_dict(),
    "granitemoehybrid": GraniteMoeHybridConfig(
        hidden_size=64, num_hidden_layers=2, layer_types=["mamba", "attention"],
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, mamba_n_heads=8,
        intermediate_size=32, shared_intermediate_size=48,
    ).to_dict(),
    **{family: preset_config("tiny", family).to_dict() for family in QWEN_FAMILIES},
}  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_both_views_come_from_one_parse(family: str) -> None:
    raw = CONFIGS[family]
    arch = parse_hf_config(raw)
    cfg = hybrid_config(raw)
    spec = spec_from_hf_config(raw)
    assert cfg.blocks == tuple(b.kind for b in arch.blocks)
    assert cfg.hf_layer == tuple(b.hf_layer for b in arch.blocks)
    for kind in ("attention", "mlp", "mamba2", "mamba1", "gdn", "moe"):
        assert (getattr(cfg, kind),) == (arch.configs_of(kind) or (None,))
    assert (cfg.vocab_size, cfg.hidden_size, cfg.norm_eps) == (
        arch.vocab_size,
        arch.hidden_size,
        arch.norm_eps,
    )
    assert cfg.max_position == arch.max_position == spec.max_position
    assert len(spec.layers) == len(cfg.blocks)
    assert spec.n_attention == cfg.blocks.count("attention")
    assert spec.n_ssm == sum(cfg.blocks.count(k) for k in ("mamba2", "mamba1", "gdn"))
    assert spec.n_mlp == cfg.blocks.count("mlp") + cfg.blocks.count("moe")
    if cfg.attention is not None:
        kv = spec.kv_bytes_per_token // spec.n_attention
        assert kv == 2 * cfg.attention.n_kv_heads * cfg.attention.head_dim * spec.dtype_bytes


def test_bamba_rope_and_dt_limits_reach_the_engine() -> None:
    cfg = hybrid_config(CONFIGS["bamba"])
    assert cfg.attention is not None and cfg.mamba2 is not None
    assert (cfg.attention.rotary_dim, cfg.attention.rope_theta) == (8, 10000.0)
    assert (cfg.mamba2.dt_min, cfg.mamba2.dt_max, cfg.mamba2.chunk_size) == (0.0, float("inf"), 256)
    assert cfg.eos_token_ids == (2,)


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        (
            {**CONFIGS["nemotron_h"], "layers_block_type": ["mamba", "moe"], "n_group": 3},
            "n_group=3 must divide n_experts=8",
        ),
        (
            {**CONFIGS["bamba"], "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
            "rope_type 'yarn'",
        ),
        ({"model_type": "zamba2"}, "'zamba2'"),
        ({"model_type": "falcon_h1"}, "the engine supports"),
        ({"model_type": "llama"}, "'llama'"),
        ({**CONFIGS["bamba"], "mamba_n_heads": "eight"}, "mamba_n_heads"),
        ({**CONFIGS["qwen3_5_text"], "linear_num_value_heads": 3}, "linear_num_key_heads=2"),
    ],
)
def test_what_the_engine_cannot_run_is_named(config: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        hybrid_config(config)


def test_nemotron_h_moe_with_latent_projections_reaches_the_engine() -> None:
    """Plain relu2 experts between latent projections, once refused, are engine configs."""
    raw = {**CONFIGS["nemotron_h"], "layers_block_type": ["mamba", "moe"], "moe_latent_size": 16}
    cfg = hybrid_config(raw)
    assert cfg.pattern == "ME" and cfg.moe is not None
    assert (cfg.moe.gated, cfg.moe.latent_dim, cfg.moe.scoring) == (False, 16, "sigmoid")


def test_read_config_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIGS["bamba"]))
    cfg, raw = read_config(tmp_path)
    assert cfg == hybrid_config(raw)
    (tmp_path / "config.json").write_text(json.dumps({**raw, "hidden_size": None}))
    with pytest.raises(ValueError, match=r"config\.json.*hidden_size"):
        read_config(tmp_path)


def test_tensor_parallel_sizes_of_gated_deltanet_are_checked() -> None:
    """Key heads split across ranks: a world size that does not divide them is named."""
    raw = {**CONFIGS["qwen3_next"], "num_attention_heads": 8, "num_key_value_heads": 4}
    raw["head_dim"] = raw["hidden_size"] // 8
    cfg = hybrid_config(raw)
    cfg.check_tp(2)
    with pytest.raises(ValueError, match=r"linear_num_key_heads=2 is not divisible by .* 4"):
        cfg.check_tp(4)
