"""xLSTM's config parse (`core/model/hf/xlstm.py`) and its cost model (`MLSTMLayer`):
the published 7B file, the key pairs xLSTMConfig resolves (num_blocks / num_hidden_layers,
embedding_dim / hidden_size), the layer's own width arithmetic, the refused variants, and
the state bytes by hand."""

from __future__ import annotations

import pytest
from transformers import xLSTMConfig

from marconi_ray.core.model import preset_configs
from marconi_ray.core.model.hf.arch import MLPConfig
from marconi_ray.core.model.hf.mlstm_arch import MLSTMConfig
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config
from marconi_ray.core.model.hf.xlstm import XLSTM, round_up
from marconi_ray.core.model.layers import MLPLayer
from marconi_ray.core.model.mlstm_layer import MLSTMLayer


def test_defaults_are_transformers_xlstm_config() -> None:
    """Every default kept here is the one xLSTMConfig (5.x) declares for the same key
    (its class attributes: `__post_init__` then resolves the None pairs)."""
    for key, value in XLSTM.items():
        if key == "max_position_embeddings":
            assert not hasattr(xLSTMConfig(), key)
        else:
            assert getattr(xLSTMConfig, key) == value, key


def test_published_7b_parses_as_32_mlstm_blocks() -> None:
    arch = parse_hf_config(dict(preset_configs.XLSTM_7B))
    assert arch.hidden_size == 4096 and len(arch.blocks) == 64
    mlstm, ffn = arch.blocks[0].config, arch.blocks[1].config
    assert mlstm == MLSTMConfig(8, 256, 512, 15.0, 1e-6, 1e-6, 64)
    assert ffn == MLPConfig(10944, "silu", gated=True)
    assert [b.hf_layer for b in arch.blocks[::2]] == list(range(32))
    assert arch.logits_soft_cap == 30.0 and arch.max_position is None
    assert arch.eos_token_ids == (2,) and not arch.tie_embeddings


def test_num_blocks_wins_and_embedding_dim_must_match() -> None:
    """xLSTMModel builds `num_blocks` blocks when the config names them (else
    num_hidden_layers); its layers are hidden_size wide, its embeddings embedding_dim."""
    base = {"model_type": "xlstm", "hidden_size": 256, "num_heads": 4}
    assert len(parse_hf_config({**base, "num_hidden_layers": 3}).blocks) == 6
    assert len(parse_hf_config({**base, "num_hidden_layers": 3, "num_blocks": 2}).blocks) == 4
    assert parse_hf_config({**base, "embedding_dim": 256}).hidden_size == 256
    with pytest.raises(ValueError, match="'embedding_dim' = 128 must equal hidden_size"):
        parse_hf_config({**base, "embedding_dim": 128})


def test_widths_are_the_layers_own_arithmetic() -> None:
    """int(hidden * factor) split over the heads (not the config's rounded properties);
    the feed-forward "rounded up" to its multiple as transformers' helper does (float
    floor division: 96 * 2.667 = 256.03 gives 256)."""
    from transformers.models.xlstm.configuration_xlstm import round_up_to_next_multiple_of

    arch = parse_hf_config(
        {"model_type": "xlstm", "hidden_size": 96, "num_heads": 2, "qk_dim_factor": 0.25}
    )
    m = arch.blocks[0].config
    assert isinstance(m, MLSTMConfig) and (m.qk_head_dim, m.v_head_dim) == (12, 48)
    ffn = arch.blocks[1].config
    assert isinstance(ffn, MLPConfig)
    assert round_up(96 * 2.667, 64) == 256 == ffn.intermediate_size
    assert round_up_to_next_multiple_of(96 * 2.667, 64) == 256


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"weight_mode": "fused"}, "'weight_mode' = 'fused' is not supported"),
        ({"use_bias": True}, "'use_bias' = True is not supported"),
        ({"norm_reduction_force_float32": False}, "'norm_reduction_force_float32'"),
        ({"num_heads": 3}, "'qk_dim_factor'.*multiple of num_heads"),
        ({"gate_soft_cap": -1.0}, "'gate_soft_cap' must be > 0"),
        ({"num_heads": 0}, "'num_heads' must be a positive int"),
    ],
)
def test_bad_or_unsupported_keys_raise_naming_them(extra: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_hf_config({"model_type": "xlstm", "hidden_size": 128, **extra})


def test_uncapped_gates_and_logits_parse_as_none() -> None:
    arch = parse_hf_config(
        {"model_type": "xlstm", "gate_soft_cap": None, "output_logit_soft_cap": None}
    )
    m = arch.blocks[0].config
    assert isinstance(m, MLSTMConfig) and m.gate_soft_cap is None
    assert arch.logits_soft_cap is None


def test_cost_model_by_hand() -> None:
    """State: per head C (dqk x dv), n (dqk) and m, float32 in the engine; no KV; FLOPs
    linear in n only."""
    layer = MLSTMLayer(d_model=128, n_heads=4, qk_head_dim=16, v_head_dim=32)
    assert layer.state_elements() == 4 * (16 * 32 + 16 + 1)
    assert layer.state_bytes(4) == 4 * 529 * 4 and layer.kv_elements_per_token() == 0
    c1, c2 = layer.total_flops_coeffs()
    d, wqk, wv = 128, 64, 128
    by_hand = 2 * d * 2 * wqk + 2 * d * 2 * wv + 2 * d * 2 * 4 + 6 * 4 * 16 * 32
    assert (c1, c2) == (by_hand + 6 * wqk + 8 * wv + 2 * wv * d, 0.0)
    spec = spec_from_hf_config(dict(preset_configs.XLSTM_7B), dtype_bytes=2, state_dtype_bytes=4)
    assert spec.n_ssm == 32 and spec.n_attention == 0 and spec.kv_bytes_per_token == 0
    assert spec.ssm_state_bytes == 32 * 8 * (256 * 512 + 256 + 1) * 4 == 134_480_896
    assert sum(isinstance(x, MLPLayer) for x in spec.layers) == 32
