"""A Hugging Face `config.json` dict -> `HfArchitecture` -> `ModelSpec` (no transformers import).

`parse_hf_config` dispatches on `config["model_type"]` through `HF_PARSERS`, an immutable
registry of one parser per supported hybrid family (see `families`), and returns only
architectures whose cost model builds (every size checked by `core/model/layers.py`).
`spec_from_architecture` is the core's view of a parse (FLOPs and bytes);
`spec_from_hf_config` is the two in one call. The engine's `HybridConfig` is derived
from the same `parse_hf_config` result.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from marconi_ray.core.model.hf import families, olmo, pure_ssm
from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    BlockConfig,
    GatedDeltaNetConfig,
    HfArchitecture,
    LinearConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    MoEConfig,
    RGLRUConfig,
    ShortConvConfig,
    SlidingAttentionConfig,
)
from marconi_ray.core.model.hf.bailing import parse_bailing_hybrid
from marconi_ray.core.model.hf.kda_arch import KDAConfig
from marconi_ray.core.model.hf.kimi_linear import parse_kimi_linear
from marconi_ray.core.model.hf.lfm3 import parse_lfm3, parse_lfm3_vl
from marconi_ray.core.model.hf.lightning import LightningConfig
from marconi_ray.core.model.hf.minimax import parse_minimax
from marconi_ray.core.model.hf.mla_arch import MLAConfig
from marconi_ray.core.model.hf.mlstm_arch import MLSTMConfig
from marconi_ray.core.model.hf.recurrent_gemma import parse_recurrent_gemma
from marconi_ray.core.model.hf.xlstm import parse_xlstm
from marconi_ray.core.model.kimi_layers import KDALayer, MLALayer
from marconi_ray.core.model.layers import (
    AttentionLayer,
    GatedDeltaNetLayer,
    LayerSpec,
    LinearLayer,
    Mamba1Layer,
    Mamba2Layer,
    MLPLayer,
    MoELayer,
    RGLRULayer,
    ShortConvLayer,
)
from marconi_ray.core.model.lightning_layer import LightningLayer
from marconi_ray.core.model.mlstm_layer import MLSTMLayer
from marconi_ray.core.model.model_spec import ModelSpec
from marconi_ray.core.model.spec_checks import require_positive

HfParser = Callable[[Mapping[str, object]], HfArchitecture]
"""config dict -> HfArchitecture."""

HF_PARSERS: Final[Mapping[str, HfParser]] = MappingProxyType(
    {
        "nemotron_h": families.parse_nemotron_h,
        "bamba": families.parse_bamba,
        "jamba": families.parse_jamba,
        "zamba2": families.parse_zamba2,
        "falcon_h1": families.parse_falcon_h1,
        "granitemoehybrid": families.parse_granitemoehybrid,
        "qwen3_5_text": families.parse_qwen3_5_text,
        "qwen3_5": families.parse_qwen3_5,
        "qwen3_5_moe_text": families.parse_qwen3_5_moe_text,
        "qwen3_5_moe": families.parse_qwen3_5_moe,
        "qwen3_next": families.parse_qwen3_next,
        "lfm2": families.parse_lfm2,
        "lfm2_moe": families.parse_lfm2_moe,
        "mamba": pure_ssm.parse_mamba,
        "falcon_mamba": pure_ssm.parse_falcon_mamba,
        "mamba2": pure_ssm.parse_mamba2,
        "olmo_hybrid": olmo.parse_olmo_hybrid,
        "recurrent_gemma": parse_recurrent_gemma,
        "kimi_linear": parse_kimi_linear,
        "minimax": parse_minimax,
        "xlstm": parse_xlstm,
        "bailing_hybrid": parse_bailing_hybrid,
        "lfm3": parse_lfm3,
        "lfm3_vl": parse_lfm3_vl,
    }
)


def supported_model_types() -> tuple[str, ...]:
    """The model_type values `parse_hf_config` accepts, sorted."""
    return tuple(sorted(HF_PARSERS))


def parse_hf_config(config: Mapping[str, object]) -> HfArchitecture:
    """Parse a HF config dict (`config.json` or `PretrainedConfig.to_dict()`) once.

    Keys it lacks take the defaults of the family's transformers config class.

    Raises:
        ValueError: config is not a mapping, model_type is missing or unsupported (the
            message lists the supported ones), a required key is missing or null, or a
            value has the wrong type or an invalid size; the message names the key.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"config must be a mapping, got {type(config).__name__}")
    if "model_type" not in config:
        raise ValueError("config is missing required key 'model_type'")
    model_type = config["model_type"]
    parser = HF_PARSERS.get(model_type) if isinstance(model_type, str) else None
    if parser is None:
        supported = ", ".join(supported_model_types())
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {supported}")
    arch = parser(config)
    spec_from_architecture(arch)  # the layer specs check every size
    return arch


def layer_spec(config: BlockConfig, d_model: int) -> LayerSpec:
    """The cost model of one block of a model with residual width `d_model`."""
    match config:
        case AttentionConfig(n_heads=h, n_kv_heads=kv, head_dim=hd, input_dim=d_in):
            return AttentionLayer(
                d_model, h, kv, hd, d_in, output_gate=config.output_gate, head_gate=config.head_gate
            )
        case GatedDeltaNetConfig():
            c = config
            return GatedDeltaNetLayer(
                d_model, c.n_k_heads, c.n_v_heads, c.head_k_dim, c.head_v_dim, c.d_conv
            )
        case Mamba2Config(n_heads=h, head_dim=hd, n_groups=g, d_state=n, d_conv=k):
            return Mamba2Layer(d_model, h, hd, g, n, k)
        case Mamba1Config(d_inner=di, d_state=n, d_conv=k, dt_rank=rank):
            return Mamba1Layer(d_model, di, n, k, rank)
        case MLPConfig(intermediate_size=ff, gated=gated):
            return MLPLayer(d_model, ff, gated)
        case MoEConfig():
            return MoELayer(
                d_model,
                config.intermediate_size,
                config.n_experts,
                config.top_k,
                config.gated,
                n_shared_experts=config.n_shared_experts,
                shared_d_ff=config.shared_intermediate_size,
                latent_dim=config.latent_dim,
                shared_expert_gate=config.shared_expert_gate,
            )
        case ShortConvConfig(d_conv=k):
            return ShortConvLayer(d_model, k)
        case RGLRUConfig(lru_width=w, n_heads=h, d_conv=k):
            return RGLRULayer(d_model, w, h, k)
        case SlidingAttentionConfig(attention=attn, window=w):
            a = attn
            return AttentionLayer(
                d_model, a.n_heads, a.n_kv_heads, a.head_dim, a.input_dim,
                output_gate=a.output_gate, window=w, head_gate=a.head_gate,
            )  # fmt: skip
        case LightningConfig(n_heads=h, head_dim=hd):
            return LightningLayer(d_model, h, hd)
        case MLSTMConfig(n_heads=h, qk_head_dim=dqk, v_head_dim=dv):
            return MLSTMLayer(d_model, h, dqk, dv)
        case LinearConfig(d_in=d_in, d_out=d_out):
            return LinearLayer(d_in, d_out)
        case KDAConfig(n_heads=h, head_dim=hd, d_conv=k):
            return KDALayer(d_model, h, hd, k, config.low_rank_gates)
        case MLAConfig():
            m = config
            return MLALayer(
                d_model, m.n_heads, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim,
                m.v_head_dim, m.q_lora_rank, m.head_gate,
            )  # fmt: skip
    raise TypeError(f"not a block config: {config!r}")


def spec_from_architecture(
    arch: HfArchitecture,
    dtype_bytes: int = 2,
    name: str | None = None,
    state_dtype_bytes: int | None = None,
) -> ModelSpec:
    """The core's view of a parse: one layer spec per block, in order.

    name defaults to the family; `state_dtype_bytes` prices the recurrent states apart
    (see `ModelSpec`). Raises ValueError naming an invalid size.
    """
    specs: dict[BlockConfig, LayerSpec] = {}
    for block in arch.blocks:
        if block.config not in specs:
            specs[block.config] = layer_spec(block.config, arch.hidden_size)
    return ModelSpec(
        arch.family if name is None else name,
        tuple(specs[b.config] for b in arch.blocks),
        dtype_bytes=dtype_bytes,
        vocab_size=arch.vocab_size,
        max_position=arch.max_position,
        state_dtype_bytes=state_dtype_bytes,
    )


def spec_from_hf_config(
    config: Mapping[str, object],
    dtype_bytes: int = 2,
    name: str | None = None,
    state_dtype_bytes: int | None = None,
) -> ModelSpec:
    """Parse a HF config dict into a `ModelSpec` (`parse_hf_config`, then
    `spec_from_architecture`).

    Args:
        config: the parsed `config.json` or `PretrainedConfig.to_dict()`. Keys it lacks take
            the defaults of the family's transformers config class.
        dtype_bytes: bytes per element of the cached KV and SSM states (2 for fp16/bf16).
        state_dtype_bytes: bytes per element of the recurrent states when they are kept
            apart (4: fp32); None means dtype_bytes.
        name: spec name; defaults to the config's `_name_or_path`, else its model_type.

    Raises:
        ValueError: as `parse_hf_config`, or dtype_bytes is not a positive int.
    """
    require_positive("dtype_bytes", dtype_bytes)
    arch = parse_hf_config(config)
    if name is None:
        path = config.get("_name_or_path")
        name = path if isinstance(path, str) and path else arch.family
    return spec_from_architecture(arch, dtype_bytes, name, state_dtype_bytes)
