"""Named model specs that need no config file, starting with the Marconi paper's 7B hybrid."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from marconi_ray.core.layers import AttentionLayer, LayerSpec, MLPLayer, PaperSSMLayer
from marconi_ray.core.model_spec import ModelSpec

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


PRESETS: Mapping[str, Callable[[], ModelSpec]] = MappingProxyType({"paper-7b": paper_7b})
"""Immutable registry of preset names -> spec factories."""


def get_preset(name: str) -> ModelSpec:
    """Build the preset called `name`; ValueError naming it (and the known ones) otherwise."""
    try:
        factory = PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}") from None
    return factory()
