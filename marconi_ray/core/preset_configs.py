"""Published Hugging Face config.json values of the hybrid models behind the named presets.

Only the keys `hf_families` reads are kept; every other key takes the transformers class
default, as it would from the full file. Each dict keeps the hub file's layout (Qwen3.5's
multimodal checkpoints wrap the language model in `text_config`, Qwen3-Next's is flat with
the legacy top-level `rope_theta` / `partial_rotary_factor`), so the presets also exercise
the parse a downloaded config.json goes through.

Sources (the official config.json files could not be opened from here; the values come
from copies of them and from the model cards, which agree on every shape):
- Qwen/Qwen3-Next-80B-A3B-Instruct: the config.json replicated key for key in
  NVIDIA-NeMo/Megatron-Bridge tests/unit_tests/models/qwen/test_qwen3_next_bridge.py
  (commit 00d5e5f66f99fb4ae1749c437667b868b31b68bf, fixture qwen3_next_80b_a3b_config_dict);
  the same shapes in THUDM/slime scripts/models/qwen3-next-80B-A3B.sh (commit
  af61a8ec4cfee817767630623187c4b5edbd5dd8) and in the model card
  (huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct: 48 layers, hidden 2048,
  12 x (3 x (Gated DeltaNet -> MoE) -> (Gated Attention -> MoE)), 512 experts, 10 routed +
  1 shared).
- Qwen/Qwen3.5-27B: the text config in Megatron-Bridge
  tests/unit_tests/models/qwen/test_qwen35_bridge.py (commit
  0be1d58bad4fb185a8f51aefb00d0d9d5a7d4986, fixture qwen3_5_27b_config_dict), which omits
  head_dim: 256 from THUDM/slime scripts/models/qwen3.5-27B.sh (--kv-channels 256), the
  model card's gated attention (24 Q / 4 KV heads of 256) and the class default.
- Qwen/Qwen3.5-35B-A3B: THUDM/slime scripts/models/qwen3.5-35B-A3B.sh (commit
  10cefc3b91ba5db960c74037390f4e2596f5773d: 40 layers, hidden 2048, 16 / 2 heads of 256,
  256 experts of 512, top-8, shared 512, linear heads 16 K / 32 V of 128, rotary 0.25,
  theta 1e7, vocab 248320), equal to the text_config copies of the hub file in public
  checkpoint validators (qwen3_5_moe_text, max_position_embeddings 262144).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

_QWEN3_5_ROPE: Final[Mapping[str, object]] = MappingProxyType(
    {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25}
)
_QWEN_LINEAR_ATTENTION: Final[Mapping[str, object]] = MappingProxyType(
    {
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_value_head_dim": 128,
        "head_dim": 256,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": 1e-06,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
    }
)

QWEN3_5_27B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "qwen3_5",
        "tie_word_embeddings": False,
        "text_config": {
            **_QWEN_LINEAR_ATTENTION,
            "model_type": "qwen3_5_text",
            "vocab_size": 248320,
            "hidden_size": 5120,
            "intermediate_size": 17408,
            "num_hidden_layers": 64,
            "num_attention_heads": 24,
            "num_key_value_heads": 4,
            "linear_num_value_heads": 48,
            "rope_parameters": dict(_QWEN3_5_ROPE),
        },
    }
)
"""Qwen/Qwen3.5-27B (dense): 48 Gated DeltaNet + 16 gated-attention layers."""

QWEN3_5_35B_A3B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False,
        "text_config": {
            **_QWEN_LINEAR_ATTENTION,
            "model_type": "qwen3_5_moe_text",
            "vocab_size": 248320,
            "hidden_size": 2048,
            "num_hidden_layers": 40,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "linear_num_value_heads": 32,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "rope_parameters": dict(_QWEN3_5_ROPE),
        },
    }
)
"""Qwen/Qwen3.5-35B-A3B (MoE): 30 Gated DeltaNet + 10 gated-attention layers, MoE in all."""

QWEN3_NEXT_80B_A3B: Final[Mapping[str, object]] = MappingProxyType(
    {
        **_QWEN_LINEAR_ATTENTION,
        "model_type": "qwen3_next",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5120,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "linear_num_value_heads": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "norm_topk_prob": True,
        "rope_theta": 10000000,
        "partial_rotary_factor": 0.25,
    }
)
"""Qwen/Qwen3-Next-80B-A3B-Instruct: 36 Gated DeltaNet + 12 gated-attention layers, MoE in
all (decoder_sparse_step 1, no mlp_only_layers)."""
