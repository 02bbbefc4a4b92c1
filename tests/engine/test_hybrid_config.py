"""The engine's HybridConfig and the core's ModelSpec are two views of one parse
(`core.model.hf.parse.parse_hf_config`); configs the engine cannot run are rejected by name.

Replaces the idea of checking two parsers against each other: there is one parser."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from transformers import BambaConfig, GraniteMoeHybridConfig, JambaConfig, NemotronHConfig

from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config
from marconi_ray.engine.model.from_hf import FAMILIES, hybrid_config
from marconi_ray.engine.model.loader import read_config
from marconi_ray.engine.presets.family_configs import preset_config
from marconi_ray.engine.presets.model_presets import (
    LFM2_FAMILIES,
    PURE_SSM_FAMILIES,
    QWEN_FAMILIES,
)

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
    **{
        family: preset_config("tiny", family).to_dict()
        for family in (
            *QWEN_FAMILIES,
            *LFM2_FAMILIES,
            *PURE_SSM_FAMILIES,
            "falcon_h1",
            "olmo_hybrid",
            "recurrent_gemma",
            "minimax",
            "bailing_hybrid",
            "lfm3",
            "xlstm",
        )
    },
    "zamba2": preset_config("tiny", "zamba2").to_dict(),
    "kimi_linear": preset_config("tiny", "kimi_linear").to_dict(),
    "lfm3_vl": {
        "model_type": "lfm3_vl", "text_config": preset_config("tiny", "lfm3").to_dict()
    },
}  # fmt: skip


def _engine_view(arch):
    """(kind, hf_layer) of the engine's blocks as the core lists them: each Zamba2
    shared-block group (shared attention, adapters, shared MLP, linear) is one
    `shared_transformer` block."""
    return tuple(
        ("shared_transformer" if b.shared else b.kind, b.hf_layer)
        for b in arch.blocks
        if not (b.kind == "linear" or (b.shared and b.kind == "mlp"))
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_both_views_come_from_one_parse(family: str) -> None:
    raw = CONFIGS[family]
    arch = parse_hf_config(raw)
    cfg = hybrid_config(raw)
    spec = spec_from_hf_config(raw)
    assert tuple(zip(cfg.blocks, cfg.hf_layer, strict=True)) == _engine_view(arch)
    kinds = ("attention", "mlp", "mamba2", "mamba1", "gdn", "moe", "shortconv", "rglru", "swa")
    for kind in (*kinds, "kda", "mla", "lightning", "mlstm"):
        own = tuple(dict.fromkeys(b.config for b in arch.blocks if b.kind == kind and not b.shared))
        assert (getattr(cfg, kind),) == (own or (None,))
    assert (cfg.vocab_size, cfg.hidden_size, cfg.norm_eps) == (
        arch.vocab_size,
        arch.hidden_size,
        arch.norm_eps,
    )
    assert cfg.max_position == arch.max_position == spec.max_position
    assert len(spec.layers) == len(arch.blocks)
    n_shared = cfg.blocks.count("shared_transformer")
    attention = sum(cfg.blocks.count(k) for k in ("attention", "swa", "mla"))
    assert spec.n_attention == attention + n_shared
    recurrent = ("mamba2", "mamba1", "gdn", "shortconv", "rglru", "kda", "lightning", "mlstm")
    assert spec.n_ssm == sum(cfg.blocks.count(k) for k in recurrent)
    assert spec.n_mlp == cfg.blocks.count("mlp") + cfg.blocks.count("moe") + n_shared
    attn = cfg.attention or (cfg.shared.attention if cfg.shared is not None else None)
    if attn is not None:  # per token: the unwindowed layers' KV (a window is in the state)
        kv = spec.kv_bytes_per_token // (spec.n_attention - cfg.blocks.count("swa"))
        assert kv == 2 * attn.n_kv_heads * attn.head_dim * spec.dtype_bytes


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
        ({**CONFIGS["falcon_h1"], "hidden_act": "gelu"}, "conv activation 'gelu' .hidden_act"),
        (
            {**CONFIGS["zamba2"], "num_key_value_heads": 2},
            r"use_shared_attention_adapter needs num_key_value_heads=2 == num_attention_heads=4",
        ),
        (
            {**CONFIGS["zamba2"], "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
            "zamba2 rope_type 'yarn'",
        ),
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


def test_zamba2_shared_block_reaches_the_engine() -> None:
    """Transformers' default Zamba2 (the released 2.7B's shape) runs in the engine: one
    shared block per hybrid layer, 2 copies used in turn (hybrid layer k stores its
    weights under the first hybrid layer of copy k % 2), the score scale
    (head_dim / 2)**-0.5 and the adapter rank."""
    cfg = hybrid_config({"model_type": "zamba2", "num_mem_blocks": 2})
    assert cfg.shared is not None and cfg.attention is None and cfg.mlp is None
    assert cfg.blocks.count("shared_transformer") == 9 and cfg.blocks.count("mamba2") == 54
    hybrid = cfg.hybrid_layers
    assert hybrid[:3] == (6, 12, 18)
    assert cfg.shared_copies == (6, 12)
    sources = [cfg.source_layer(i) for i in cfg.layers_of("shared_transformer")]
    assert sources == [6, 12] * 4 + [6]
    a = cfg.shared.attention
    assert (a.input_dim, a.head_dim, a.rotary_dim) == (5120, 160, 0)
    assert a.scale == pytest.approx(80**-0.5)
    assert (cfg.shared.adapter_rank, cfg.shared.qkv_adapters) == (128, False)
    assert cfg.pattern.startswith("MMMMMMZM")
