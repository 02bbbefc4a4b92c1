"""HF `config.json` dict -> `HybridConfig`, one parser per supported family (a registry).

Each parser mirrors how its transformers model class (5.x) builds the model, reading keys
with `core.hf_reader.ConfigReader` so a missing or ill-typed key is a ValueError naming
the family and the key. MoE layers are not implemented by the engine: a config that uses
them is rejected with a message naming the layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from marconi_ray.core import hf_defaults
from marconi_ray.core.hf_reader import ConfigReader
from marconi_ray.engine.model_config import (
    AttentionConfig,
    HybridConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
)

_NEMOTRON_TYPES = {"linear_attention": "mamba2", "full_attention": "attention", "mlp": "mlp"}
_NEMOTRON_CHARS = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_COMMON = {
    "rms_norm_eps": 1e-6,
    "layer_norm_epsilon": 1e-5,
    "tie_word_embeddings": False,
    "eos_token_id": None,
    "attention_bias": False,
    "mlp_bias": False,
}
_NEMOTRON_EXTRA = {
    "chunk_size": 128,
    "use_conv_bias": True,
    "use_bias": False,
    "time_step_min": 0.001,
    "mlp_hidden_act": "relu2",
}
_BAMBA_EXTRA = {
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "hidden_act": "silu",
    "time_step_limit": [0.0, float("inf")],
    "rope_parameters": {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
}
_JAMBA_EXTRA = {
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "hidden_act": "silu",
}


def _reader(
    config: Mapping[str, object], family: str, *defaults: Mapping[str, object]
) -> ConfigReader:
    merged: dict[str, object] = {}
    for d in defaults:
        merged.update(d)
    aliases = hf_defaults.NEMOTRON_H_ALIASES if family == "nemotron_h" else None
    return ConfigReader(config, merged, family, aliases)


def _float(r: ConfigReader, key: str) -> float:
    value = r.raw(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"config key {key!r} must be a number, got {value!r}")
    return float(value)


def _limit_value(value: object) -> float:
    """A time-step bound; transformers writes infinity as {"__float__": "Infinity"}."""
    if isinstance(value, dict) and "__float__" in value:
        value = value["__float__"]
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"bamba time_step_limit bound {value!r} is not a number") from None


def _eos(r: ConfigReader) -> tuple[int, ...]:
    value = r.raw("eos_token_id")
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ValueError(f"config key 'eos_token_id' must be an int or list of ints, got {value!r}")
    return tuple(v for v in values if isinstance(v, int))


def _attention(r: ConfigReader, d: int, rotary_factor: float, theta: float) -> AttentionConfig:
    heads = r.req_int("num_attention_heads")
    kv = r.opt_int("num_key_value_heads") or heads
    head_dim = r.opt_int("head_dim") or d // heads
    return AttentionConfig(
        n_heads=heads,
        n_kv_heads=kv,
        head_dim=head_dim,
        rotary_dim=int(head_dim * rotary_factor),
        rope_theta=theta,
        bias=r.flag("attention_bias"),
    )


def parse_nemotron_h(config: Mapping[str, object]) -> HybridConfig:
    """NemotronH: one block per `layers_block_type` entry (or `hybrid_override_pattern`)."""
    r = _reader(config, "nemotron_h", hf_defaults.NEMOTRON_H, _COMMON, _NEMOTRON_EXTRA)
    d = r.req_int("hidden_size")
    types = r.opt_str_list("layers_block_type")
    if types is None:
        pattern = r.opt_str("hybrid_override_pattern") or ""
        bad = sorted(set(pattern) - set(_NEMOTRON_CHARS))
        if bad or not pattern:
            raise ValueError(f"nemotron_h hybrid_override_pattern {pattern!r} is not usable")
        types = [_NEMOTRON_CHARS[c] for c in pattern]
    types = [hf_defaults.LEGACY_LAYER_TYPES.get(t, t) for t in types]
    for i, t in enumerate(types):
        if t not in _NEMOTRON_TYPES:
            raise ValueError(f"nemotron_h layer {i} has type {t!r}, which the engine lacks")
    blocks = tuple(_NEMOTRON_TYPES[t] for t in types)
    return HybridConfig(
        family="nemotron_h",
        vocab_size=r.req_int("vocab_size"),
        hidden_size=d,
        blocks=blocks,
        hf_layer=tuple(range(len(blocks))),
        norm_eps=_float(r, "layer_norm_epsilon"),
        attention=_attention(r, d, 0.0, 0.0),
        mlp=MLPConfig(
            r.req_int("intermediate_size"),
            r.opt_str("mlp_hidden_act") or "relu2",
            False,
            r.flag("mlp_bias"),
        ),
        mamba2=Mamba2Config(
            n_heads=r.req_int("mamba_num_heads"),
            head_dim=r.req_int("mamba_head_dim"),
            n_groups=r.req_int("n_groups"),
            d_state=r.req_int("ssm_state_size"),
            d_conv=r.req_int("conv_kernel"),
            chunk_size=r.req_int("chunk_size"),
            conv_bias=r.flag("use_conv_bias"),
            proj_bias=r.flag("use_bias"),
            dt_min=_float(r, "time_step_min"),
        ),
        mamba1=None,
        tie_embeddings=r.flag("tie_word_embeddings"),
        max_position=r.opt_int("max_position_embeddings") or 4096,
        eos_token_ids=_eos(r),
    )


def _paired_blocks(mixers: list[str]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Each HF layer -> (mixer block, mlp block), both reading that layer's weights."""
    blocks: list[str] = []
    owners: list[int] = []
    for i, mixer in enumerate(mixers):
        blocks += [mixer, "mlp"]
        owners += [i, i]
    return tuple(blocks), tuple(owners)


def parse_bamba(config: Mapping[str, object]) -> HybridConfig:
    """Bamba: attention at `attn_layer_indices`, Mamba-2 elsewhere; each + a gated MLP."""
    r = _reader(config, "bamba", hf_defaults.BAMBA, _COMMON, _BAMBA_EXTRA)
    d = r.req_int("hidden_size")
    n = r.req_int("num_hidden_layers")
    attn = set(r.opt_int_list("attn_layer_indices") or ())
    rope = r.raw("rope_parameters")
    if not isinstance(rope, Mapping):
        raise ValueError(f"bamba config key 'rope_parameters' must be a mapping, got {rope!r}")
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"bamba rope_type {rope.get('rope_type')!r} is not supported")
    limit = r.raw("time_step_limit")
    if not isinstance(limit, (list, tuple)) or len(limit) != 2:
        raise ValueError(f"bamba config key 'time_step_limit' must be a pair, got {limit!r}")
    heads = r.req_int("mamba_n_heads")
    d_inner = r.req_int("mamba_expand") * d
    head_dim = r.int_or_auto("mamba_d_head") or d_inner // heads
    blocks, owners = _paired_blocks(["attention" if i in attn else "mamba2" for i in range(n)])
    return HybridConfig(
        family="bamba",
        vocab_size=r.req_int("vocab_size"),
        hidden_size=d,
        blocks=blocks,
        hf_layer=owners,
        norm_eps=_float(r, "rms_norm_eps"),
        attention=_attention(
            r, d, float(rope.get("partial_rotary_factor", 1.0)), float(rope["rope_theta"])
        ),
        mlp=MLPConfig(
            r.req_int("intermediate_size"),
            r.opt_str("hidden_act") or "silu",
            True,
            r.flag("mlp_bias"),
        ),
        mamba2=Mamba2Config(
            n_heads=heads,
            head_dim=head_dim,
            n_groups=r.req_int("mamba_n_groups"),
            d_state=r.req_int("mamba_d_state"),
            d_conv=r.req_int("mamba_d_conv"),
            chunk_size=r.req_int("mamba_chunk_size"),
            conv_bias=r.flag("mamba_conv_bias"),
            proj_bias=r.flag("mamba_proj_bias"),
            dt_min=_limit_value(limit[0]),
            dt_max=_limit_value(limit[1]),
        ),
        mamba1=None,
        tie_embeddings=r.flag("tie_word_embeddings"),
        max_position=r.opt_int("max_position_embeddings") or 4096,
        eos_token_ids=_eos(r),
    )


def parse_jamba(config: Mapping[str, object]) -> HybridConfig:
    """Jamba with dense MLPs (num_experts == 1): attention every `attn_layer_period`
    layers at `attn_layer_offset`, Mamba-1 elsewhere; each + a gated MLP. No RoPE."""
    r = _reader(config, "jamba", hf_defaults.JAMBA, _COMMON, _JAMBA_EXTRA)
    if r.req_int("num_experts") != 1:
        raise ValueError(
            f"jamba num_experts={r.req_int('num_experts')}: the engine implements dense "
            "MLPs only (num_experts must be 1)"
        )
    d = r.req_int("hidden_size")
    n = r.req_int("num_hidden_layers")
    period, offset = r.req_int("attn_layer_period"), r.req_int("attn_layer_offset")
    mixers = ["attention" if i % period == offset else "mamba1" for i in range(n)]
    blocks, owners = _paired_blocks(mixers)
    d_inner = r.req_int("mamba_expand") * d
    dt_rank = r.int_or_auto("mamba_dt_rank") or -(-d // 16)
    return HybridConfig(
        family="jamba",
        vocab_size=r.req_int("vocab_size"),
        hidden_size=d,
        blocks=blocks,
        hf_layer=owners,
        norm_eps=_float(r, "rms_norm_eps"),
        attention=_attention(r, d, 0.0, 0.0),
        mlp=MLPConfig(
            r.req_int("intermediate_size"), r.opt_str("hidden_act") or "silu", True, False
        ),
        mamba2=None,
        mamba1=Mamba1Config(
            d_inner=d_inner,
            d_state=r.req_int("mamba_d_state"),
            d_conv=r.req_int("mamba_d_conv"),
            dt_rank=dt_rank,
            conv_bias=r.flag("mamba_conv_bias"),
            proj_bias=r.flag("mamba_proj_bias"),
        ),
        tie_embeddings=r.flag("tie_word_embeddings"),
        max_position=r.opt_int("max_position_embeddings") or 4096,
        eos_token_ids=_eos(r),
    )


FAMILIES: Mapping[str, Callable[[Mapping[str, object]], HybridConfig]] = MappingProxyType(
    {"nemotron_h": parse_nemotron_h, "bamba": parse_bamba, "jamba": parse_jamba}
)


def hybrid_config(config: Mapping[str, object]) -> HybridConfig:
    """Parse a HF config dict; an unknown `model_type` is a ValueError listing the known."""
    model_type = config.get("model_type")
    parser = FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if parser is None:
        raise ValueError(
            f"unsupported model_type {model_type!r}; the engine supports {sorted(FAMILIES)}"
        )
    return parser(config)
