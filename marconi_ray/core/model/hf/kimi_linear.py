"""Kimi Linear's config parser: KDA and MLA layers, a dense MLP or a mixture of experts.

Mirrors `KimiLinearConfig.__post_init__` and `KimiLinearModel` (transformers 5.x): each
decoder layer is a KDA mixer ("linear_attention") or NoPE latent attention
("full_attention"), then a SwiGLU MLP ("dense") or a DeepSeek-V3 MoE ("sparse": sigmoid
router with a score-correction bias, group-limited top-k, renormalised, scaled by
`routed_scaling_factor`, plus `n_shared_experts` always-on experts).
"""

from __future__ import annotations

from collections.abc import Mapping

from marconi_ray.core.model.hf import defaults
from marconi_ray.core.model.hf.arch import HfArchitecture
from marconi_ray.core.model.hf.blocks import ATTENTION, MAMBA
from marconi_ray.core.model.hf.kda_arch import KDAConfig
from marconi_ray.core.model.hf.kda_mla_layers import DENSE, SPARSE, kda_mla_stack
from marconi_ray.core.model.hf.mla_arch import MLAConfig
from marconi_ray.core.model.hf.reader import ConfigReader

"""`mlp_layer_types` entries."""
LINEAR_KEYS = {"head_dim": "linear_head_dim", "num_heads": "linear_num_heads",
               "short_conv_kernel_size": "linear_conv_kernel_dim"}  # fmt: skip
"""`linear_attn_config` entries and the top-level keys they override."""


def _linear_int(r: ConfigReader, sub: Mapping[str, object], name: str) -> int:
    """`linear_attn_config[name]` when present, else its top-level key; a positive int."""
    if name not in sub:
        return r.pos_int(LINEAR_KEYS[name])
    value = sub[name]
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(
            f"{r.family} config key 'linear_attn_config.{name}' must be a positive int, "
            f"got {value!r}"
        )
    return value


def _layer_types(r: ConfigReader, sub: Mapping[str, object], n_layers: int) -> list[str]:
    """One of "linear_attention" / "full_attention" per layer, as `__post_init__` decides."""
    raw = r.opt_str_list("layer_types")
    if raw is None and "kda_layers" in sub and "full_attn_layers" in sub:
        types: list[str | None] = [None] * n_layers
        for key, kind in (("full_attn_layers", ATTENTION), ("kda_layers", MAMBA)):
            layers = sub[key]
            if not isinstance(layers, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 1 <= i <= n_layers
                for i in layers
            ):
                raise ValueError(
                    f"{r.family} config key 'linear_attn_config.{key}' must list layers "
                    f"1..{n_layers}, got {layers!r}"
                )
            for i in layers:
                types[i - 1] = kind
        missing = [i + 1 for i, t in enumerate(types) if t is None]
        if missing:
            raise ValueError(
                f"{r.family} config key 'linear_attn_config' gives no type to layers {missing}"
            )
        raw = [t for t in types if t is not None]
    elif raw is None:
        raw = [ATTENTION if i and i % 4 == 0 else MAMBA for i in range(n_layers)]
    if len(raw) != n_layers or set(raw) - {ATTENTION, MAMBA}:
        raise ValueError(
            f"{r.family} config key 'layer_types' must give 'linear_attention' or "
            f"'full_attention' for each of {n_layers} layers, got {raw!r}"
        )
    return raw


def _mlp_types(r: ConfigReader, n_layers: int) -> list[str]:
    """ "dense" or "sparse" per layer: `mlp_layer_types`, else the first
    `first_k_dense_replace` layers dense."""
    raw = r.opt_str_list("mlp_layer_types")
    if raw is None:
        k = r.req_int("first_k_dense_replace")
        raw = [DENSE if i < k else SPARSE for i in range(n_layers)]
    if len(raw) != n_layers or set(raw) - {DENSE, SPARSE}:
        raise ValueError(
            f"{r.family} config key 'mlp_layer_types' must give 'dense' or 'sparse' for each "
            f"of {n_layers} layers, got {raw!r}"
        )
    return raw


def parse_kimi_linear(config: Mapping[str, object]) -> HfArchitecture:
    """Kimi Linear: per layer a KDA mixer or MLA, then a dense MLP or the MoE."""
    r = ConfigReader(config, defaults.KIMI_LINEAR, "kimi_linear", defaults.KIMI_LINEAR_ALIASES)
    n_layers = r.req_int("num_hidden_layers")
    sub = r.mapping("linear_attn_config")
    act = r.req_str("hidden_act")
    types = _layer_types(r, sub, n_layers)
    kda = mla = None
    if MAMBA in types:
        if act != "silu":
            raise ValueError(
                f"{r.family} config key 'hidden_act' is {act!r}; KDA's short conv supports "
                "only 'silu'"
            )
        kda = KDAConfig(
            _linear_int(r, sub, "num_heads"),
            _linear_int(r, sub, "head_dim"),
            _linear_int(r, sub, "short_conv_kernel_size"),
        )
    if ATTENTION in types:
        mla = MLAConfig(
            n_heads=r.pos_int("num_attention_heads"),
            kv_lora_rank=r.req_int("kv_lora_rank"),
            qk_nope_head_dim=r.req_int("qk_nope_head_dim"),
            qk_rope_head_dim=r.req_int("qk_rope_head_dim"),
            v_head_dim=r.req_int("v_head_dim"),
            q_lora_rank=r.opt_int("q_lora_rank"),
            bias=r.flag("attention_bias"),
        )
    mlp_types = _mlp_types(r, n_layers)
    return kda_mla_stack(r, types, mlp_types, kda, mla, act)
