"""RecurrentGemma's config parse (`model_type` "recurrent_gemma", Griffin).

Layer i runs the temporal block of `block_types[i % len(block_types)]` ("recurrent": the
RG-LRU block, `RGLRUConfig`; "attention": sliding-window attention over
`attention_window_size` positions, `SlidingAttentionConfig`), then a gated MLP of width
intermediate_size // 2 (gelu, with biases), each after an RMSNorm of scale (1 + w). The
embeddings are multiplied by sqrt(hidden_size) rounded to bfloat16 (transformers keeps
that normaliser as a bfloat16 buffer); the logits are soft-capped,
cap * tanh(logits / cap). The attention's q/k/v have biases when `attention_bias`, its
o_proj always; RoPE rotates int(head_dim * partial_rotary_factor) channels (0.5 unless
`rope_parameters` or the legacy top-level key says otherwise). Released config.json files
write `_block_types`, which transformers does not read (its default cycle is the same),
and neither does this parse; head_dim is always hidden_size // num_attention_heads, as
transformers derives it whatever the file says.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import replace
from typing import Final

from marconi_ray.core.model.hf import defaults
from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    BlockConfig,
    HfArchitecture,
    MLPConfig,
    RGLRUConfig,
    Scales,
    SlidingAttentionConfig,
)
from marconi_ray.core.model.hf.blocks import architecture, per_layer
from marconi_ray.core.model.hf.reader import ConfigReader

FAMILY: Final = "recurrent_gemma"
RECURRENT: Final = "recurrent"
ATTENTION: Final = "attention"
PARTIAL_ROTARY_DEFAULT: Final = 0.5


def bfloat16(value: float) -> float:
    """`value` rounded to the nearest bfloat16 (ties to even), as torch casts a float32."""
    (bits,) = struct.unpack("<I", struct.pack("<f", value))
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    (out,) = struct.unpack("<f", struct.pack("<I", bits))
    return float(out)


def _block_types(r: ConfigReader, n_layers: int) -> list[str]:
    """Each layer's temporal block: `block_types` repeated over the layers."""
    raw = r.raw("block_types")
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ValueError(f"{FAMILY} config key 'block_types' must be a non-empty list, got {raw!r}")
    for t in raw:
        if t not in (RECURRENT, ATTENTION):
            raise ValueError(
                f"{FAMILY} config key 'block_types' has unknown block type {t!r}; "
                f"expected {RECURRENT!r} or {ATTENTION!r}"
            )
    return [str(raw[i % len(raw)]) for i in range(n_layers)]


def _rope(r: ConfigReader, head_dim: int) -> tuple[int, float]:
    """(rotary_dim, theta): `rope_parameters` over the legacy top-level keys, theta 10000
    and the factor 0.5 when neither gives them; only the default RoPE type exists."""
    params: dict[str, object] = {
        k: r.raw(k) for k in ("rope_theta", "partial_rotary_factor") if r.has(k)
    }
    stated = r.raw("rope_parameters")
    if stated is not None:
        if not isinstance(stated, Mapping):
            raise ValueError(
                f"{FAMILY} config key 'rope_parameters' must be a mapping, got {stated!r}"
            )
        params.update(stated)
    rope_type = params.get("rope_type", "default")
    if rope_type != "default":
        raise ValueError(
            f"{FAMILY} config key 'rope_parameters' has rope_type {rope_type!r}; "
            "only 'default' exists"
        )
    values = []
    for name, default in (
        ("rope_theta", 10000.0),
        ("partial_rotary_factor", PARTIAL_ROTARY_DEFAULT),
    ):
        value = params.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(
                f"{FAMILY} config key 'rope_parameters' entry {name!r} must be a positive "
                f"number, got {value!r}"
            )
        values.append(float(value))
    return int(head_dim * values[1]), values[0]


def parse_recurrent_gemma(config: Mapping[str, object]) -> HfArchitecture:
    """RecurrentGemma: see the module docstring."""
    r = ConfigReader(config, defaults.RECURRENT_GEMMA, FAMILY)
    d = r.pos_int("hidden_size")
    n_layers = r.pos_int("num_hidden_layers")
    heads = r.pos_int("num_attention_heads")
    kv = r.opt_int("num_key_value_heads")
    lru = r.opt_int("lru_width")
    activation = r.req_str("hidden_activation")
    head_dim = d // heads
    rotary_dim, theta = _rope(r, head_dim)
    types = _block_types(r, n_layers)
    layers: list[list[BlockConfig]] = []
    mlp = MLPConfig(r.pos_int("intermediate_size") // 2, activation, gated=True, bias=True)
    for t in types:
        mixer: BlockConfig
        if t == RECURRENT:
            mixer = RGLRUConfig(
                d if lru is None else lru, heads, r.req_int("conv1d_width"), activation
            )
        else:
            attn = AttentionConfig(
                n_heads=heads,
                n_kv_heads=heads if kv is None else kv,
                head_dim=head_dim,
                rotary_dim=rotary_dim,
                rope_theta=theta,
                bias=r.flag("attention_bias"),
            )
            mixer = SlidingAttentionConfig(
                attn, r.req_int("attention_window_size"), output_bias=True
            )
        layers.append([mixer, mlp])
    arch = architecture(r, per_layer(layers), unit_offset_norms=True)
    cap = r.req_float("logits_soft_cap")
    if not math.isfinite(cap) or cap < 0:
        raise ValueError(f"{FAMILY} config key 'logits_soft_cap' must be >= 0, got {cap!r}")
    scales = Scales(embedding=bfloat16(math.sqrt(d)))
    return replace(arch, scales=scales, logits_soft_cap=cap or None)
