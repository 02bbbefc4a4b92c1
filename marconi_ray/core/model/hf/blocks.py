"""Block-config builders that several `families` parsers share.

Each reads its keys through a `ConfigReader` (so a missing, null or ill-typed key is a
ValueError naming the family and the key) and mirrors what the transformers model code
does with them (5.x).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Final

from marconi_ray.core.model.hf import defaults
from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    Block,
    BlockConfig,
    HfArchitecture,
    Mamba2Config,
)
from marconi_ray.core.model.hf.reader import ConfigReader

MAMBA: Final = "linear_attention"
ATTENTION: Final = "full_attention"
NO_ROPE: Final[tuple[int, float, str]] = (0, 0.0, "default")
"""(rotary_dim, rope_theta, rope_type) of attention without positional encoding."""


def layer_types(values: Iterable[str], family: str, allowed: Collection[str]) -> list[str]:
    """Remap legacy names ("mamba", "attention") and reject types outside `allowed`."""
    out = [defaults.LEGACY_LAYER_TYPES.get(v, v) for v in values]
    for v in out:
        if v not in allowed:
            raise ValueError(
                f"{family} config has unknown layer type {v!r}; expected one of {sorted(allowed)}"
            )
    return out


def rope(r: ConfigReader, head_dim: int) -> tuple[int, float, str]:
    """(rotary_dim, rope_theta, rope_type) from `rope_parameters`; the rotary width is
    int(head_dim * partial_rotary_factor), the factor defaulting to 1. The legacy top-level
    `rope_theta` / `partial_rotary_factor` keys of config.json files written before
    transformers 5 fill what the config's `rope_parameters` lacks, and override the class
    default when the config has no `rope_parameters`, as transformers reads them."""
    legacy = {k: r.raw(k) for k in ("rope_theta", "partial_rotary_factor") if r.has(k)}
    stated = r.mapping("rope_parameters")
    params = {**legacy, **stated} if r.has("rope_parameters") else {**stated, **legacy}

    def number(name: str, default: float | None) -> float:
        value = params.get(name, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(
                f"{r.family} config key 'rope_parameters' entry {name!r} must be a number, "
                f"got {value!r}"
            )
        return float(value)

    rope_type = params.get("rope_type", "default")
    if not isinstance(rope_type, str):
        raise ValueError(
            f"{r.family} config key 'rope_parameters' entry 'rope_type' must be a string, "
            f"got {rope_type!r}"
        )
    factor = number("partial_rotary_factor", 1.0)
    return int(head_dim * factor), number("rope_theta", None), rope_type


def attention(r: ConfigReader, d: int, *, with_rope: bool, bias: bool) -> AttentionConfig:
    """Self-attention from num_attention_heads, num_key_value_heads (None: = heads) and
    head_dim (None: d // heads); RoPE from `rope_parameters` when `with_rope`."""
    heads = r.pos_int("num_attention_heads")
    kv = r.opt_int("num_key_value_heads")
    head_dim = r.opt_int("head_dim")
    head_dim = d // heads if head_dim is None else head_dim
    rotary_dim, theta, rope_type = rope(r, head_dim) if with_rope else NO_ROPE
    return AttentionConfig(
        n_heads=heads,
        n_kv_heads=heads if kv is None else kv,
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=theta,
        bias=bias,
        rope_type=rope_type,
    )


def mamba2_auto(r: ConfigReader, d_inner: int) -> Mamba2Config:
    """Mamba-2 of Bamba/FalconH1/GraniteMoeHybrid (`mamba_*` keys); mamba_d_head "auto"
    is d_inner // mamba_n_heads; dt is clamped to `time_step_limit`."""
    heads = r.pos_int("mamba_n_heads")
    head_dim = r.int_or_auto("mamba_d_head")
    dt_min, dt_max = r.float_pair("time_step_limit")
    return Mamba2Config(
        n_heads=heads,
        head_dim=d_inner // heads if head_dim is None else head_dim,
        n_groups=r.req_int("mamba_n_groups"),
        d_state=r.req_int("mamba_d_state"),
        d_conv=r.req_int("mamba_d_conv"),
        chunk_size=r.req_int("mamba_chunk_size"),
        conv_bias=r.flag("mamba_conv_bias"),
        proj_bias=r.flag("mamba_proj_bias"),
        dt_min=dt_min,
        dt_max=dt_max,
    )


def per_layer(layers: Iterable[Sequence[BlockConfig]]) -> list[Block]:
    """Blocks of HF layers in order: layer i's configs become blocks with hf_layer i."""
    return [Block(c, i) for i, configs in enumerate(layers) for c in configs]


def architecture(
    r: ConfigReader,
    blocks: Sequence[Block],
    *,
    norm_key: str = "rms_norm_eps",
    max_position: int | None = None,
    parallel_mixers: bool = False,
    unit_offset_norms: bool = False,
) -> HfArchitecture:
    """The model-wide fields (vocab_size, hidden_size, norm epsilon from `norm_key`,
    tie_word_embeddings, eos_token_id) around `blocks`; `max_position` defaults to
    max_position_embeddings."""
    return HfArchitecture(
        family=r.family,
        vocab_size=r.req_int("vocab_size"),
        hidden_size=r.req_int("hidden_size"),
        blocks=tuple(blocks),
        norm_eps=r.req_float(norm_key),
        tie_embeddings=r.flag("tie_word_embeddings"),
        max_position=r.opt_int("max_position_embeddings") if max_position is None else max_position,
        eos_token_ids=r.int_tuple("eos_token_id"),
        parallel_mixers=parallel_mixers,
        unit_offset_norms=unit_offset_norms,
    )
