"""xLSTM's config parse (`model_type` "xlstm", NX-AI/xLSTM-7b; transformers' `xLSTMConfig`).

Every block is `x = x + mlstm(norm(x))`, then `x = x + ffn(norm(x))`: an mLSTM layer
(`MLSTMConfig`) and a gated SiLU feed-forward of width
round_up(hidden_size * ffn_proj_factor, ffn_round_up_to_multiple_of), each after an
RMSNorm (epsilon `norm_eps`); no attention, so the model keeps no KV at all. The final
norm always runs (transformers builds `out_norm` whatever `add_out_norm` says) and the
logits are soft-capped, cap * tanh(logits / cap) (`output_logit_soft_cap`).

The mLSTM's widths are int(hidden_size * qk_dim_factor) and int(hidden_size *
v_dim_factor), split over `num_heads` (xLSTMLayer's own arithmetic, not the config's
rounded `qk_dim` / `head_dim` properties, which the model does not use). The depth is
`num_blocks` when given, else `num_hidden_layers` (as xLSTMConfig resolves the pair);
the width is `hidden_size`, and an `embedding_dim` that differs from it is refused (the
released 7B config writes `embedding_dim` and `num_blocks` only).

Read here and refused by name: `weight_mode` other than "single" (the fused
projections), `use_bias` true (biased projections and norms) and
`norm_reduction_force_float32` false (the engine's norms reduce in float32).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Final

from marconi_ray.core.model.hf.arch import HfArchitecture, MLPConfig
from marconi_ray.core.model.hf.blocks import architecture, per_layer
from marconi_ray.core.model.hf.mlstm_arch import MLSTMConfig
from marconi_ray.core.model.hf.reader import ConfigReader

FAMILY: Final = "xlstm"
XLSTM: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 50304,
        "hidden_size": 4096,
        "embedding_dim": None,
        "num_hidden_layers": 32,
        "num_blocks": None,
        "num_heads": 8,
        "use_bias": False,
        "norm_reduction_force_float32": True,
        "tie_word_embeddings": False,
        "norm_eps": 1e-6,
        "qk_dim_factor": 0.5,
        "v_dim_factor": 1.0,
        "chunk_size": 64,
        "eps": 1e-6,
        "ffn_proj_factor": 2.667,
        "ffn_round_up_to_multiple_of": 64,
        "gate_soft_cap": 15.0,
        "output_logit_soft_cap": 30.0,
        "weight_mode": "single",
        "eos_token_id": 2,
        "max_position_embeddings": None,
    }
)
"""transformers' `xLSTMConfig` defaults (5.x) for the keys read here; the class sets no
context limit (`max_position_embeddings` None: the serving default applies)."""


def round_up(x: float, multiple: int) -> int:
    """x rounded up to a multiple of `multiple`, as xLSTM's `round_up_to_next_multiple_of`
    computes it (float floor division, then int)."""
    return int(((x + multiple - 1) // multiple) * multiple)


def _refuse(key: str, value: object, supported: object) -> None:
    if value != supported:
        raise ValueError(
            f"{FAMILY} config key {key!r} = {value!r} is not supported (only {supported!r})"
        )


def _cap(r: ConfigReader, key: str) -> float | None:
    """A soft cap: a positive number, or None (null: not capped)."""
    if r.raw(key) is None:
        return None
    cap = r.req_float(key)
    if not cap > 0:
        raise ValueError(f"{FAMILY} config key {key!r} must be > 0 or null, got {cap!r}")
    return cap


def _head_dim(r: ConfigReader, d: int, key: str, heads: int) -> int:
    """int(d * factor) split over `heads` (they must divide it, as xLSTMLayer's reshape
    needs)."""
    width = int(d * r.req_float(key))
    if width <= 0 or width % heads:
        raise ValueError(
            f"{FAMILY} config key {key!r}: int(hidden_size * {key}) = {width} must be a "
            f"positive multiple of num_heads ({heads})"
        )
    return width // heads


def parse_xlstm(config: Mapping[str, object]) -> HfArchitecture:
    """xLSTM: see the module docstring."""
    r = ConfigReader(config, XLSTM, FAMILY)
    d = r.pos_int("hidden_size")
    embedding = r.opt_int("embedding_dim")
    if embedding is not None and embedding != d:
        raise ValueError(
            f"{FAMILY} config key 'embedding_dim' = {embedding} must equal hidden_size ({d})"
        )
    blocks = r.opt_int("num_blocks")
    n_layers = r.pos_int("num_hidden_layers") if blocks is None else r.pos_int("num_blocks")
    _refuse("weight_mode", r.req_str("weight_mode"), "single")
    _refuse("use_bias", r.flag("use_bias"), False)
    _refuse("norm_reduction_force_float32", r.flag("norm_reduction_force_float32"), True)
    heads = r.pos_int("num_heads")
    mlstm = MLSTMConfig(
        n_heads=heads,
        qk_head_dim=_head_dim(r, d, "qk_dim_factor", heads),
        v_head_dim=_head_dim(r, d, "v_dim_factor", heads),
        gate_soft_cap=_cap(r, "gate_soft_cap"),
        eps=r.req_float("eps"),
        norm_eps=r.req_float("norm_eps"),
        chunk_size=r.pos_int("chunk_size"),
    )
    ffn = round_up(d * r.req_float("ffn_proj_factor"), r.pos_int("ffn_round_up_to_multiple_of"))
    mlp = MLPConfig(ffn, "silu", gated=True)
    arch = architecture(r, per_layer([mlstm, mlp] for _ in range(n_layers)), norm_key="norm_eps")
    return replace(arch, logits_soft_cap=_cap(r, "output_logit_soft_cap"))
