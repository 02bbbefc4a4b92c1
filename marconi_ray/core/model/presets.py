"""Named model specs that need no config file: the Marconi paper's 7B hybrid (fp16
everywhere, the paper's convention) and the published hybrids of the fleet (Qwen3.5,
Qwen3-Next, Nemotron 3 Nano, Granite 4.0-H, Falcon-H1, Jamba 1.5, LFM2, Kimi Linear, OLMo
Hybrid, MiniMax-Text-01, RecurrentGemma) and pure SSMs (Falcon-Mamba); their config.json
values in `preset_configs`, with their sources; bf16 KV and conv states, fp32 recurrent
states as the engine keeps them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from marconi_ray.core.model import preset_configs
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.core.model.layers import AttentionLayer, LayerSpec, MLPLayer, PaperSSMLayer
from marconi_ray.core.model.model_spec import ModelSpec

PAPER_D_MODEL = 4096
PAPER_D_STATE = 128
PAPER_N_HEADS = 32
PAPER_D_CONV = 4
PAPER_VOCAB = 32000


def paper_7b() -> ModelSpec:
    """The paper's 7B hybrid (NVIDIA's 8B Mamba2-Hybrid layer mix), counted as Appendix A.

    4 MHA attention layers (D = 4096, 32 heads x 128), 24 SSM layers (N = 128, conv over
    2*D + 2*N = 8448 channels with kernel 4), 28 plain MLPs with F = 4*D, fp16. Layers are
    interleaved roughly evenly; order does not affect any FLOP or byte figure.
    """
    d, n = PAPER_D_MODEL, PAPER_D_STATE
    attention = AttentionLayer(d, PAPER_N_HEADS, PAPER_N_HEADS, d // PAPER_N_HEADS)
    ssm = PaperSSMLayer(d, n, conv_channels=2 * d + 2 * n, d_conv=PAPER_D_CONV)
    mlp = MLPLayer(d, 4 * d, gated=False)
    layers: list[LayerSpec] = []
    for _ in range(4):  # 4 blocks of 7 mixers (6 SSM + 1 attention), each followed by an MLP
        for i in range(7):
            layers.append(attention if i == 3 else ssm)
            layers.append(mlp)
    return ModelSpec(
        "paper-7b", tuple(layers), dtype_bytes=2, vocab_size=PAPER_VOCAB, max_position=None
    )


def _published(name: str, config: Mapping[str, object]) -> Callable[[], ModelSpec]:
    """A factory of the spec of a published config.json: KV and conv states in bf16, the
    recurrent states (Gated DeltaNet, KDA, lightning attention, RG-LRU, mLSTM, Mamba-1/2) in
    fp32, as the engine keeps them (and as the Qwen models run the delta rule and
    Nemotron 3 Nano's config asks, mamba_ssm_cache_dtype float32)."""

    def build() -> ModelSpec:
        return spec_from_hf_config(config, dtype_bytes=2, name=name, state_dtype_bytes=4)

    build.__doc__ = (
        f"{name}: cost model of its published config.json (preset_configs); KV and conv "
        "states in bf16, recurrent states in fp32."
    )
    return build


PRESETS: Mapping[str, Callable[[], ModelSpec]] = MappingProxyType(
    {
        "paper-7b": paper_7b,
        "qwen3.5-27b": _published("qwen3.5-27b", preset_configs.QWEN3_5_27B),
        "qwen3.5-35b-a3b": _published("qwen3.5-35b-a3b", preset_configs.QWEN3_5_35B_A3B),
        "qwen3-next-80b-a3b": _published("qwen3-next-80b-a3b", preset_configs.QWEN3_NEXT_80B_A3B),
        "nemotron-3-nano-30b-a3b": _published(
            "nemotron-3-nano-30b-a3b", preset_configs.NEMOTRON_3_NANO_30B_A3B
        ),
        "granite-4.0-h-tiny": _published("granite-4.0-h-tiny", preset_configs.GRANITE_4_0_H_TINY),
        "granite-4.0-h-small": _published(
            "granite-4.0-h-small", preset_configs.GRANITE_4_0_H_SMALL
        ),
        "falcon-h1-7b": _published("falcon-h1-7b", preset_configs.FALCON_H1_7B),
        "jamba-1.5-mini": _published("jamba-1.5-mini", preset_configs.JAMBA_1_5_MINI),
        "lfm2-2.6b": _published("lfm2-2.6b", preset_configs.LFM2_2_6B),
        "falcon-mamba-7b": _published("falcon-mamba-7b", preset_configs.FALCON_MAMBA_7B),
        "xlstm-7b": _published("xlstm-7b", preset_configs.XLSTM_7B),
        "kimi-linear-48b-a3b": _published(
            "kimi-linear-48b-a3b", preset_configs.KIMI_LINEAR_48B_A3B
        ),
        "olmo-hybrid-7b": _published("olmo-hybrid-7b", preset_configs.OLMO_HYBRID_7B),
        "minimax-text-01": _published("minimax-text-01", preset_configs.MINIMAX_TEXT_01),
        "recurrentgemma-2b": _published("recurrentgemma-2b", preset_configs.RECURRENTGEMMA_2B),
        "ling-3.0-flash": _published("ling-3.0-flash", preset_configs.LING_3_0_FLASH),
        "lfm3-1.7b": _published("lfm3-1.7b", preset_configs.LFM3_1_7B),
    }
)
"""Immutable registry of preset names -> spec factories."""


def get_preset(name: str) -> ModelSpec:
    """Build the preset called `name`; ValueError naming it (and the known ones) otherwise."""
    try:
        factory = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}") from None
    return factory()
