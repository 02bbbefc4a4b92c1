"""MiniMax's config parse (MiniMax-Text-01, MiniMax-M1: transformers' `MiniMaxConfig`).

Every layer is a mixer, lightning attention (`linear_attention`) or GQA softmax attention
(`full_attention`, RoPE over the whole head), then a mixture of SwiGLU experts
(`block_sparse_moe`: softmax router over `num_local_experts`, top `num_experts_per_tok`,
the chosen weights renormalised, as Mixtral's). The layer kinds come from `layer_types`,
else from the original checkpoints' `attn_type_list` (1: softmax attention, 0:
lightning), else the config class's default (even layers full attention).

The residual stream is post-norm (`HfArchitecture.norm_residual`): `MiniMaxDecoderLayer`
takes its residual after the norm, `x = alpha * norm(x) + beta * op(norm(x))`, with
(alpha, beta) the `full_attn_*`, `linear_attn_*` or `mlp_*` `_alpha_factor` /
`_beta_factor` of the block (the original configs' `layernorm_*_alpha` / `_beta`), kept
on each `Block`.

As transformers' MiniMax model does, RoPE rotates the whole head whatever a
`partial_rotary_factor` (or the original `rotary_dim`) says, and a `sliding_window`
(which transformers would apply to the softmax layers) is a ValueError: the engine's
attention has no window. The lightning layers' decay buffers that transformers saves
(`slope_rate`, `query_decay`, `key_decay`, `diagonal_decay`) are derived from the config
again, so the loader skips them (`skipped_weights`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Final

from marconi_ray.core.model.hf import defaults
from marconi_ray.core.model.hf.arch import Block, BlockConfig, HfArchitecture, MoEConfig
from marconi_ray.core.model.hf.blocks import ATTENTION, architecture, attention, layer_types
from marconi_ray.core.model.hf.lightning import LightningConfig
from marconi_ray.core.model.hf.reader import ConfigReader

FAMILY: Final = "minimax"
LIGHTNING: Final = "linear_attention"
"""`layer_types` entry of a lightning-attention layer."""
DECAY_BUFFERS: Final = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")
"""Buffers of `MiniMaxLightningAttention` that checkpoints carry and the engine derives."""


def _layer_types(r: ConfigReader, n_layers: int) -> list[str]:
    """One of "linear_attention" / "full_attention" per layer (see the module docstring)."""
    raw = r.opt_str_list("layer_types")
    if raw is None:
        flags = r.opt_int_list("attn_type_list")
        if flags is None:
            raw = [ATTENTION if i % 2 == 0 else LIGHTNING for i in range(n_layers)]
        else:
            bad = sorted({f for f in flags if f not in (0, 1)})
            if bad:
                raise ValueError(
                    f"{FAMILY} config key 'attn_type_list' must hold 0 (lightning) or 1 "
                    f"(softmax attention), got {bad}"
                )
            raw = [ATTENTION if f else LIGHTNING for f in flags]
    types = layer_types(raw, FAMILY, (LIGHTNING, ATTENTION))
    if len(types) != n_layers:
        raise ValueError(
            f"{FAMILY} config has {len(types)} layer types for num_hidden_layers={n_layers}"
        )
    return types


def _factor(r: ConfigReader, key: str) -> float:
    """A finite residual factor; ValueError naming `key` otherwise."""
    value = r.req_float(key)
    if not math.isfinite(value):
        raise ValueError(f"{FAMILY} config key {key!r} must be a finite number, got {value!r}")
    return value


def parse_minimax(config: Mapping[str, object]) -> HfArchitecture:
    """MiniMax: [lightning or softmax attention, MoE] per layer, post-norm residuals with
    the per-kind alpha / beta factors (see the module docstring)."""
    r = ConfigReader(config, defaults.MINIMAX, FAMILY, defaults.MINIMAX_ALIASES)
    d = r.req_int("hidden_size")
    n_layers = r.pos_int("num_hidden_layers")
    types = _layer_types(r, n_layers)
    window = r.raw("sliding_window")
    if window is not None and ATTENTION in types:
        raise ValueError(
            f"{FAMILY} config key 'sliding_window' must be null (the engine's attention has "
            f"no window), got {window!r}"
        )
    act = r.req_str("hidden_act")
    base = attention(r, d, with_rope=True, bias=False)
    attn = replace(base, rotary_dim=base.head_dim)
    lightning = LightningConfig(base.n_heads, base.head_dim, n_layers, activation=act)
    moe = MoEConfig(
        r.pos_int("intermediate_size"),
        r.pos_int("num_local_experts"),
        r.pos_int("num_experts_per_tok"),
        act,
        gated=True,
        norm_topk=True,
        scoring="softmax",
    )
    mlp_alpha, mlp_beta = _factor(r, "mlp_alpha_factor"), _factor(r, "mlp_beta_factor")
    blocks: list[Block] = []
    for i, t in enumerate(types):
        mixer: BlockConfig = lightning if t == LIGHTNING else attn
        key = "linear_attn" if t == LIGHTNING else "full_attn"
        alpha, beta = _factor(r, f"{key}_alpha_factor"), _factor(r, f"{key}_beta_factor")
        blocks.append(Block(mixer, i, residual_alpha=alpha, residual_beta=beta))
        blocks.append(Block(moe, i, residual_alpha=mlp_alpha, residual_beta=mlp_beta))
    skipped = tuple(
        f"model.layers.{i}.self_attn.{name}"
        for i, t in enumerate(types)
        if t == LIGHTNING
        for name in DECAY_BUFFERS
    )
    return replace(architecture(r, blocks), norm_residual=True, skipped_weights=skipped)
