"""The named presets: each builds, and its per-state bytes and KV bytes per token equal a
hand computation from the published shapes (published models: bf16 KV and conv states,
fp32 recurrent states; paper-7b: fp16 everywhere)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from transformers import (
    FalconH1Config,
    FalconMambaConfig,
    GraniteMoeHybridConfig,
    JambaConfig,
    KimiLinearConfig,
    Lfm2Config,
    Lfm3Config,
    MiniMaxConfig,
    NemotronHConfig,
    OlmoHybridConfig,
    Qwen3_5Config,
    Qwen3_5MoeConfig,
    Qwen3NextConfig,
    RecurrentGemmaConfig,
    xLSTMConfig,
)
from transformers.models.bailing_hybrid.configuration_bailing_hybrid import BailingHybridConfig

from marconi_ray.core.model import preset_configs
from marconi_ray.core.model.hf.parse import parse_hf_config
from marconi_ray.core.model.kimi_layers import KDALayer, MLALayer
from marconi_ray.core.model.layers import (
    AttentionLayer,
    GatedDeltaNetLayer,
    Mamba1Layer,
    Mamba2Layer,
    MLPLayer,
    MoELayer,
    RGLRULayer,
)
from marconi_ray.core.model.lightning_layer import LightningLayer
from marconi_ray.core.model.presets import PRESETS, get_preset

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


def mamba2_state_bytes(heads: int, head_dim: int, groups: int, d_state: int, kernel: int) -> int:
    """One Mamba-2 layer: recurrent heads x head_dim x d_state in fp32 plus conv
    (heads*head_dim + 2*groups*d_state) x kernel in bf16."""
    d_inner = heads * head_dim
    return d_inner * d_state * FP32 + (d_inner + 2 * groups * d_state) * kernel * BF16


def mamba1_state_bytes(d_inner: int, d_state: int, kernel: int) -> int:
    """One Mamba-1 layer: recurrent d_inner x d_state in fp32 plus conv d_inner x kernel."""
    return d_inner * d_state * FP32 + d_inner * kernel * BF16


# name: (SSM layers, one SSM layer's state bytes, attention layers, KV heads, head_dim,
#        max positions), every number from the published config (preset_configs)
FLEET = {
    # 23 "M" of the 52-character pattern, 64 heads of 64, 8 groups, state 128, kernel 4;
    # 6 "*" with 2 KV heads of 128
    "nemotron-3-nano-30b-a3b": (23, mamba2_state_bytes(64, 64, 8, 128, 4), 6, 2, 128, 262144),
    # 36 Mamba2 layers of 48 heads x 64 (2 * 1536 / 48), 1 group, state 128; 4 attention
    # layers with 4 KV heads of 1536 / 12 = 128
    "granite-4.0-h-tiny": (36, mamba2_state_bytes(48, 64, 1, 128, 4), 4, 4, 128, 131072),
    # 128 heads x 64 (2 * 4096 / 128); 8 KV heads of 4096 / 32 = 128
    "granite-4.0-h-small": (36, mamba2_state_bytes(128, 64, 1, 128, 4), 4, 8, 128, 131072),
    # every one of the 44 layers has a Mamba-2 (24 heads of 128 = mamba_d_ssm 3072, state
    # 256) and an attention (2 KV heads of 128) side by side
    "falcon-h1-7b": (44, mamba2_state_bytes(24, 128, 1, 256, 4), 44, 2, 128, 262144),
    # attention every 8th layer from 4 (4 of 32), Mamba-1 with d_inner 2 * 4096, state 16
    "jamba-1.5-mini": (28, mamba1_state_bytes(8192, 16, 4), 4, 8, 4096 // 32, 262144),
    # 22 short convs whose only state is the 2048 x conv_L_cache (3) window, in bf16; 8
    # attention layers with 8 KV heads of 2048 / 32 = 64
    "lfm2-2.6b": (22, 2048 * 3 * BF16, 8, 8, 64, 128000),
    # 64 Mamba-1 layers of d_inner 8192 (the file's intermediate_size, not its expand of
    # 16), state 16; no attention, no context limit in the config
    "falcon-mamba-7b": (64, mamba1_state_bytes(8192, 16, 4), 0, 0, 0, None),
    # 32 mLSTM layers of 8 heads: C (256 x 512), n (256) and m per head, in fp32; no
    # attention, no context limit in the config
    "xlstm-7b": (32, 8 * (256 * 512 + 256 + 1) * FP32, 0, 0, 0, None),
}
NO_KV = {"falcon-mamba-7b", "xlstm-7b"}
"""Pure SSMs: no KV bytes and no quadratic FLOPs."""


def kda_state_bytes(heads: int, head_dim: int, kernel: int) -> int:
    """One KDA layer: recurrent heads x head_dim x head_dim in fp32 plus the q, k and v
    conv windows, 3 x heads*head_dim x kernel, in bf16."""
    return heads * head_dim * head_dim * FP32 + 3 * heads * head_dim * kernel * BF16


def lightning_state_bytes(heads: int, head_dim: int) -> int:
    """One lightning attention layer: a head_dim x head_dim fp32 state per head, no conv."""
    return heads * head_dim * head_dim * FP32


def rglru_state_bytes(width: int, kernel: int) -> int:
    """One RG-LRU block: the fp32 LRU state (width) plus its conv window in bf16."""
    return width * FP32 + width * kernel * BF16


# name: (recurrent layers, one layer's state bytes, KV layers, KV bytes of one layer per
#        token, max positions), every number from the published config (preset_configs)
HYBRIDS_2026 = {
    # KDA at the 20 layers of kda_layers, 32 heads of 128, conv 4; MLA at the 7 layers of
    # full_attn_layers caches the latent (kv_lora_rank 512) and the shared RoPE key (64)
    "kimi-linear-48b-a3b": (20, kda_state_bytes(32, 128, 4), 7, (512 + 64) * BF16, 1048576),
    # Gated DeltaNet at 24 of 32 layers (30 key and 30 value heads of 96 / 192); full
    # attention at every 4th with 30 KV heads of 3840 / 30 = 128
    "olmo-hybrid-7b": (24, gdn_state_bytes(30, 30, 96, 192, 4), 8, 2 * 30 * 128 * BF16, 65536),
    # lightning attention at 70 of 80 layers (64 heads of 128); softmax attention at every
    # 8th with 8 KV heads of 128
    "minimax-text-01": (70, lightning_state_bytes(64, 128), 10, 2 * 8 * 128 * BF16, 10240000),
    # the cycle recurrent, recurrent, attention over 26 layers: 18 RG-LRU blocks of width
    # 2560 (conv 4), 8 local attentions with one KV head of 2560 / 10 = 256: every
    # attention layer windowed, so each state holds 2048 positions of it and no KV is
    # per token (`test_2026_hybrids_state_and_kv_bytes_by_hand`); no context limit
    "recurrentgemma-2b": (18, rglru_state_bytes(2560, 4), 8, 2 * 1 * 256 * BF16, None),
    # KDA at 35 of 42 layers (32 heads of 128, conv 4); MLA at the last of every 6 caches
    # the latent (512) and the shared RoPE key (64); no context limit in the copy: the
    # class default
    "ling-3.0-flash": (35, kda_state_bytes(32, 128, 4), 7, (512 + 64) * BF16, 262144),
    # 13 gated short convs of 2048 (their state: the last 7 inputs); 11 attentions (4 KV
    # heads of 128), 5 of them windowed (256): those in each state, the 6 full per token
    "lfm3-1.7b": (13, 2048 * 7 * BF16, 11, 2 * 4 * 128 * BF16, 262144),
}
WINDOWED_2026 = {"recurrentgemma-2b": 8, "lfm3-1.7b": 5}
"""Of each windowed preset's attention layers, the sliding-window ones."""


def test_registry() -> None:
    assert set(PRESETS) == {"paper-7b", *SHAPES, *FLEET, *HYBRIDS_2026}
    with pytest.raises(ValueError, match=r"qwen3\.5-27b"):
        get_preset("qwen-nope")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_builds(name: str) -> None:
    spec = get_preset(name)
    assert spec.name == name and spec.dtype_bytes == BF16
    assert spec.state_dtype_bytes == (None if name == "paper-7b" else FP32)
    linear, quadratic = spec.flops_coeffs()
    assert spec.ssm_state_bytes > 0 and linear > 0
    if name in NO_KV:
        assert spec.kv_bytes_per_token == 0 and quadratic == 0
    elif spec.window_state is not None:
        # windowed attention layers: their KV is in each checkpoint, their FLOPs windowed
        # (RecurrentGemma has no other KV, LFM3 its full layers' per token)
        assert spec.window_bytes > 0 and spec.window_terms()
    else:
        # attention past linear: n*n, or n*min(n, W) for a sliding window (RecurrentGemma)
        assert spec.kv_bytes_per_token > 0 and (quadratic > 0 or spec.window_terms())


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
    """The figures docs/RESULTS.md quotes: bytes of one state, KV bytes per token, and how
    many tokens of KV one state costs."""
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


@pytest.mark.parametrize("name", sorted(FLEET))
def test_fleet_state_and_kv_bytes_by_hand(name: str) -> None:
    n_ssm, layer_state, n_attention, kv_heads, head_dim, positions = FLEET[name]
    spec = get_preset(name)
    assert (spec.n_ssm, spec.n_attention) == (n_ssm, n_attention)
    assert spec.ssm_state_bytes == n_ssm * layer_state
    assert spec.kv_bytes_per_token == kv_bytes(n_attention, kv_heads, head_dim)
    assert spec.max_position == positions


def test_fleet_published_numbers() -> None:
    """The figures docs/RESULTS.md quotes: bytes of one state, KV bytes per token, and one
    state in tokens of KV."""
    specs = {n: get_preset(n) for n in FLEET if n not in NO_KV}
    assert {n: (s.ssm_state_bytes, s.kv_bytes_per_token) for n, s in specs.items()} == {
        "nemotron-3-nano-30b-a3b": (49_364_992, 6_144),
        "granite-4.0-h-tiny": (57_581_568, 8_192),
        "granite-4.0-h-small": (153_427_968, 16_384),
        "falcon-h1-7b": (139_673_600, 45_056),
        "jamba-1.5-mini": (16_515_072, 16_384),
        "lfm2-2.6b": (270_336, 16_384),
    }
    ratios = {n: round(s.ssm_state_bytes / s.kv_bytes_per_token, 1) for n, s in specs.items()}
    assert ratios == {
        "nemotron-3-nano-30b-a3b": 8034.7,
        "granite-4.0-h-tiny": 7029.0,
        "granite-4.0-h-small": 9364.5,
        "falcon-h1-7b": 3100.0,
        "jamba-1.5-mini": 1008.0,
        "lfm2-2.6b": 16.5,
    }


def test_fleet_layer_kinds_and_feed_forwards() -> None:
    nano = get_preset("nemotron-3-nano-30b-a3b").layers
    assert sum(isinstance(x, Mamba2Layer) for x in nano) == 23
    moes = [x for x in nano if isinstance(x, MoELayer)]
    assert len(moes) == 23 and not any(isinstance(x, MLPLayer) for x in nano)
    assert {(m.n_experts, m.top_k, m.d_ff, m.shared_d_ff, m.gated) for m in moes} == {
        (128, 6, 1856, 3712, False)
    }
    for name, experts, top_k, d_ff, shared in (
        ("granite-4.0-h-tiny", 64, 6, 512, 1024),
        ("granite-4.0-h-small", 72, 10, 768, 1536),
    ):
        moes = [x for x in get_preset(name).layers if isinstance(x, MoELayer)]
        assert len(moes) == 40
        assert {(m.n_experts, m.top_k, m.d_ff, m.shared_d_ff) for m in moes} == {
            (experts, top_k, d_ff, shared)
        }
    jamba = get_preset("jamba-1.5-mini").layers
    assert sum(isinstance(x, Mamba1Layer) for x in jamba) == 28
    assert sum(isinstance(x, MoELayer) for x in jamba) == 16  # every other layer, from 1
    mixers = [x for x in jamba if isinstance(x, (AttentionLayer, Mamba1Layer))]
    assert [i for i, x in enumerate(mixers) if isinstance(x, AttentionLayer)] == [4, 12, 20, 28]
    falcon = get_preset("falcon-h1-7b").layers
    assert sum(isinstance(x, MLPLayer) for x in falcon) == 44
    lfm2 = get_preset("lfm2-2.6b")
    assert lfm2.ssm_recurrent_bytes == 0  # a short conv keeps no recurrent state
    assert {(x.d_ff, x.gated) for x in lfm2.layers if isinstance(x, MLPLayer)} == {(10752, True)}


CLASSES: dict[str, Callable[..., Any]] = {
    "QWEN3_5_27B": Qwen3_5Config,
    "QWEN3_5_35B_A3B": Qwen3_5MoeConfig,
    "QWEN3_NEXT_80B_A3B": Qwen3NextConfig,
    "NEMOTRON_3_NANO_30B_A3B": NemotronHConfig,
    "GRANITE_4_0_H_TINY": GraniteMoeHybridConfig,
    "GRANITE_4_0_H_SMALL": GraniteMoeHybridConfig,
    "FALCON_H1_7B": FalconH1Config,
    "JAMBA_1_5_MINI": JambaConfig,
    "LFM2_2_6B": Lfm2Config,
    "FALCON_MAMBA_7B": FalconMambaConfig,
    "XLSTM_7B": xLSTMConfig,
    "KIMI_LINEAR_48B_A3B": KimiLinearConfig,
    "OLMO_HYBRID_7B": OlmoHybridConfig,
    "MINIMAX_TEXT_01": MiniMaxConfig,
    "RECURRENTGEMMA_2B": RecurrentGemmaConfig,
    "LING_3_0_FLASH": BailingHybridConfig,
    "LFM3_1_7B": Lfm3Config,
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


def test_falcon_mamba_is_states_only() -> None:
    """Falcon-Mamba-7B: every layer a Mamba-1 with weightless inner norms, no attention and
    no MLP; its 7.3B parameters' state is 64 x (8192 x 16 fp32 + 8192 x 4 bf16)."""
    spec = get_preset("falcon-mamba-7b")
    assert all(isinstance(x, Mamba1Layer) for x in spec.layers) and len(spec.layers) == 64
    assert spec.ssm_state_bytes == 37_748_736 and spec.kv_bytes_per_token == 0


@pytest.mark.parametrize("name", sorted(HYBRIDS_2026))
def test_2026_hybrids_state_and_kv_bytes_by_hand(name: str) -> None:
    n_recurrent, layer_state, n_kv, layer_kv, positions = HYBRIDS_2026[name]
    spec = get_preset(name)
    assert (spec.n_ssm, spec.n_attention) == (n_recurrent, n_kv)
    window = spec.window_state or 0  # a windowed layer's W positions of KV are state
    n_window = WINDOWED_2026.get(name, 0)
    assert spec.ssm_state_bytes == n_recurrent * layer_state + window * n_window * layer_kv
    assert spec.kv_bytes_per_token == (n_kv - n_window) * layer_kv
    assert spec.max_position == positions


def test_2026_hybrids_published_numbers() -> None:
    """The figures docs/RESULTS.md quotes: bytes of one state, KV bytes per token, and one
    state in tokens of KV."""
    specs = {n: get_preset(n) for n in HYBRIDS_2026}
    assert {n: (s.ssm_state_bytes, s.kv_bytes_per_token) for n, s in specs.items()} == {
        "kimi-linear-48b-a3b": (43_909_120, 8_064),
        "olmo-hybrid-7b": (55_296_000, 122_880),
        "minimax-text-01": (293_601_280, 40_960),
        "recurrentgemma-2b": (17_330_176, 0),
        "ling-3.0-flash": (76_840_960, 8_064),
        "lfm3-1.7b": (2_994_176, 12_288),
    }
    ratios = {
        n: round(s.ssm_state_bytes / s.kv_bytes_per_token, 1)
        for n, s in specs.items()
        if s.kv_bytes_per_token
    }
    assert ratios == {
        "kimi-linear-48b-a3b": 5445.1,
        "olmo-hybrid-7b": 450.0,
        "minimax-text-01": 7168.0,
        "ling-3.0-flash": 9528.9,
        "lfm3-1.7b": 243.7,
    }
    gemma = specs["recurrentgemma-2b"]  # 552,960 of RG-LRU states, 2048 x 8,192 of window
    assert gemma.ssm_bytes_by_part()["window"] == 2048 * 8_192 == gemma.window_bytes


def test_2026_hybrids_layer_kinds_and_feed_forwards() -> None:
    kimi = get_preset("kimi-linear-48b-a3b").layers
    mixers = [x for x in kimi if isinstance(x, (KDALayer, MLALayer))]
    assert [i + 1 for i, x in enumerate(mixers) if isinstance(x, MLALayer)] == [
        4, 8, 12, 16, 20, 24, 27
    ]  # fmt: skip
    assert {x.kv_elements_per_token() for x in mixers if isinstance(x, MLALayer)} == {576}
    assert [(x.d_ff, x.gated) for x in kimi if isinstance(x, MLPLayer)] == [(9216, True)]
    moes = [x for x in kimi if isinstance(x, MoELayer)]
    assert len(moes) == 26 and {(m.n_experts, m.top_k, m.d_ff, m.shared_d_ff) for m in moes} == {
        (256, 8, 1024, 1024)
    }
    olmo = get_preset("olmo-hybrid-7b").layers
    kinds = [x for x in olmo if isinstance(x, (AttentionLayer, GatedDeltaNetLayer))]
    assert [i for i, x in enumerate(kinds) if isinstance(x, AttentionLayer)] == list(
        range(3, 32, 4)
    )
    assert {(x.d_ff, x.gated) for x in olmo if isinstance(x, MLPLayer)} == {(11008, True)}
    minimax = get_preset("minimax-text-01").layers
    kinds = [x for x in minimax if isinstance(x, (AttentionLayer, LightningLayer))]
    assert [i for i, x in enumerate(kinds) if isinstance(x, AttentionLayer)] == list(
        range(7, 80, 8)
    )
    moes = [x for x in minimax if isinstance(x, MoELayer)]
    assert len(moes) == 80 and {(m.n_experts, m.top_k, m.d_ff) for m in moes} == {(32, 2, 9216)}
    ling = get_preset("ling-3.0-flash").layers
    mixers = [x for x in ling if isinstance(x, (KDALayer, MLALayer))]
    assert [i for i, x in enumerate(mixers) if isinstance(x, MLALayer)] == list(range(5, 42, 6))
    assert {x.kv_elements_per_token() for x in mixers if isinstance(x, MLALayer)} == {576}
    assert [(x.d_ff, x.gated) for x in ling if isinstance(x, MLPLayer)] == [(6144, True)] * 2
    moes = [x for x in ling if isinstance(x, MoELayer)]
    assert len(moes) == 40 and {(m.n_experts, m.top_k, m.d_ff, m.shared_d_ff) for m in moes} == {
        (512, 8, 768, 768)
    }
    lfm3 = get_preset("lfm3-1.7b")
    windows = [x.window for x in lfm3.layers if isinstance(x, AttentionLayer)]
    assert windows == [None, 256] * 5 + [None] and lfm3.n_ssm == 13
    assert {
        (x.n_kv_heads, x.head_dim, x.head_gate)
        for x in lfm3.layers
        if isinstance(x, AttentionLayer)
    } == {(4, 128, True)}
    gemma = get_preset("recurrentgemma-2b")
    kinds = [x for x in gemma.layers if isinstance(x, (AttentionLayer, RGLRULayer))]
    assert [isinstance(x, AttentionLayer) for x in kinds] == [i % 3 == 2 for i in range(26)]
    assert gemma.ssm_recurrent_bytes == 18 * 2560 * FP32
