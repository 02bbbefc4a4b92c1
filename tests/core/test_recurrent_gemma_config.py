"""RecurrentGemma's parse (`core/model/hf/recurrent_gemma.py`) and cost model against
transformers' config class and modules: the block_types cycle, lru_width and KV-head
defaults, partial RoPE (0.5 unless stated, legacy keys), the window, the soft cap, the
bfloat16 embedding normaliser, o_proj's bias; the RG-LRU block's FLOPs are 2 x the
weights a token multiplies (built on the meta device); bad configs name their key."""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from transformers import RecurrentGemmaConfig  # noqa: E402
from transformers.models.recurrent_gemma import modeling_recurrent_gemma as rg  # noqa: E402

from marconi_ray.core.model.hf.arch import (  # noqa: E402
    MLPConfig,
    RGLRUConfig,
    SlidingAttentionConfig,
)
from marconi_ray.core.model.hf.parse import layer_spec, parse_hf_config  # noqa: E402
from marconi_ray.core.model.hf.recurrent_gemma import bfloat16  # noqa: E402
from marconi_ray.core.model.layers import AttentionLayer, RGLRULayer  # noqa: E402

TINY: dict[str, Any] = {
    "vocab_size": 100, "hidden_size": 96, "intermediate_size": 192, "num_attention_heads": 6,
    "num_key_value_heads": 2, "num_hidden_layers": 5, "attention_window_size": 16,
}  # fmt: skip


def _parse(**overrides: Any):
    return parse_hf_config(RecurrentGemmaConfig(**{**TINY, **overrides}).to_dict())


def test_layers_cycle_block_types_and_read_the_defaults() -> None:
    arch = _parse()
    mixers = [b.config for b in arch.blocks[::2]]
    want = [RGLRUConfig, RGLRUConfig, SlidingAttentionConfig, RGLRUConfig, RGLRUConfig]
    assert [type(m) for m in mixers] == want
    assert all(
        b.config == MLPConfig(96, "gelu_pytorch_tanh", True, True) for b in arch.blocks[1::2]
    )
    lru = mixers[0]
    assert lru == RGLRUConfig(lru_width=96, n_heads=6, d_conv=4, activation="gelu_pytorch_tanh")
    swa = mixers[2]
    assert isinstance(swa, SlidingAttentionConfig)
    assert (swa.window, swa.output_bias, swa.attention.bias) == (16, True, False)
    attn = swa.attention
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim, attn.rotary_dim) == (6, 2, 16, 8)
    assert attn.rope_theta == 10000.0
    assert arch.unit_offset_norms and arch.tie_embeddings
    assert arch.logits_soft_cap == 30.0
    assert arch.scales.embedding == float(torch.tensor(96**0.5, dtype=torch.bfloat16))
    assert arch.eos_token_ids == (1,)


def test_stated_widths_rope_and_block_types() -> None:
    arch = _parse(
        lru_width=48,
        block_types=["attention", "recurrent"],
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 500.0,
            "partial_rotary_factor": 0.25,
        },
        attention_bias=True,
        logits_soft_cap=0.0,
    )
    kinds = [b.kind for b in arch.blocks[::2]]
    assert kinds == ["swa", "rglru", "swa", "rglru", "swa"]
    swa, lru = arch.blocks[0].config, arch.blocks[2].config
    assert isinstance(swa, SlidingAttentionConfig) and isinstance(lru, RGLRUConfig)
    assert (swa.attention.rotary_dim, swa.attention.rope_theta, swa.attention.bias) == (
        4,
        500.0,
        True,
    )
    assert lru.lru_width == 48 and lru.block_width == 8
    assert arch.logits_soft_cap is None
    legacy = parse_hf_config({**TINY, "model_type": "recurrent_gemma", "rope_theta": 7.0})
    attn = legacy.blocks[4].config
    assert isinstance(attn, SlidingAttentionConfig)
    assert (attn.attention.rope_theta, attn.attention.rotary_dim) == (7.0, 8)


@pytest.mark.parametrize("value", [64.0, 96.0**0.5, 2560**0.5, 1.0 + 2**-9, 1.0 + 3 * 2**-9])
def test_bfloat16_rounds_like_torch(value: float) -> None:
    assert bfloat16(value) == float(torch.tensor(value, dtype=torch.bfloat16))


def _weights(module: nn.Module) -> float:
    """Weights one token multiplies: nn.Linear weights, the depthwise conv's taps and the
    RG-LRU's block-diagonal gate weights."""
    total = 0.0
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv1d)):
            total += m.weight.numel()
        if isinstance(m, rg.RecurrentGemmaRglru):
            total += m.input_gate_weight.numel() + m.recurrent_gate_weight.numel()
    return total


def test_cost_model_counts_the_transformers_blocks() -> None:
    cfg = RecurrentGemmaConfig(**TINY)
    arch = parse_hf_config(cfg.to_dict())
    with torch.device("meta"):
        block = rg.RecurrentGemmaRecurrentBlock(cfg, 0)
        attention = rg.RecurrentGemmaAttention(cfg, 2)
    lru = layer_spec(arch.blocks[0].config, 96)
    assert isinstance(lru, RGLRULayer)
    assert lru.total_flops_coeffs() == (2 * _weights(block), 0.0)
    assert (lru.state_elements(), lru.conv_elements()) == (96, 96 * 4)
    attn = layer_spec(arch.blocks[4].config, 96)
    assert isinstance(attn, AttentionLayer)
    assert attn.total_flops_coeffs()[0] == 2 * _weights(attention)
    assert attn.kv_elements_per_token() == 2 * 2 * 16


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"block_types": ["recurrent", "mamba"]}, "block_types"),
        ({"block_types": []}, "block_types"),
        ({"attention_window_size": 0}, "attention_window_size"),
        ({"lru_width": 50}, "lru_width"),
        ({"logits_soft_cap": -1.0}, "logits_soft_cap"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rope_parameters"),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_bad_configs_name_their_key(overrides: dict[str, Any], key: str) -> None:
    raw = {**TINY, "model_type": "recurrent_gemma", **overrides}
    with pytest.raises(ValueError, match=key):
        parse_hf_config(raw)


def test_embedding_scale_of_a_square_width_is_exact() -> None:
    assert _parse(hidden_size=64, num_attention_heads=4).scales.embedding == math.sqrt(64)


RECURRENTGEMMA_2B: dict[str, Any] = {
    "_block_types": ["recurrent", "recurrent", "attention"],
    "architectures": ["RecurrentGemmaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "attention_window_size": 2048,
    "conv1d_width": 4,
    "embeddings_scale_by_sqrt_dim": True,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "hidden_size": 2560,
    "intermediate_size": 15360,
    "logits_soft_cap": 30.0,
    "lru_width": 2560,
    "model_type": "recurrent_gemma",
    "num_attention_heads": 10,
    "num_hidden_layers": 26,
    "num_key_value_heads": 1,
    "partial_rotary_factor": 0.5,
    "rms_norm_eps": 1e-06,
    "rope_theta": 10000.0,
    "vocab_size": 256000,
}
"""google/recurrentgemma-2b's config.json (a gated repository), as a copy found by the
code index transcribes it: legacy top-level `rope_theta` / `partial_rotary_factor`, and
`_block_types`, which transformers does not read (its default cycle is the same)."""


def test_released_2b_config_parses_as_transformers_reads_it() -> None:
    arch = parse_hf_config(RECURRENTGEMMA_2B)
    hf = RecurrentGemmaConfig.from_dict(RECURRENTGEMMA_2B)
    kinds = ["swa" if t == "sliding_attention" else "rglru" for t in hf.layers_block_type]
    assert [b.kind for b in arch.blocks[::2]] == kinds
    assert kinds.count("swa") == 8
    swa = arch.blocks[4].config
    assert isinstance(swa, SlidingAttentionConfig)
    attn = swa.attention
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim, attn.rotary_dim) == (10, 1, 256, 128)
    assert swa.window == hf.attention_window_size == 2048
    lru = arch.blocks[0].config
    assert lru == RGLRUConfig(2560, 10, 4, "gelu_pytorch_tanh")
    assert arch.blocks[1].config == MLPConfig(7680, "gelu_pytorch_tanh", True, True)
    assert arch.scales.embedding == float(torch.tensor(2560**0.5, dtype=torch.bfloat16))
    spec_layers = [layer_spec(b.config, 2560) for b in arch.blocks[::2]]
    state = sum(s.state_elements() + s.conv_elements() for s in spec_layers)
    assert state == 18 * (2560 + 2560 * 4)
    assert sum(s.kv_elements_per_token() for s in spec_layers) == 8 * 2 * 256
