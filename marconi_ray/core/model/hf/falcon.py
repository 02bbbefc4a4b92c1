"""FalconH1's config parse: parallel attention + Mamba-2 layers and their muP multipliers.

Every FalconH1 layer runs attention (RoPE) and Mamba-2 side by side on the same normed
input, sums their outputs into the residual stream, then runs a gated MLP
(`HfArchitecture.parallel_mixers`). The multipliers of its muP training become fields of
the block configs; the cost model ignores them. How the engine applies each:

| config key                   | field                          | engine                   |
|------------------------------|--------------------------------|--------------------------|
| embedding_multiplier         | `Scales.embedding`             | forward (table may be    |
| lm_head_multiplier           | `Scales.logits`                | tied: cannot absorb it)  |
| key_multiplier               | `AttentionConfig.scale` (times | the softmax scale, free  |
|                              | head_dim**-0.5)                |                          |
| attention_in_multiplier      | `AttentionConfig.input_scale`  | folded: q/k/v weights    |
| attention_out_multiplier     | `AttentionConfig.output_scale` | folded: o weight, bias   |
| ssm_in_multiplier            | `Mamba2Config.input_scale`     | folded: in_proj weight   |
| ssm_multipliers (z,x,B,C,dt) | `Mamba2Config.in_proj_scales`  | folded: in_proj rows     |
| ssm_out_multiplier           | `Mamba2Config.output_scale`    | folded: out_proj         |
| mlp_multipliers (gate, down) | `MLPConfig.gate/down_scale`    | folded: gate, down       |
| mamba_rms_norm               | `Mamba2Config.gated_norm`      | gated norm or gate only  |
| mamba_norm_before_gate       | `Mamba2Config.norm_before_gate`| norm, then gate          |
| hidden_act                   | MLP and Mamba-2 conv activation| conv: only "silu" runs   |

Folding scales the whole checkpoint tensor before it is split across ranks, so every
rank holds its slice of the folded tensor; the result equals transformers' up to float
rounding (see `engine.model.layers.linear.ParallelLinear`).

A multiplier that is null, not a number or not finite, a `key_multiplier`,
`embedding_multiplier` or `lm_head_multiplier` that is not > 0, a multiplier list of the
wrong length, and `projectors_bias` (out_proj's bias) differing from `mamba_proj_bias`
(in_proj's; the configs give both one flag) are ValueErrors naming the key. Released
checkpoints write RoPE as the legacy top-level `rope_theta` (and `rope_scaling`), which
transformers moves into `rope_parameters`; so does this parse when the dict has none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from marconi_ray.core.model.hf import defaults
from marconi_ray.core.model.hf.arch import (
    MAMBA2_IN_PROJ_SEGMENTS,
    BlockConfig,
    HfArchitecture,
    MLPConfig,
    Scales,
)
from marconi_ray.core.model.hf.blocks import architecture, attention, mamba2_auto, per_layer
from marconi_ray.core.model.hf.reader import ConfigReader

FAMILY = "falcon_h1"


def _with_rope_parameters(config: Mapping[str, object]) -> Mapping[str, object]:
    """`config` with a legacy top-level `rope_theta` / `rope_scaling` moved into
    `rope_parameters` (as transformers does) when it has no `rope_parameters`."""
    legacy = config.get("rope_scaling")
    if "rope_parameters" in config or ("rope_theta" not in config and legacy is None):
        return config
    if legacy is not None and not isinstance(legacy, Mapping):
        raise ValueError(f"{FAMILY} config key 'rope_scaling' must be a mapping, got {legacy!r}")
    params: dict[str, object] = dict(legacy or {})
    if "type" in params:
        params.setdefault("rope_type", params.pop("type"))
    params.setdefault("rope_type", "default")
    if "rope_theta" in config:
        params["rope_theta"] = config["rope_theta"]
    else:
        default = defaults.FALCON_H1["rope_parameters"]
        assert isinstance(default, Mapping)
        params.setdefault("rope_theta", default["rope_theta"])
    return {**config, "rope_parameters": params}


def _multiplier(r: ConfigReader, key: str, *, positive: bool = False) -> float:
    """A finite number (> 0 when `positive`); ValueError naming `key` otherwise."""
    value = r.req_float(key)
    if not math.isfinite(value) or (positive and not value > 0):
        want = "a finite number > 0" if positive else "a finite number"
        raise ValueError(f"{FAMILY} config key {key!r} must be {want}, got {value!r}")
    return value


def _multipliers(r: ConfigReader, key: str, n: int) -> tuple[float, ...]:
    """A list of `n` finite numbers; null means all 1 (the config class's default)."""
    value = r.raw(key)
    if value is None:
        return (1.0,) * n
    ok = isinstance(value, (list, tuple)) and len(value) == n
    if ok:
        assert isinstance(value, (list, tuple))
        ok = all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            for v in value
        )
    if not ok:
        raise ValueError(
            f"{FAMILY} config key {key!r} must be a list of {n} finite numbers, got {value!r}"
        )
    assert isinstance(value, (list, tuple))
    return tuple(float(v) for v in value)


def parse_falcon_h1(config: Mapping[str, object]) -> HfArchitecture:
    """FalconH1: every layer is [attention, Mamba-2] in parallel, then a gated MLP, with
    the muP multipliers of the module docstring."""
    r = ConfigReader(_with_rope_parameters(config), defaults.FALCON_H1, FAMILY)
    d = r.req_int("hidden_size")
    proj_bias = r.flag("mamba_proj_bias")
    if r.flag("projectors_bias") != proj_bias:
        raise ValueError(
            f"{FAMILY} config key 'projectors_bias' must equal mamba_proj_bias={proj_bias}: "
            "an out_proj bias apart from in_proj's is not supported"
        )
    act = r.req_str("hidden_act")
    d_ssm = r.opt_int("mamba_d_ssm")
    mamba = replace(
        mamba2_auto(r, r.req_int("mamba_expand") * d if d_ssm is None else d_ssm),
        gated_norm=r.flag("mamba_rms_norm"),
        norm_before_gate=r.flag("mamba_norm_before_gate"),
        conv_activation=act,
        input_scale=_multiplier(r, "ssm_in_multiplier"),
        in_proj_scales=_multipliers(r, "ssm_multipliers", MAMBA2_IN_PROJ_SEGMENTS),
        output_scale=_multiplier(r, "ssm_out_multiplier"),
    )
    base = attention(r, d, with_rope=True, bias=r.flag("attention_bias"))
    attn = replace(
        base,
        scale=_multiplier(r, "key_multiplier", positive=True) / math.sqrt(base.head_dim),
        input_scale=_multiplier(r, "attention_in_multiplier"),
        output_scale=_multiplier(r, "attention_out_multiplier"),
    )
    gate_scale, down_scale = _multipliers(r, "mlp_multipliers", 2)
    mlp = MLPConfig(
        r.req_int("intermediate_size"),
        act,
        True,
        r.flag("mlp_bias"),
        gate_scale=gate_scale,
        down_scale=down_scale,
    )
    layer: list[BlockConfig] = [attn, mamba, mlp]
    arch = architecture(
        r, per_layer([layer] * r.req_int("num_hidden_layers")), parallel_mixers=True
    )
    scales = Scales(
        embedding=_multiplier(r, "embedding_multiplier", positive=True),
        logits=_multiplier(r, "lm_head_multiplier", positive=True),
    )
    return replace(arch, scales=scales)
