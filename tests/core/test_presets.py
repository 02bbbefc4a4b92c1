"""The named presets: each builds, and its per-state bytes and KV bytes per token equal a
hand computation from the published shapes (Qwen: bf16 KV and conv states, fp32 recurrent
states; paper-7b: fp16 everywhere)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from transformers import Qwen3_5Config, Qwen3_5MoeConfig, Qwen3NextConfig

from marconi_ray.core import preset_configs
from marconi_ray.core.hf_config import parse_hf_config
from marconi_ray.core.layers import AttentionLayer, GatedDeltaNetLayer, MoELayer
from marconi_ray.core.presets import PRESETS, get_preset

BF16 = 2
FP32 = 4


def gdn_state_bytes(hk: int, hv: int, dk: int, dv: int, kernel: int) -> int:
    """One Gated DeltaNet layer: recurrent Hv x dk x dv in fp32 plus conv
    (2*Hk*dk + Hv*dv) x kernel in bf16."""
    return hv * dk * dv * FP32 + (2 * hk * dk + hv * dv) * kernel * BF16


def kv_bytes(n_attention: int, kv_heads: int, head_dim: int) -> int:
    """K and V of every attention layer for one token."""
    return n_attention * 2 * kv_heads * head_dim * BF16


# name: (layers, attention layers, GDN Hk, Hv, dk, dv, kernel, KV heads, head_dim)
SHAPES = {
    "qwen3.5-27b": (64, 16, 16, 48, 128, 128, 4, 4, 256),
    "qwen3.5-35b-a3b": (40, 10, 16, 32, 128, 128, 4, 2, 256),
    "qwen3-next-80b-a3b": (48, 12, 16, 32, 128, 128, 4, 2, 256),
}


def test_registry() -> None:
    assert set(PRESETS) == {"paper-7b", *SHAPES}
    with pytest.raises(ValueError, match=r"qwen3\.5-27b"):
        get_preset("qwen-nope")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds(name: str) -> None:
    spec = get_preset(name)
    assert spec.name == name and spec.dtype_bytes == BF16
    assert spec.state_dtype_bytes == (None if name == "paper-7b" else FP32)
    assert spec.ssm_state_bytes > 0 and spec.kv_bytes_per_token > 0
    linear, quadratic = spec.flops_coeffs()
    assert linear > 0 and quadratic > 0


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_qwen_state_and_kv_bytes_by_hand(name: str) -> None:
    layers, attn, hk, hv, dk, dv, kernel, kv_heads, head_dim = SHAPES[name]
    spec = get_preset(name)
    n_gdn = layers - attn
    assert (spec.n_attention, spec.n_ssm, spec.n_mlp) == (attn, n_gdn, layers)
    assert spec.ssm_state_bytes == n_gdn * gdn_state_bytes(hk, hv, dk, dv, kernel)
    assert spec.ssm_recurrent_bytes == n_gdn * hv * dk * dv * FP32
    assert spec.ssm_conv_bytes == n_gdn * (2 * hk * dk + hv * dv) * kernel * BF16
    assert spec.kv_bytes_per_token == kv_bytes(attn, kv_heads, head_dim)
    # every 4th layer is gated attention
    mixers = [x for x in spec.layers if isinstance(x, (AttentionLayer, GatedDeltaNetLayer))]
    assert [isinstance(x, AttentionLayer) for x in mixers] == [
        (i + 1) % 4 == 0 for i in range(layers)
    ]
    assert spec.max_position == 262144


def test_published_numbers() -> None:
    """The figures the README quotes: bytes of one state, KV bytes per token, and how many
    tokens of KV one state costs."""
    figures = {n: get_preset(n) for n in SHAPES}
    assert {n: s.ssm_state_bytes for n, s in figures.items()} == {
        "qwen3.5-27b": 154_927_104,
        "qwen3.5-35b-a3b": 64_880_640,
        "qwen3-next-80b-a3b": 77_856_768,
    }
    assert {n: s.kv_bytes_per_token for n, s in figures.items()} == {
        "qwen3.5-27b": 65_536,
        "qwen3.5-35b-a3b": 20_480,
        "qwen3-next-80b-a3b": 24_576,
    }
    ratios = {n: s.ssm_state_bytes / s.kv_bytes_per_token for n, s in figures.items()}
    assert ratios == {
        "qwen3.5-27b": 2364.0,
        "qwen3.5-35b-a3b": 3168.0,
        "qwen3-next-80b-a3b": 3168.0,
    }


def test_moe_presets_are_moe_everywhere_with_their_routing() -> None:
    for name, experts, top_k in (("qwen3.5-35b-a3b", 256, 8), ("qwen3-next-80b-a3b", 512, 10)):
        moes = [x for x in get_preset(name).layers if isinstance(x, MoELayer)]
        assert len(moes) == SHAPES[name][0]
        assert {(m.n_experts, m.top_k, m.d_ff, m.shared_d_ff) for m in moes} == {
            (experts, top_k, 512, 512)
        }
        assert all(m.shared_expert_gate and m.n_shared_experts == 1 for m in moes)


CLASSES: dict[str, Callable[..., Any]] = {
    "QWEN3_5_27B": Qwen3_5Config,
    "QWEN3_5_35B_A3B": Qwen3_5MoeConfig,
    "QWEN3_NEXT_80B_A3B": Qwen3NextConfig,
}


@pytest.mark.parametrize("const", sorted(CLASSES))
def test_preset_configs_parse_like_transformers_reads_them(const: str) -> None:
    """Loading the kept keys through the transformers config class and parsing its to_dict
    gives the same architecture: no key is misspelt or read differently."""
    raw = dict(getattr(preset_configs, const))
    ours = parse_hf_config(raw)
    kwargs = {k: v for k, v in raw.items() if k != "model_type"}
    theirs = parse_hf_config(CLASSES[const](**kwargs).to_dict())
    assert theirs.blocks == ours.blocks
    assert (theirs.vocab_size, theirs.max_position, theirs.tie_embeddings) == (
        ours.vocab_size,
        ours.max_position,
        ours.tie_embeddings,
    )
