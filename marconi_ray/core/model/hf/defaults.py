"""Defaults of the transformers config classes for the keys `families` reads.

Values are those the classes declare (transformers 5.x `configuration_*.py`); a key
whose value is None or "auto" is derived by the parser the way the class's
`__post_init__` or the model code derives it. `head_dim` None means hidden_size //
num_attention_heads (the model code's fallback when the config has no head_dim).
Keys under "# details" matter to the engine only (norms, activations, biases, RoPE, scan
chunk size, dt clamp, embeddings tying, EOS). Immutable registries only.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

_ROPE_FULL: Final[Mapping[str, object]] = MappingProxyType(
    {"rope_theta": 10000.0, "rope_type": "default"}
)
_ROPE_HALF: Final[Mapping[str, object]] = MappingProxyType(
    {"rope_theta": 10000.0, "partial_rotary_factor": 0.5, "rope_type": "default"}
)
NEMOTRON_H: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 131072,
        "hidden_size": 4096,
        "max_position_embeddings": 4096,
        "layers_block_type": None,
        "hybrid_override_pattern": None,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 21504,
        "ssm_state_size": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "conv_kernel": 4,
        "n_routed_experts": 8,
        "moe_intermediate_size": 7688,
        "moe_shared_expert_intermediate_size": 7688,
        "moe_latent_size": None,
        "num_experts_per_tok": 2,
        # details
        "routed_scaling_factor": 1.0,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "layer_norm_epsilon": 1e-5,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "attention_bias": False,
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "chunk_size": 128,
        "use_conv_bias": True,
        "use_bias": False,
        "time_step_min": 0.001,
    }
)
NEMOTRON_H_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "n_groups": ("mamba_n_groups",),
        "conv_kernel": ("mamba_d_conv",),
        "n_routed_experts": ("num_local_experts",),
        "layers_block_type": ("layer_types",),
        "use_conv_bias": ("mamba_conv_bias",),
        "chunk_size": ("mamba_chunk_size",),
        "time_step_min": ("mamba_dt_min",),
    }
)
NEMOTRON_H_PATTERN: Final[Mapping[str, str]] = MappingProxyType(
    {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
)
"""hybrid_override_pattern character -> layer type (the legacy pattern string)."""
NEMOTRON_H_DEFAULT_LAYERS: Final = ("linear_attention", "moe", "full_attention", "mlp")

BAMBA: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 128000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 262144,
        "attn_layer_indices": None,
        "mamba_n_heads": 128,
        "mamba_d_head": "auto",
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        # details
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_parameters": _ROPE_HALF,
        "mamba_chunk_size": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "time_step_limit": (0.0, float("inf")),
    }
)

JAMBA: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 65536,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 262144,
        "num_experts_per_tok": 2,
        "num_experts": 16,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": "auto",
        # details
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
    }
)
JAMBA_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {"num_experts": ("num_local_experts",)}
)

ZAMBA2: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 32000,
        "max_position_embeddings": 4096,
        "use_long_context": False,
        "hidden_size": 2560,
        "layers_block_type": None,
        "mamba_d_state": 64,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_ngroups": 1,
        "n_mamba_heads": 8,
        "intermediate_size": None,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "use_shared_attention_adapter": False,
        "adapter_rank": 128,
        "num_mem_blocks": 1,
        # details
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "eos_token_id": 2,
        "hidden_act": "gelu",
        "use_mem_rope": False,
        "rope_parameters": _ROPE_FULL,
        "chunk_size": 256,
        "use_conv_bias": True,
        "add_bias_linear": False,
        "time_step_min": 0.001,
    }
)
ZAMBA2_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {"layers_block_type": ("layer_types",)}
)
ZAMBA2_LONG_CONTEXT_POSITIONS: Final = 16384
ZAMBA2_DEFAULT_LAYERS: Final[tuple[str, ...]] = (
    ("linear_attention",)
    + (("linear_attention",) * 5 + ("hybrid",)) * 7
    + ("linear_attention",) * 4
    + ("hybrid",)
    + ("linear_attention",) * 3
    + ("hybrid",)
    + ("linear_attention",) * 2
)

FALCON_H1: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 128000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 8192,
        "mamba_d_ssm": 1024,
        "mamba_n_heads": 128,
        "mamba_d_head": "auto",
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        # details
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "rope_parameters": _ROPE_FULL,
        "mamba_chunk_size": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "time_step_limit": (0.0, float("inf")),
        "mamba_rms_norm": False,
        "mamba_norm_before_gate": True,
        "projectors_bias": False,
        "embedding_multiplier": 1.0,
        "lm_head_multiplier": 1.0,
        "key_multiplier": 1.0,
        "attention_in_multiplier": 1.0,
        "attention_out_multiplier": 1.0,
        "ssm_in_multiplier": 1.0,
        "ssm_out_multiplier": 1.0,
        "ssm_multipliers": None,
        "mlp_multipliers": None,
    }
)

GRANITE_MOE_HYBRID: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": None,
        "head_dim": None,
        "max_position_embeddings": 2048,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 1024,
        "layer_types": None,
        "mamba_n_heads": 128,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_head": "auto",
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        # details
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "attention_bias": False,
        "position_embedding_type": None,
        "rope_parameters": _ROPE_FULL,
        "mamba_chunk_size": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "time_step_limit": (0.0, float("inf")),
        "embedding_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "logits_scaling": 1.0,
        "attention_multiplier": 1.0,
    }
)
GRANITE_MOE_HYBRID_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {"layer_types": ("layers_block_type",)}
)

_QWEN_LINEAR: Final[Mapping[str, object]] = MappingProxyType(
    {
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "layer_types": None,
        "full_attention_interval": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "max_position_embeddings": 32768,
        # details
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "eos_token_id": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
    }
)
QWEN3_5_TEXT: Final[Mapping[str, object]] = MappingProxyType(
    {
        **_QWEN_LINEAR,
        "vocab_size": 248320,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 32,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
    }
)
QWEN3_5_MOE_TEXT: Final[Mapping[str, object]] = MappingProxyType(
    {
        **_QWEN_LINEAR,
        "vocab_size": 248320,
        "hidden_size": 2048,
        "num_hidden_layers": 40,
        "num_attention_heads": 16,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 8,
        "num_experts": 256,
    }
)
QWEN3_NEXT: Final[Mapping[str, object]] = MappingProxyType(
    {
        **_QWEN_LINEAR,
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "decoder_sparse_step": 1,
        "mlp_only_layers": None,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 10,
        "num_experts": 512,
        "norm_topk_prob": True,
    }
)
"""Qwen3-Next; Qwen3.5's text configs share its linear-attention keys (`_QWEN_LINEAR`).
`rope_theta` and `partial_rotary_factor` are the legacy top-level keys, read when
`rope_parameters` lacks them."""

LEGACY_LAYER_TYPES: Final[Mapping[str, str]] = MappingProxyType(
    {"mamba": "linear_attention", "attention": "full_attention"}
)
"""Old layer-type names that transformers remaps to the current ones."""

_LFM2_COMMON: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 65536,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 128000,
        "layer_types": None,
        "full_attn_idxs": None,
        "conv_L_cache": 3,
        # details
        "norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "eos_token_id": 2,
        "conv_bias": False,
        "rope_parameters": None,
        "rope_theta": 1000000.0,
    }
)
LFM2: Final[Mapping[str, object]] = MappingProxyType(
    {
        **_LFM2_COMMON,
        "hidden_size": 2560,
        "intermediate_size": 12288,
        "block_multiple_of": 256,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True,
    }
)
LFM2_MOE: Final[Mapping[str, object]] = MappingProxyType(
    {
        **_LFM2_COMMON,
        "hidden_size": 2048,
        "intermediate_size": 7168,
        "moe_intermediate_size": 1792,
        "num_dense_layers": 2,
        "num_experts_per_tok": 4,
        "num_experts": 32,
        "use_expert_bias": True,
        "routed_scaling_factor": 1.0,
        "norm_topk_prob": True,
    }
)
"""LFM2 / LFM2-MoE (`Lfm2Config`, `Lfm2MoeConfig`). `layer_types` of "conv" and
"full_attention"; without it LFM2 takes attention at `full_attn_idxs` (None: every layer),
as `Lfm2Config.__post_init__` does. `rope_theta` is the legacy top-level key, read when
`rope_parameters` is null or lacks it (the classes' `default_theta` otherwise)."""
LFM2_MOE_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {"tie_word_embeddings": ("tie_embedding",)}
)
LFM2_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {**LFM2_MOE_ALIASES, "intermediate_size": ("block_ff_dim",)}
)
"""Legacy keys the LFM2 config classes pop in `__post_init__`."""

RECURRENT_GEMMA: Final[Mapping[str, object]] = MappingProxyType(
    {
        "num_hidden_layers": 26,
        "vocab_size": 256000,
        "hidden_size": 2560,
        "intermediate_size": 3 * 2560,
        "num_attention_heads": 10,
        "lru_width": None,
        "attention_window_size": 2048,
        "conv1d_width": 4,
        "logits_soft_cap": 30.0,
        "rms_norm_eps": 1e-6,
        "eos_token_id": 1,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": None,
        "block_types": ("recurrent", "recurrent", "attention"),
        "num_key_value_heads": None,
        "attention_bias": False,
        "tie_word_embeddings": True,
        "max_position_embeddings": None,
    }
)
"""RecurrentGemma (`RecurrentGemmaConfig`): `lru_width` None is hidden_size,
`num_key_value_heads` None is num_attention_heads, head_dim is always
hidden_size // num_attention_heads; RoPE defaults to theta 10000 over half of each head
(`partial_rotary_factor` 0.5). The class has no `max_position_embeddings` (RoPE, a
windowed attention and a recurrence: no limit of its own)."""
KIMI_LINEAR: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 163840,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "moe_intermediate_size": 1024,
        "num_hidden_layers": 27,
        "num_attention_heads": 32,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.446,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "n_group": 1,
        "topk_group": 1,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": 1048576,
        "rms_norm_eps": 1e-5,
        "eos_token_id": 163586,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "num_local_experts": 256,
        "mlp_layer_types": None,
        "layer_types": None,
        "linear_head_dim": 128,
        "linear_num_heads": 32,
        "linear_conv_kernel_dim": 4,
        "linear_attn_config": {},
        "first_k_dense_replace": 1,
    }
)
"""Kimi Linear (`KimiLinearConfig`). The checkpoint's `linear_attn_config` (head_dim,
num_heads, short_conv_kernel_size; 1-indexed kda_layers / full_attn_layers) overrides the
`linear_*` keys, and gives the layer types when `layer_types` is null; without either,
every 4th layer but the first is attention. `mlp_layer_types` null: the first
`first_k_dense_replace` layers are dense."""
KIMI_LINEAR_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "max_position_embeddings": ("model_max_length",),
        "norm_topk_prob": ("moe_renormalize",),
        "n_group": ("num_expert_group",),
        "num_local_experts": ("num_experts",),
        "num_experts_per_tok": ("num_experts_per_token",),
        "n_shared_experts": ("num_shared_experts",),
    }
)
"""`KimiLinearConfig.attribute_map`: the names its config.json files use."""
MINIMAX: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": None,
        "max_position_embeddings": 4096 * 32,
        "num_experts_per_tok": 2,
        "num_local_experts": 8,
        "layer_types": None,
        "attn_type_list": None,
        "sliding_window": None,
        "full_attn_alpha_factor": 1,
        "full_attn_beta_factor": 1,
        "linear_attn_alpha_factor": 1,
        "linear_attn_beta_factor": 1,
        "mlp_alpha_factor": 1,
        "mlp_beta_factor": 1,
        # details
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "rope_parameters": MappingProxyType({"rope_theta": 1000000.0, "rope_type": "default"}),
    }
)
"""MiniMax-Text-01 / MiniMax-M1 (`MiniMaxConfig`; `rope_theta` is its `default_theta`).
Without `layer_types` (nor the original checkpoints' `attn_type_list`) even layers are
full attention and odd ones lightning, as `MiniMaxConfig.__post_init__` sets them."""
MINIMAX_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "num_local_experts": ("num_experts",),
        "full_attn_alpha_factor": ("layernorm_full_attention_alpha",),
        "full_attn_beta_factor": ("layernorm_full_attention_beta",),
        "linear_attn_alpha_factor": ("layernorm_linear_attention_alpha",),
        "linear_attn_beta_factor": ("layernorm_linear_attention_beta",),
        "mlp_alpha_factor": ("layernorm_mlp_alpha",),
        "mlp_beta_factor": ("layernorm_mlp_beta",),
    }
)
"""The original MiniMax checkpoints' names of the residual factors (their
`layernorm_*_alpha` / `_beta`), and the `num_experts` attribute alias."""
