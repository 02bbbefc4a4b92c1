"""LFM3's config parse (`model_type` "lfm3").

Each layer runs one operator on `operator_norm(x)`, then a SwiGLU feed-forward (w1, w3,
w2 of `intermediate_size`, no bias) on `ffn_norm(x)`; with `use_sandwich_norm` each
output is RMS-normed again (post_operator_norm, post_ffn_norm) before the residual add
(`HfArchitecture.sandwich_norms`). The operator is, per `layer_types`:

- "conv": LFM2's gated short conv (`ShortConvConfig`, kernel `conv_L_cache`, biases when
  `conv_bias`), the same weights and math as LFM2's;
- "full_attention": GQA attention (`AttentionConfig`) with RMSNorms over head_dim on q
  and k, a per-head sigmoid gate `g_proj` when `use_attention_gate`, q/k/v/o biases when
  `attention_bias`, and the RoPE of `rope_parameters["full_attention"]`;
- "sliding_attention": the same attention over the last `sliding_window` positions
  (`SlidingAttentionConfig`), with the RoPE of `rope_parameters["sliding_attention"]`.

RoPE per kind: "default" rotates the whole head at theta^(-2i / head_dim), whatever
partial_rotary_factor says, as transformers 5.x reads it (NVIDIA NeMo AutoModel's LFM3
config notes that released checkpoints label their partial rotation so, and relabels
it "proportional"; this parse follows transformers);
"proportional" rotates int(partial_rotary_factor * head_dim // 2) pairs of the whole head
at those same frequencies and leaves the rest (see `AttentionConfig.rope_type`). A null
`rope_parameters` is transformers' default (sliding: default, theta 1e4; full:
proportional, theta 1e6, factor 0.5); an entry without rope_theta takes the class's
`default_theta` (1e6), as transformers fills it. A null `layer_types` is the class's
cycle (full attention at i % 4 == 2, sliding at i % 4 == 0 for i > 0, conv elsewhere).
The final norm is `embedding_norm`, as in LFM2.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Final

from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    BlockConfig,
    HfArchitecture,
    MLPConfig,
    ShortConvConfig,
    SlidingAttentionConfig,
)
from marconi_ray.core.model.hf.blocks import architecture, layer_types, per_layer
from marconi_ray.core.model.hf.reader import ConfigReader

FAMILY: Final = "lfm3"
CONV: Final = "conv"
FULL: Final = "full_attention"
SLIDING: Final = "sliding_attention"
DEFAULT_THETA: Final = 1_000_000.0
"""`Lfm3Config.default_theta`: the rope_theta of an entry that gives none."""
ROPE_TYPES: Final = ("default", "proportional")

LFM3: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 128_000,
        "hidden_size": 2048,
        "intermediate_size": 7680,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "max_position_embeddings": 128_000,
        "norm_eps": 1e-5,
        "eos_token_id": 124_900,
        "tie_word_embeddings": True,
        "rope_parameters": None,
        "conv_bias": False,
        "conv_L_cache": 7,
        "layer_types": None,
        "sliding_window": 256,
        "use_sandwich_norm": True,
        "use_attention_gate": True,
        "attention_bias": False,
    }
)
"""transformers' `Lfm3Config` defaults (5.x) for the keys read here."""
LFM3_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {"norm_eps": ("rms_norm_eps",)}
)
"""`Lfm3Config.attribute_map`: rms_norm_eps is norm_eps."""
DEFAULT_ROPE: Final[Mapping[str, Mapping[str, object]]] = MappingProxyType(
    {
        SLIDING: MappingProxyType({"rope_type": "default", "rope_theta": 10_000.0}),
        FULL: MappingProxyType(
            {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5}
        ),
    }
)
"""`Lfm3Config.__post_init__`'s rope_parameters when the config gives none."""


def default_layer_types(n_layers: int) -> list[str]:
    """`Lfm3Config.__post_init__`'s layer_types for `n_layers` layers."""
    return [
        FULL if i % 4 == 2 else SLIDING if i % 4 == 0 and i > 0 else CONV for i in range(n_layers)
    ]


def _layer_types(r: ConfigReader, n_layers: int) -> list[str]:
    raw = r.opt_str_list("layer_types")
    types = (
        default_layer_types(n_layers)
        if raw is None
        else layer_types(raw, FAMILY, (CONV, FULL, SLIDING))
    )
    if len(types) != n_layers:
        raise ValueError(
            f"{FAMILY} config has {len(types)} layer_types for num_hidden_layers={n_layers}"
        )
    return types


def _number(kind: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(
            f"{FAMILY} config key 'rope_parameters' entry {kind}.{name} must be a positive "
            f"number, got {value!r}"
        )
    return float(value)


def _rope(r: ConfigReader, kind: str, head_dim: int) -> tuple[int, float, str]:
    """(rotary_dim, theta, rope_type) of the layers of `kind` from its rope_parameters
    entry (see the module docstring)."""
    stated = r.raw("rope_parameters")
    if stated is None:
        stated = DEFAULT_ROPE
    if not isinstance(stated, Mapping):
        raise ValueError(f"{FAMILY} config key 'rope_parameters' must be a mapping, got {stated!r}")
    params = stated.get(kind)
    if not isinstance(params, Mapping):
        raise ValueError(
            f"{FAMILY} config key 'rope_parameters' needs a mapping for {kind!r}, got {params!r}"
        )
    rope_type = params.get("rope_type", "default")
    if rope_type not in ROPE_TYPES:
        raise ValueError(
            f"{FAMILY} config key 'rope_parameters' entry {kind}.rope_type is {rope_type!r}; "
            f"supported: {list(ROPE_TYPES)}"
        )
    theta = _number(kind, "rope_theta", params.get("rope_theta", DEFAULT_THETA))
    if rope_type == "default":
        return head_dim, theta, "default"
    if _number(kind, "factor", params.get("factor", 1.0)) != 1.0:
        raise ValueError(
            f"{FAMILY} config key 'rope_parameters' entry {kind}.factor must be 1, "
            f"got {params['factor']!r}"
        )
    proportion = _number(kind, "partial_rotary_factor", params.get("partial_rotary_factor", 1.0))
    if proportion > 1:
        raise ValueError(
            f"{FAMILY} config key 'rope_parameters' entry {kind}.partial_rotary_factor must "
            f"be <= 1, got {proportion!r}"
        )
    return 2 * int(proportion * head_dim // 2), theta, "proportional"


def _attention(r: ConfigReader, kind: str) -> AttentionConfig:
    heads = r.pos_int("num_attention_heads")
    kv = r.pos_int("num_key_value_heads")
    head_dim = r.pos_int("head_dim")
    if head_dim % 2:
        raise ValueError(f"{FAMILY} config key 'head_dim' must be even, got {head_dim}")
    rotary_dim, theta, rope_type = _rope(r, kind, head_dim)
    return AttentionConfig(
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        bias=r.flag("attention_bias"),
        rope_type=rope_type,
        qk_norm=True,
        head_gate=r.flag("use_attention_gate"),
    )


def parse_lfm3(config: Mapping[str, object]) -> HfArchitecture:
    """LFM3: see the module docstring."""
    r = ConfigReader(config, LFM3, FAMILY, LFM3_ALIASES)
    n_layers = r.pos_int("num_hidden_layers")
    types = _layer_types(r, n_layers)
    mlp = MLPConfig(r.pos_int("intermediate_size"), "silu", gated=True)
    mixers: dict[str, BlockConfig] = {
        CONV: ShortConvConfig(r.req_int("conv_L_cache"), r.flag("conv_bias"))
    }
    if FULL in types:
        mixers[FULL] = _attention(r, FULL)
    if SLIDING in types:
        window = r.opt_int("sliding_window")
        if window is None or window < 1:
            raise ValueError(
                f"{FAMILY} config key 'sliding_window' must be a positive int with "
                f"sliding_attention layers, got {window!r}"
            )
        mixers[SLIDING] = SlidingAttentionConfig(_attention(r, SLIDING), window)
    arch = architecture(r, per_layer([mixers[t], mlp] for t in types), norm_key="norm_eps")
    return replace(arch, sandwich_norms=r.flag("use_sandwich_norm"))


VL_FAMILY: Final = "lfm3_vl"
VL_SKIPPED: Final = ("model.vision_tower.", "model.multi_modal_projector.")
"""Checkpoint prefixes of LFM3-VL's vision encoder and projector, which the language
model does not use."""


def parse_lfm3_vl(config: Mapping[str, object]) -> HfArchitecture:
    """LFM3-VL (`Lfm3VlConfig`): its LFM3 language model (`text_config`, parsed by
    `parse_lfm3`; a missing one is `Lfm3Config`'s defaults), whose weights sit under
    `model.language_model.`; the vision tower's and projector's are skipped.
    `tie_word_embeddings` is the outer config's (default True)."""
    r = ConfigReader(config, {"tie_word_embeddings": True, "text_config": {}}, VL_FAMILY)
    arch = parse_lfm3(r.mapping("text_config"))
    return replace(
        arch,
        family=VL_FAMILY,
        tie_embeddings=r.flag("tie_word_embeddings"),
        weights_prefix="model.language_model.",
        skipped_weights=VL_SKIPPED,
    )
