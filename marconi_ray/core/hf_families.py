"""One parser per hybrid model family: HF config dict -> `ModelSpec` (layers in model order).

Each parser mirrors how its transformers model class builds its layers (transformers 5.x),
reading keys through `ConfigReader` with the class's defaults (`hf_defaults`). Every
parser has the signature `(config, dtype_bytes, name) -> ModelSpec`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping

from marconi_ray.core import hf_defaults as defaults
from marconi_ray.core.hf_reader import ConfigReader
from marconi_ray.core.layers import (
    AttentionLayer,
    LayerSpec,
    LinearLayer,
    Mamba1Layer,
    Mamba2Layer,
    MLPLayer,
    MoELayer,
)
from marconi_ray.core.model_spec import ModelSpec

_MAMBA = "linear_attention"
_ATTENTION = "full_attention"
_NEMOTRON_PATTERN = {"M": _MAMBA, "*": _ATTENTION, "-": "mlp", "E": "moe"}


def _layer_types(values: Iterable[str], family: str, allowed: Collection[str]) -> list[str]:
    """Remap legacy names ("mamba", "attention") and reject types outside `allowed`."""
    out = [defaults.LEGACY_LAYER_TYPES.get(v, v) for v in values]
    for v in out:
        if v not in allowed:
            raise ValueError(
                f"{family} config has unknown layer type {v!r}; expected one of {sorted(allowed)}"
            )
    return out


def _attention(r: ConfigReader, d: int) -> AttentionLayer:
    """Self-attention reading num_attention_heads, num_key_value_heads and head_dim."""
    heads = r.req_int("num_attention_heads")
    kv = r.opt_int("num_key_value_heads")
    head_dim = r.opt_int("head_dim")
    return AttentionLayer(
        d, heads, heads if kv is None else kv, d // heads if head_dim is None else head_dim
    )


def _spec(
    r: ConfigReader, name: str, layers: list[LayerSpec], dtype_bytes: int, max_position: int | None
) -> ModelSpec:
    return ModelSpec(
        name,
        tuple(layers),
        dtype_bytes=dtype_bytes,
        vocab_size=r.req_int("vocab_size"),
        max_position=max_position,
    )


def parse_nemotron_h(config: Mapping[str, object], dtype_bytes: int, name: str) -> ModelSpec:
    """NemotronH: one block per entry of layers_block_type / hybrid_override_pattern.

    `M` Mamba-2, `*` attention, `-` plain relu2 MLP, `E` MoE of plain experts (with one
    shared expert, and optional latent projections).
    """
    r = ConfigReader(config, defaults.NEMOTRON_H, "nemotron_h", defaults.NEMOTRON_H_ALIASES)
    d = r.req_int("hidden_size")
    types = r.opt_str_list("layers_block_type")
    if types is None:
        pattern = r.opt_str("hybrid_override_pattern")
        if pattern is None:
            types = list(defaults.NEMOTRON_H_DEFAULT_LAYERS)
        else:
            bad = sorted(set(pattern) - set(_NEMOTRON_PATTERN))
            if bad:
                raise ValueError(
                    f"nemotron_h hybrid_override_pattern has unknown characters "
                    f"{bad}; expected {sorted(_NEMOTRON_PATTERN)}"
                )
            types = [_NEMOTRON_PATTERN[c] for c in pattern]
    types = _layer_types(types, "nemotron_h", set(_NEMOTRON_PATTERN.values()))
    built: dict[str, LayerSpec] = {}
    for t in dict.fromkeys(types):
        if t == _MAMBA:
            built[t] = Mamba2Layer(
                d,
                r.req_int("mamba_num_heads"),
                r.req_int("mamba_head_dim"),
                r.req_int("n_groups"),
                r.req_int("ssm_state_size"),
                r.req_int("conv_kernel"),
            )
        elif t == _ATTENTION:
            built[t] = _attention(r, d)
        elif t == "mlp":
            built[t] = MLPLayer(d, r.req_int("intermediate_size"), gated=False)
        else:
            built[t] = MoELayer(
                d,
                r.req_int("moe_intermediate_size"),
                r.req_int("n_routed_experts"),
                r.req_int("num_experts_per_tok"),
                gated=False,
                n_shared_experts=1,
                shared_d_ff=r.req_int("moe_shared_expert_intermediate_size"),
                latent_dim=r.opt_int("moe_latent_size"),
            )
    return _spec(
        r, name, [built[t] for t in types], dtype_bytes, r.opt_int("max_position_embeddings")
    )


def _mamba2_auto(r: ConfigReader, d: int, d_inner: int) -> Mamba2Layer:
    """Mamba-2 of Bamba/FalconH1/GraniteMoeHybrid; mamba_d_head "auto" = d_inner // heads."""
    heads = r.req_int("mamba_n_heads")
    head_dim = r.int_or_auto("mamba_d_head")
    return Mamba2Layer(
        d,
        heads,
        d_inner // heads if head_dim is None else head_dim,
        r.req_int("mamba_n_groups"),
        r.req_int("mamba_d_state"),
        r.req_int("mamba_d_conv"),
    )


def parse_bamba(config: Mapping[str, object], dtype_bytes: int, name: str) -> ModelSpec:
    """Bamba: each layer is attention (index in attn_layer_indices) or Mamba-2, + gated MLP."""
    r = ConfigReader(config, defaults.BAMBA, "bamba")
    d = r.req_int("hidden_size")
    n_layers = r.req_int("num_hidden_layers")
    attn_idx = set(r.opt_int_list("attn_layer_indices") or ())
    attention = _attention(r, d) if attn_idx & set(range(n_layers)) else None
    mamba = _mamba2_auto(r, d, r.req_int("mamba_expand") * d)
    mlp = MLPLayer(d, r.req_int("intermediate_size"), gated=True)
    layers: list[LayerSpec] = []
    for i in range(n_layers):
        layers += [attention if attention is not None and i in attn_idx else mamba, mlp]
    return _spec(r, name, layers, dtype_bytes, r.opt_int("max_position_embeddings"))


def parse_jamba(config: Mapping[str, object], dtype_bytes: int, name: str) -> ModelSpec:
    """Jamba: attention every attn_layer_period layers (at the offset), else Mamba-1; the
    feed-forward is a gated MoE every expert_layer_period layers (when num_experts > 1),
    else a gated MLP."""
    r = ConfigReader(config, defaults.JAMBA, "jamba", defaults.JAMBA_ALIASES)
    d = r.req_int("hidden_size")
    n_layers = r.req_int("num_hidden_layers")
    periods = {}
    for kind in ("attn", "expert"):
        period, offset = r.req_int(f"{kind}_layer_period"), r.req_int(f"{kind}_layer_offset")
        if period <= 0 or not 0 <= offset < period:
            raise ValueError(
                f"jamba {kind}_layer_offset={offset} must be in [0, {kind}_layer_period={period})"
            )
        periods[kind] = (period, offset)
    dt_rank = r.int_or_auto("mamba_dt_rank")
    mamba = Mamba1Layer(
        d,
        r.req_int("mamba_expand") * d,
        r.req_int("mamba_d_state"),
        r.req_int("mamba_d_conv"),
        math.ceil(d / 16) if dt_rank is None else dt_rank,
    )
    ff = r.req_int("intermediate_size")
    mlp = MLPLayer(d, ff, gated=True)
    n_experts = r.req_int("num_experts")
    moe = (
        MoELayer(d, ff, n_experts, r.req_int("num_experts_per_tok"), gated=True)
        if n_experts > 1
        else mlp
    )
    ap, ao = periods["attn"]
    ep, eo = periods["expert"]
    attention = _attention(r, d) if any(i % ap == ao for i in range(n_layers)) else None
    layers: list[LayerSpec] = []
    for i in range(n_layers):
        mixer = attention if attention is not None and i % ap == ao else mamba
        layers += [mixer, moe if i % ep == eo else mlp]
    return _spec(r, name, layers, dtype_bytes, r.opt_int("max_position_embeddings"))


def parse_zamba2(config: Mapping[str, object], dtype_bytes: int, name: str) -> ModelSpec:
    """Zamba2: every layer is a Mamba-2; a "hybrid" layer first runs the shared block.

    The shared block: attention over the 2*D concatenation of hidden state and embeddings
    (head_dim = 2*D // heads), a gated MLP with a LoRA adapter on its gate/up projection,
    optional LoRA adapters on q/k/v, and a D x D linear. Each hybrid layer has its own KV.
    """
    r = ConfigReader(config, defaults.ZAMBA2, "zamba2", defaults.ZAMBA2_ALIASES)
    d = r.req_int("hidden_size")
    raw_types = r.opt_str_list("layers_block_type")
    types = _layer_types(
        defaults.ZAMBA2_DEFAULT_LAYERS if raw_types is None else raw_types,
        "zamba2",
        (_MAMBA, "hybrid"),
    )
    heads = r.req_int("n_mamba_heads")
    mamba = Mamba2Layer(
        d,
        heads,
        r.req_int("mamba_expand") * d // heads,
        r.req_int("mamba_ngroups"),
        r.req_int("mamba_d_state"),
        r.req_int("mamba_d_conv"),
    )
    shared: list[LayerSpec] = []
    if "hybrid" in types:
        attn_heads = r.req_int("num_attention_heads")
        kv = r.opt_int("num_key_value_heads")
        width = 2 * d
        shared.append(
            AttentionLayer(
                d,
                attn_heads,
                attn_heads if kv is None else kv,
                width // attn_heads,
                input_dim=width,
            )
        )
        rank = r.req_int("adapter_rank")
        if r.flag("use_shared_attention_adapter"):
            shared += [LinearLayer(width, rank), LinearLayer(rank, width)] * 3
        ff = r.opt_int("intermediate_size") or 4 * d
        shared += [
            MLPLayer(d, ff, gated=True),
            LinearLayer(d, rank),
            LinearLayer(rank, 2 * ff),
            LinearLayer(d, d),
        ]
    layers: list[LayerSpec] = []
    for t in types:
        layers += [*shared, mamba] if t == "hybrid" else [mamba]
    max_position = (
        defaults.ZAMBA2_LONG_CONTEXT_POSITIONS
        if r.flag("use_long_context")
        else r.opt_int("max_position_embeddings")
    )
    return _spec(r, name, layers, dtype_bytes, max_position)


def parse_falcon_h1(config: Mapping[str, object], dtype_bytes: int, name: str) -> ModelSpec:
    """FalconH1: every layer runs attention and Mamba-2 in parallel, then a gated MLP."""
    r = ConfigReader(config, defaults.FALCON_H1, "falcon_h1")
    d = r.req_int("hidden_size")
    d_ssm = r.opt_int("mamba_d_ssm")
    mamba = _mamba2_auto(r, d, r.req_int("mamba_expand") * d if d_ssm is None else d_ssm)
    block = [_attention(r, d), mamba, MLPLayer(d, r.req_int("intermediate_size"), gated=True)]
    return _spec(
        r,
        name,
        block * r.req_int("num_hidden_layers"),
        dtype_bytes,
        r.opt_int("max_position_embeddings"),
    )


def parse_granitemoehybrid(config: Mapping[str, object], dtype_bytes: int, name: str) -> ModelSpec:
    """GraniteMoeHybrid: Mamba-2 or attention per layer_types, then a gated MoE plus a gated
    shared MLP (only the shared MLP when num_local_experts is 0)."""
    r = ConfigReader(
        config, defaults.GRANITE_MOE_HYBRID, "granitemoehybrid", defaults.GRANITE_MOE_HYBRID_ALIASES
    )
    d = r.req_int("hidden_size")
    raw_types = r.opt_str_list("layer_types")
    if raw_types is None:
        raw_types = [_MAMBA] * r.req_int("num_hidden_layers")
    types = _layer_types(raw_types, "granitemoehybrid", (_MAMBA, _ATTENTION))
    mamba = _mamba2_auto(r, d, r.req_int("mamba_expand") * d) if _MAMBA in types else None
    attention = _attention(r, d) if _ATTENTION in types else None
    shared_ff = r.req_int("shared_intermediate_size")
    n_experts = r.req_int("num_local_experts")
    ffn: LayerSpec = (
        MoELayer(
            d,
            r.req_int("intermediate_size"),
            n_experts,
            r.req_int("num_experts_per_tok"),
            gated=True,
            n_shared_experts=1,
            shared_d_ff=shared_ff,
        )
        if n_experts > 0
        else MLPLayer(d, shared_ff, gated=True)
    )
    layers: list[LayerSpec] = []
    for t in types:
        mixer = mamba if t == _MAMBA else attention
        assert mixer is not None
        layers += [mixer, ffn]
    return _spec(r, name, layers, dtype_bytes, r.opt_int("max_position_embeddings"))
