"""FalconH1's parse: muP multipliers land on the block configs and `Scales`, the cost
model ignores them, legacy RoPE keys are read, and what the parse refuses is named."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from transformers import FalconH1Config

from marconi_ray.core.model.hf.arch import AttentionConfig, Mamba2Config, MLPConfig, Scales
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config

SHAPE: dict[str, Any] = {
    "vocab_size": 300, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 96, "mamba_d_ssm": 128, "mamba_n_heads": 4,
    "mamba_n_groups": 2, "mamba_d_state": 16, "mamba_d_conv": 4,
}  # fmt: skip
MULTIPLIERS: dict[str, Any] = {
    "embedding_multiplier": 2.0, "lm_head_multiplier": 0.25, "key_multiplier": 0.5,
    "attention_in_multiplier": 1.5, "attention_out_multiplier": 0.75,
    "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.5,
    "ssm_multipliers": [0.5, 0.75, 1.5, 2.0, 0.25], "mlp_multipliers": [0.8, 0.6],
    "mamba_rms_norm": True, "mamba_norm_before_gate": False,
}  # fmt: skip


def _config(**extra: Any) -> dict[str, Any]:
    raw = FalconH1Config(**SHAPE, **extra).to_dict()
    return dict(json.loads(json.dumps(raw)))


def test_multipliers_reach_the_block_configs() -> None:
    arch = parse_hf_config(_config(**MULTIPLIERS))
    attn, mamba, mlp = (b.config for b in arch.blocks[:3])
    assert arch.parallel_mixers
    assert isinstance(attn, AttentionConfig) and isinstance(mamba, Mamba2Config)
    assert isinstance(mlp, MLPConfig)
    assert attn.scale == pytest.approx(0.5 / math.sqrt(16))
    assert (attn.input_scale, attn.output_scale) == (1.5, 0.75)
    assert (mamba.input_scale, mamba.output_scale) == (1.25, 0.5)
    assert mamba.in_proj_scales == (0.5, 0.75, 1.5, 2.0, 0.25)
    assert (mamba.gated_norm, mamba.norm_before_gate, mamba.conv_activation) == (
        True,
        False,
        "silu",
    )
    assert (mlp.gate_scale, mlp.down_scale) == (0.8, 0.6)
    assert arch.scales == Scales(embedding=2.0, residual=1.0, logits=0.25)


def test_defaults_are_neutral_and_the_cost_model_ignores_multipliers() -> None:
    plain = parse_hf_config(_config())
    attn, mamba, mlp = (b.config for b in plain.blocks[:3])
    assert attn == AttentionConfig(4, 2, 16, 16, 10000.0, scale=16**-0.5)
    assert mamba.in_proj_scales == (1.0,) * 5 and not mamba.gated_norm
    assert mamba.norm_before_gate  # the class default, used only with mamba_rms_norm
    assert (mlp.gate_scale, mlp.down_scale) == (1.0, 1.0)
    assert plain.scales == Scales()
    assert spec_from_hf_config(_config(**MULTIPLIERS)) == spec_from_hf_config(_config())


def test_legacy_rope_theta_is_read() -> None:
    raw = {**SHAPE, "model_type": "falcon_h1", "rope_theta": 1e11, "rope_scaling": None}
    attn = parse_hf_config(raw).blocks[0].config
    assert isinstance(attn, AttentionConfig)
    assert attn.rope_theta == FalconH1Config(rope_theta=1e11).rope_parameters["rope_theta"]
    scaled = {**raw, "rope_scaling": {"type": "yarn", "factor": 2.0}}
    yarn = parse_hf_config(scaled).blocks[0].config
    assert isinstance(yarn, AttentionConfig) and yarn.rope_type == "yarn"


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"projectors_bias": True}, "projectors_bias"),
        ({"key_multiplier": 0.0}, "key_multiplier"),
        ({"key_multiplier": None}, "key_multiplier"),
        ({"embedding_multiplier": -1.0}, "embedding_multiplier"),
        ({"ssm_in_multiplier": "x"}, "ssm_in_multiplier"),
        ({"ssm_out_multiplier": {"__float__": "Infinity"}}, "ssm_out_multiplier"),
        ({"ssm_multipliers": [1.0] * 4}, "ssm_multipliers"),
        ({"mlp_multipliers": [1.0, True]}, "mlp_multipliers"),
        ({"rope_scaling": 3}, "rope_scaling"),
    ],
)
def test_bad_multipliers_are_named(extra: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        parse_hf_config({**SHAPE, "model_type": "falcon_h1", **extra})
