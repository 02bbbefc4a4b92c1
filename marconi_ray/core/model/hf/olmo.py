"""OLMo Hybrid (`olmo_hybrid`): Gated DeltaNet layers with OLMo's own layout and
attention layers with post-norms.

- A `linear_attention` layer is pre-norm: Gated DeltaNet on `input_layernorm(x)`, then a
  gated SiLU MLP on `post_attention_layernorm(x)`. Its Gated DeltaNet has separate
  q/k/v/a/b projections and an output gate `g_proj`, its write strength is
  2 * sigmoid(b) with `linear_allow_neg_eigval` (eigenvalues in [-1, 1]), and its gated
  output norm a fixed epsilon of 1e-5 (FLA's `FusedRMSNormGated`).
- A `full_attention` layer is post-norm (Olmo 2/3): `x = x + post_attention_layernorm(
  attention(x))`, then `x = x + post_feedforward_layernorm(mlp(x))`. Its q and k norms
  span the whole projection (all heads together), and RoPE is on unless the config's
  `rope_parameters` gives `rope_theta` as null (NoPE, as transformers reads it; a null
  `rope_parameters` itself becomes transformers' default RoPE, theta 10000).

The defaults are transformers' `OlmoHybridConfig` (5.x); its `__post_init__` derivations
of the linear heads and widths are done here the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    Block,
    GatedDeltaNetConfig,
    HfArchitecture,
    MLPConfig,
)
from marconi_ray.core.model.hf.blocks import NO_ROPE, architecture, rope
from marconi_ray.core.model.hf.reader import ConfigReader

OLMO_HYBRID: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 100352,
        "hidden_size": 3840,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 30,
        "num_key_value_heads": None,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-6,
        "eos_token_id": 100257,
        "tie_word_embeddings": False,
        "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},  # see _attention
        "attention_bias": False,
        "layer_types": None,
        "linear_num_key_heads": None,
        "linear_num_value_heads": None,
        "linear_key_head_dim": None,
        "linear_value_head_dim": None,
        "linear_conv_kernel_dim": 4,
        "linear_allow_neg_eigval": True,
    }
)
"""transformers' `OlmoHybridConfig` defaults for the keys read here."""
LINEAR, FULL = "linear_attention", "full_attention"
DEFAULT_ROPE_THETA: Final = 10000.0
"""The RoPE base transformers gives a config whose `rope_parameters` is null."""
GATED_NORM_EPS: Final = 1e-5
"""The gated output norm's epsilon (fixed in transformers' OLMo Hybrid)."""


def _layer_types(r: ConfigReader, n_layers: int) -> list[str]:
    """`layer_types`, or transformers' default: full attention every 4th layer (and the
    last one when that leaves none); ValueError naming a bad list."""
    types = r.opt_str_list("layer_types")
    if types is None:
        types = [FULL if i % 4 == 3 else LINEAR for i in range(n_layers)]
        if FULL not in types:
            types[-1] = FULL
    bad = sorted(set(types) - {LINEAR, FULL})
    if bad or len(types) != n_layers:
        raise ValueError(
            f"olmo_hybrid layer_types must give {n_layers} of {[LINEAR, FULL]}, got {types!r}"
        )
    return types


def _attention(r: ConfigReader, d: int) -> AttentionConfig:
    heads = r.pos_int("num_attention_heads")
    kv = r.opt_int("num_key_value_heads")
    head_dim = d // heads
    if r.raw("rope_parameters") is None:  # transformers standardises null to its default
        rotary_dim, theta, rope_type = head_dim, DEFAULT_ROPE_THETA, "default"
    else:
        params = r.mapping("rope_parameters")
        no_rope = "rope_theta" in params and params["rope_theta"] is None
        rotary_dim, theta, rope_type = NO_ROPE if no_rope else rope(r, head_dim)
    return AttentionConfig(
        n_heads=heads,
        n_kv_heads=heads if kv is None else kv,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        bias=r.flag("attention_bias"),
        rope_type=rope_type,
        qk_norm=True,
        qk_norm_whole=True,
    )


def _gated_deltanet(r: ConfigReader, d: int) -> GatedDeltaNetConfig:
    heads = r.pos_int("num_attention_heads")
    k_heads = r.opt_int("linear_num_key_heads") or heads
    v_heads = r.opt_int("linear_num_value_heads") or heads
    k_dim = r.opt_int("linear_key_head_dim") or int(0.75 * d / k_heads)
    v_dim = r.opt_int("linear_value_head_dim") or 2 * k_dim
    return GatedDeltaNetConfig(
        n_k_heads=k_heads,
        n_v_heads=v_heads,
        head_k_dim=k_dim,
        head_v_dim=v_dim,
        d_conv=r.pos_int("linear_conv_kernel_dim"),
        separate_projections=True,
        beta_scale=2.0 if r.flag("linear_allow_neg_eigval") else 1.0,
        norm_eps=GATED_NORM_EPS,
    )


def parse_olmo_hybrid(config: Mapping[str, object]) -> HfArchitecture:
    """OLMo Hybrid: see the module docstring. ValueError naming a bad key."""
    r = ConfigReader(config, OLMO_HYBRID, "olmo_hybrid")
    d = r.req_int("hidden_size")
    types = _layer_types(r, r.pos_int("num_hidden_layers"))
    act = r.req_str("hidden_act")
    mlp = MLPConfig(r.req_int("intermediate_size"), act, gated=True)
    gdn = _gated_deltanet(r, d) if LINEAR in types else None
    attn = _attention(r, d) if FULL in types else None
    blocks: list[Block] = []
    for i, kind in enumerate(types):
        if kind == LINEAR:
            assert gdn is not None
            blocks += [Block(gdn, i), Block(mlp, i)]
        else:
            assert attn is not None
            blocks += [Block(attn, i, post_norm=True), Block(mlp, i, post_norm=True)]
    return architecture(r, blocks)
