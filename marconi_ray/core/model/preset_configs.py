"""Published Hugging Face config.json values of the hybrid models behind the named presets.

Only the keys `hf.families` reads are kept; every other key takes the transformers class
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

# ---- the rest of the hybrid fleet ------------------------------------------------------
#
# Sources (the hub files could not be opened from here; each value comes from the copy
# named, key for key unless a note says otherwise):
# - nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16: the whole config.json pasted as
#   NEMOTRON3_30B_JSON in mehulbafnaa/jax-llm-examples nemotron3/tests/test_model.py
#   (commit 3209b9399457d584fe84115d8937d3356dd34ef5, a fork of jax-ml/jax-llm-examples);
#   the model card's counts agree (23 Mamba-2 + 23 MoE + 6 attention layers, 128 routed
#   experts + 1 shared, 6 active; "mamba_ssm_cache_dtype": "float32").
# - ibm-granite/granite-4.0-h-tiny and granite-4.0-h-small: the model card's architecture
#   table (reproduced in DocDBrown/IBMGranite4Tiny README.md, commit
#   60d949f9a1b5df8e0fb09bf970d15a8188fb963d): embedding 1536 / 4096, 4 attention + 36
#   Mamba2 layers, attention heads 12 / 32 of 128, KV heads 4 / 8, Mamba2 state 128,
#   Mamba2 heads 48 / 128, shared expert 1024 / 1536, experts 64 / 72, active 6 / 10,
#   expert hidden 512 / 768, SwiGLU, 128K sequence, NoPE. Not in the card, so not
#   published in a copy found here: mamba_n_groups (1, the class default, also what
#   public test fixtures of the Tiny config give), mamba_d_head (derived as the class
#   derives "auto": 2 * embedding / Mamba2 heads = 64), the vocabulary (100352 in every
#   partial copy of both files found), the attention layers' positions (5, 15, 25, 35 in
#   the Tiny fixtures; assumed the same for Small: the cost model does not depend on the
#   order of layers) and the muP multipliers (left out: they change no cost figure).
# - tiiuae/Falcon-H1-7B-Instruct: FalconH1ModelProvider7B in NVIDIA-NeMo/Megatron-Bridge
#   src/megatron/bridge/models/falcon_h1/falconh1_provider.py (commit
#   070c45b7a318d3f841fa852ef87cd6e8e74304ee, "Model architecture from config.json": 44
#   layers, hidden 3072, ffn 12288, 12 heads / 2 KV, 262144 positions, Mamba2 state 256,
#   24 heads of 128, 1 group, expand 2, conv 4, chunk 256, mamba_rms_norm, vocab 130049,
#   untied, rope base 1e11); the attention head_dim 128 (not hidden / heads = 256) from
#   the transformers FalconH1 doc table ("H1 7B | 44 | 3072 | 12 | 2 | 24 | 128 / 128 |
#   256 | 256K"; copy in roboalchemist/llm-code-docs
#   docs/llms-txt/huggingface-transformers/falcon_h1.md, commit
#   8d73ea0007ac5fc4722083bfea16bb139f43f3a7); mamba_d_ssm = 24 * 128 = 3072 as the
#   Megatron bridge writes it back. Its muP multipliers are left out (no cost figure uses
#   them).
# - ai21labs/AI21-Jamba-1.5-Mini: the config.json replicated in sdpython/
#   experimental-experiment experimental_experiment/torch_models/llm_model_helper.py
#   (commit 04097e3040047505e7cac0c2c9040ff294fdd980, get_ai21_jamba_15_mini).

NEMOTRON_3_NANO_30B_A3B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "nemotron_h",
        "vocab_size": 131072,
        "hidden_size": 2688,
        "num_hidden_layers": 52,
        "hybrid_override_pattern": "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME",
        "num_attention_heads": 32,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "attention_bias": False,
        "intermediate_size": 1856,
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "mamba_num_heads": 64,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "chunk_size": 128,
        "expand": 2,
        "use_bias": False,
        "use_conv_bias": True,
        "time_step_min": 0.001,
        "time_step_max": 0.1,
        "time_step_floor": 0.0001,
        "mamba_ssm_cache_dtype": "float32",
        "n_routed_experts": 128,
        "n_shared_experts": 1,
        "num_experts_per_tok": 6,
        "moe_intermediate_size": 1856,
        "moe_shared_expert_intermediate_size": 3712,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "layer_norm_epsilon": 1e-05,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
        "eos_token_id": 2,
    }
)
"""nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B: 23 Mamba-2, 23 MoE (128 relu2 experts, top-6,
one shared) and 6 attention (no RoPE, 2 KV heads) layers."""

_GRANITE_4_H_ATTENTION = frozenset({5, 15, 25, 35})
_GRANITE_4_H: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "granitemoehybrid",
        "vocab_size": 100352,
        "num_hidden_layers": 40,
        "layer_types": ["attention" if i in _GRANITE_4_H_ATTENTION else "mamba" for i in range(40)],
        "position_embedding_type": "nope",
        "attention_bias": False,
        "hidden_act": "silu",
        "mamba_d_state": 128,
        "mamba_d_head": 64,
        "mamba_n_groups": 1,
        "mamba_expand": 2,
        "mamba_d_conv": 4,
        "mamba_chunk_size": 256,
        "max_position_embeddings": 131072,
        "tie_word_embeddings": True,
    }
)

GRANITE_4_0_H_TINY: Final[Mapping[str, object]] = MappingProxyType(
    {
        **_GRANITE_4_H,
        "hidden_size": 1536,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "mamba_n_heads": 48,
        "num_local_experts": 64,
        "num_experts_per_tok": 6,
        "intermediate_size": 512,
        "shared_intermediate_size": 1024,
    }
)
"""ibm-granite/granite-4.0-h-tiny (7B, 1B active): 36 Mamba-2 + 4 NoPE attention layers,
each followed by 64 experts (top-6) and a shared expert."""

GRANITE_4_0_H_SMALL: Final[Mapping[str, object]] = MappingProxyType(
    {
        **_GRANITE_4_H,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "mamba_n_heads": 128,
        "num_local_experts": 72,
        "num_experts_per_tok": 10,
        "intermediate_size": 768,
        "shared_intermediate_size": 1536,
    }
)
"""ibm-granite/granite-4.0-h-small (32B, 9B active): 36 Mamba-2 + 4 NoPE attention layers,
each followed by 72 experts (top-10) and a shared expert."""

FALCON_H1_7B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "falcon_h1",
        "vocab_size": 130049,
        "hidden_size": 3072,
        "intermediate_size": 12288,
        "num_hidden_layers": 44,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "hidden_act": "silu",
        "rope_theta": 100000000000.0,
        "max_position_embeddings": 262144,
        "mamba_d_ssm": 3072,
        "mamba_n_heads": 24,
        "mamba_d_head": 128,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 256,
        "mamba_rms_norm": True,
        "tie_word_embeddings": False,
    }
)
"""tiiuae/Falcon-H1-7B-Instruct: 44 layers, each running attention (2 KV heads of 128) and
a Mamba-2 (24 heads of 128, state 256) side by side, then a gated MLP."""

JAMBA_1_5_MINI: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "jamba",
        "vocab_size": 65536,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "hidden_act": "silu",
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": 256,
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
        "rms_norm_eps": 1e-06,
        "max_position_embeddings": 262144,
        "tie_word_embeddings": False,
    }
)
"""ai21labs/AI21-Jamba-1.5-Mini (52B, 12B active): 28 Mamba-1 (state 16) + 4 attention
layers (every 8th from 4), a 16-expert top-2 MoE every other layer."""

# - LiquidAI/LFM2-2.6B: the hub config.json transcribed key for key (with its
#   "transformers_version": "4.55.0.dev0") as the defaults of a C++ `struct Config`
#   found by the code index, which does not name that file's repository; the shapes agree
#   with every other copy found (30 layers, attention at 2, 5, 9, 13, 17, 21, 24, 27 and
#   22 short-conv layers, hidden 2048, 32 heads / 8 KV heads, conv_L_cache 3, FFN 10752
#   not auto-adjusted, vocab 65536, 128000 positions). The cost of a state does not depend
#   on anything but hidden_size, conv_L_cache and the number of conv layers.
_LFM2_2_6B_ATTENTION = frozenset({2, 5, 9, 13, 17, 21, 24, 27})

LFM2_2_6B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "lfm2",
        "vocab_size": 65536,
        "hidden_size": 2048,
        "num_hidden_layers": 30,
        "layer_types": [
            "full_attention" if i in _LFM2_2_6B_ATTENTION else "conv" for i in range(30)
        ],
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "conv_L_cache": 3,
        "conv_bias": False,
        "block_ff_dim": 10752,
        "block_auto_adjust_ff_dim": False,
        "block_ffn_dim_multiplier": 1.0,
        "block_multiple_of": 256,
        "norm_eps": 1e-05,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 128000,
        "tie_embedding": True,
        "eos_token_id": 7,
    }
)
"""LiquidAI/LFM2-2.6B: 22 gated short-conv layers (the state: a 2048 x 3 window each) and
8 GQA attention layers (8 KV heads of 64), each followed by a SwiGLU of 10752."""

# - tiiuae/falcon-mamba-7b: the hub config.json key for key as copied (with a link to the
#   hub file) by sdpython/experimental-experiment `llm_model_helper.py` @04097e3 (the
#   same file the Jamba 1.5 Mini preset comes from), and identical in transformers'
#   benchmark fixtures. Its `expand` 16 is not what runs: transformers keeps the file's
#   `intermediate_size` (8192, an expand of 2), and so does the parser.
FALCON_MAMBA_7B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "falcon_mamba",
        "conv_kernel": 4,
        "eos_token_id": 11,
        "expand": 16,
        "hidden_size": 4096,
        "intermediate_size": 8192,
        "layer_norm_epsilon": 1e-05,
        "num_hidden_layers": 64,
        "state_size": 16,
        "tie_word_embeddings": False,
        "time_step_rank": 256,
        "use_bias": False,
        "use_conv_bias": True,
        "vocab_size": 65024,
    }
)
"""tiiuae/falcon-mamba-7b: 64 Mamba-1 layers (d_inner 8192, state 16, weightless RMSNorms
on dt, B and C), no attention: no KV at all, every cached prefix is a state."""

# - NX-AI/xLSTM-7b: the hub config.json (huggingface.co/NX-AI/xLSTM-7b, blob
#   2504cc718375742c242e2e29017e32ce7f738019, as the documentation index serves it; the
#   blame view of the first commit f52774c shows the same keys). Kept: every key
#   transformers' xLSTMConfig reads. Left out: the file's backend and init keys
#   ("forward_backend_name", "step_backend_name", "igate_bias_init_range", ...) and
#   "head_dim": 512, which transformers does not read (its v heads are 4096 / 8 = 512
#   anyway). The file writes "embedding_dim" and "num_blocks", not hidden_size /
#   num_hidden_layers; it names no "weight_mode" (transformers' default "single") and no
#   context limit.
XLSTM_7B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "xlstm",
        "embedding_dim": 4096,
        "num_blocks": 32,
        "num_heads": 8,
        "qk_dim_factor": 0.5,
        "v_dim_factor": 1.0,
        "ffn_proj_factor": 2.667,
        "ffn_round_up_to_multiple_of": 64,
        "gate_soft_cap": 15.0,
        "output_logit_soft_cap": 30.0,
        "norm_eps": 1e-06,
        "norm_reduction_force_float32": True,
        "use_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": 50304,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "pad_token_id": 1,
    }
)
"""NX-AI/xLSTM-7b: 32 blocks of an mLSTM layer (8 heads, q/k heads of 256, v heads of
512; its state C + n + m per head) and a SwiGLU of 10944; no attention: no KV at all,
every cached prefix is a state."""

# ---- the 2026 hybrids -----------------------------------------------------------------
#
# Sources (the hub files could not be opened from here; each value comes from the copy
# named, key for key unless a note says otherwise):
# - moonshotai/Kimi-Linear-48B-A3B-Instruct: the config.json of a quantized derivative,
#   Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4, as a hub mirror serves it
#   (hf.898520.xyz/Firworks/Kimi-Linear-48B-A3B-Instruct-nvfp4/resolve/main/config.json:
#   the base file's keys plus a `quantization_config`). Two copies the code index holds
#   without naming their repositories agree key for key on every kept key: a Swift test
#   fixture that calls itself "the production checkpoint config, verbatim" (its own
#   `quantization` block aside, transformers_version 4.57.1) and a Rust test
#   `released_48b_config_parses_with_one_based_layers`. ndif-team/nnterp
#   tests/families/test_kimi_linear.py (commit a1ad7410ee906479f84c2a9123b1707bcb274745)
#   confirms that the released file lists the last layer (27) as full attention. The file
#   also carries "head_dim": 72 (which transformers overwrites with qk_rope_head_dim) and
#   "num_key_value_heads": 32 (the number of heads: no grouping of the expanded keys); the
#   parser reads neither, so they are left out.
# - allenai/Olmo-Hybrid-7B: `olmo3_hybrid_7B` in allenai/open-instruct
#   open_instruct/olmo_core_hybrid.py (commit e6c3044aa6201c8bfa4573c1b03142af599e730d,
#   "The config for allenai/Olmo-Hybrid-7B": hidden 3840, 32 layers with full attention
#   at 3, 7, ..., 31, 30 heads / 30 KV heads of 128, MLP 11008, GDN 30 key / 30 value
#   heads of 96 / 192, conv 4, negative eigenvalues allowed, untied, and "config.json
#   carries rope_parameters = {"rope_theta": null}": NoPE), with the vocabulary 100352 from
#   that repository's test of it (open_instruct/test_olmo_core_hybrid.py, same commit).
#   The rest is transformers 5.25's `OlmoHybridConfig` defaults, which its docstring says
#   give "a similar configuration to that of allenai/Olmo-Hybrid-7B" and which equal the
#   open-instruct values wherever both give one: max_position_embeddings 65536,
#   rms_norm_eps 1e-6, no attention bias, eos 100257. (A third-party audit the code index
#   holds, unnamed, tabulates the same values for the public 7B configs and notes that the
#   Instruct / Think checkpoints say 32768 positions; the copies disagree on how NoPE is
#   written, `rope_parameters` null or `{"rope_theta": null}`; no cost figure depends on
#   either.)
# - MiniMaxAI/MiniMax-Text-01: its shapes are those of MiniMax-M1, "developed based on our
#   previous MiniMax-Text-01 model" (MiniMax-AI/MiniMax-M1 README.md), whose config.json
#   that GitHub repository carries (MiniMax-AI/MiniMax-M1 config.json, commit
#   2abb4f45a9df4154b4bde024d51874bd127edcee, model_type "minimax_m1", remote code). The
#   MiniMax-Text-01 model card (MiniMax-AI/MiniMax-01 MiniMax-Text-01-Model-Card.md,
#   commit 57cf223b177e99636c7711a0f179e9fdc9c38e8a) agrees on every shape it gives: 80
#   layers, a softmax attention after every 7 lightning attentions, 64 heads of 128, 32
#   experts of 9216, top-2, RoPE on half of the head with base 1e7, hidden 6144, vocab
#   200064; the 8 KV heads are the M1 file's only. The remote-code keys are written in
#   transformers 5's native `minimax` names, translated as transformers' MiniMax-VL-01
#   config migrates a MiniMax-Text-01 text config (`attn_type_list` -> `layer_types`,
#   `layernorm_*_alpha` / `_beta` -> `*_alpha_factor` / `_beta_factor`, `rotary_dim` 64 of
#   128 -> partial_rotary_factor 0.5): transformers 5.25's `MiniMaxConfig` ignores the
#   legacy names. The M1 file's max_position_embeddings (10240000) is kept; the file has no
#   eos_token_id (null).
# - google/recurrentgemma-2b: the copy tests/core/test_recurrent_gemma_config.py holds
#   (RECURRENTGEMMA_2B; the code index does not name its repository), its read keys only:
#   `head_dim` (256, what transformers derives anyway) and `_block_types` (the default
#   cycle, unread by transformers) are left out. Every shape the cost model uses agrees
#   with Google's own preset, google-deepmind/recurrentgemma recurrentgemma/common.py
#   `Preset.RECURRENT_GEMMA_2B_V1` (commit 2efa84dac0e68e63547a27a18fa943c98f1c312e):
#   width 2560, LRU width 2560, 10 heads, 26 blocks of the cycle recurrent, recurrent,
#   attention, window 2048, MLP 3 x 2560 (transformers' intermediate_size 15360 is twice
#   that, and it halves it), soft cap 30, vocab 256000, conv width 4 (the modules'
#   default), one KV head (`proj_k` is one head wide in recurrentgemma/torch/modules.py).

KIMI_LINEAR_48B_A3B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "kimi_linear",
        "vocab_size": 163840,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 27,
        "num_attention_heads": 32,
        "hidden_act": "silu",
        "first_k_dense_replace": 1,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "linear_attn_config": {
            "full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
            "head_dim": 128,
            "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
            "num_heads": 32,
            "short_conv_kernel_size": 4,
        },
        "model_max_length": 1048576,
        "moe_intermediate_size": 1024,
        "moe_renormalize": True,
        "num_expert_group": 1,
        "num_experts": 256,
        "num_experts_per_token": 8,
        "num_shared_experts": 1,
        "routed_scaling_factor": 2.446,
        "topk_group": 1,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "eos_token_id": 163586,
    }
)
"""moonshotai/Kimi-Linear-48B-A3B-Instruct: 20 KDA (32 heads of 128, conv 4) and 7 NoPE
MLA layers (latent 512 + shared RoPE key 64 cached per token), a dense SwiGLU first and
256-expert top-8 sigmoid MoEs with one shared expert after."""

OLMO_HYBRID_7B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "olmo_hybrid",
        "vocab_size": 100352,
        "hidden_size": 3840,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 30,
        "num_key_value_heads": 30,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "rms_norm_eps": 1e-06,
        "attention_bias": False,
        "tie_word_embeddings": False,
        "eos_token_id": 100257,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(32)],
        "linear_num_key_heads": 30,
        "linear_num_value_heads": 30,
        "linear_key_head_dim": 96,
        "linear_value_head_dim": 192,
        "linear_conv_kernel_dim": 4,
        "linear_allow_neg_eigval": True,
        "rope_parameters": {"rope_theta": None},
    }
)
"""allenai/Olmo-Hybrid-7B: 24 Gated DeltaNet layers (30 heads, keys 96, values 192) and 8
post-norm NoPE attention layers (30 KV heads of 128, no grouping), gated MLPs of 11008."""

MINIMAX_TEXT_01: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "minimax",
        "vocab_size": 200064,
        "hidden_size": 6144,
        "intermediate_size": 9216,
        "num_hidden_layers": 80,
        "layer_types": ["full_attention" if i % 8 == 7 else "linear_attention" for i in range(80)],
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "hidden_act": "silu",
        "num_local_experts": 32,
        "num_experts_per_tok": 2,
        "full_attn_alpha_factor": 3.5565588200778455,
        "full_attn_beta_factor": 1.0,
        "linear_attn_alpha_factor": 3.5565588200778455,
        "linear_attn_beta_factor": 1.0,
        "mlp_alpha_factor": 3.5565588200778455,
        "mlp_beta_factor": 1.0,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000000,
            "partial_rotary_factor": 0.5,
        },
        "max_position_embeddings": 10240000,
        "rms_norm_eps": 1e-05,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "eos_token_id": None,
    }
)
"""MiniMaxAI/MiniMax-Text-01 (456B, 45.9B active; the M1 file's shapes): 70 lightning
attention layers (64 heads of 128, a 128 x 128 fp32 state each) and 10 GQA softmax layers
(8 KV heads of 128), every one followed by 32 SwiGLU experts of 9216, top-2."""

RECURRENTGEMMA_2B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "recurrent_gemma",
        "vocab_size": 256000,
        "hidden_size": 2560,
        "intermediate_size": 15360,
        "num_hidden_layers": 26,
        "num_attention_heads": 10,
        "num_key_value_heads": 1,
        "lru_width": 2560,
        "conv1d_width": 4,
        "attention_window_size": 2048,
        "attention_bias": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "logits_soft_cap": 30.0,
        "partial_rotary_factor": 0.5,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-06,
    }
)
"""google/recurrentgemma-2b: 18 RG-LRU blocks (width 2560, conv 4) and 8 local attention
layers (window 2048, one KV head of 256) in the cycle recurrent, recurrent, attention."""

# - LiquidAI/LFM3-1.7B: the config.json Ollama serves as the config blob of its `lfm3`
#   model (ollama.com/library/lfm3:latest/blobs/218cc1b25bb4, "LFM3-1.7B is a tri-hybrid
#   model"; the `lfm3:1.7b-mxfp8` blob 8c6ae8b8f6d8 shows the same keys), as the docs index
#   serves it: the hub file with its remote-code `auto_map`. Its layout agrees with the
#   model's public description (24 layers: 13 gated convolutions of kernel 7, 5 sliding
#   windows of 256, 6 global attentions) and with transformers 5.25's `Lfm3Config`
#   defaults, whose docstring names this checkpoint. Kept: every key the parse reads. Left
#   out: the token ids, `auto_map`, `dtype`; the index shows the file only up to
#   `tie_word_embeddings`, so `vocab_size` is `Lfm3Config`'s default (128000, above the
#   file's bos 124894; informational: no cost figure reads it).
LFM3_1_7B: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "lfm3",
        "architectures": ["Lfm3ForCausalLM"],
        "conv_L_cache": 7,
        "conv_bias": False,
        "head_dim": 128,
        "hidden_size": 2048,
        "intermediate_size": 7680,
        "layer_types": [  # conv, conv, then full / conv / sliding / conv from layer 2
            "conv" if i % 2 or i == 0 else "full_attention" if i % 4 == 2 else "sliding_attention"
            for i in range(24)
        ],
        "max_position_embeddings": 262144,
        "norm_eps": 1e-05,
        "num_attention_heads": 16,
        "num_hidden_layers": 24,
        "num_key_value_heads": 4,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.5,
                "rope_theta": 1000000.0,
                "rope_type": "default",
            },
            "sliding_attention": {"rope_theta": 10000, "rope_type": "default"},
        },
        "sliding_window": 256,
        "tie_word_embeddings": True,
    }
)
"""LiquidAI/LFM3-1.7B: 13 gated short convolutions (kernel 7), 5 sliding-window attentions
(window 256) and 6 full attentions (16 heads of 128, 4 KV heads), SwiGLU MLPs of 7680."""

# - inclusionAI/Ling-3.0-flash: the config.json facts a public Rust port pins in its tests
#   as "the Ling-3.0-flash-int4 config facts (subset)", its layer schedule checked there
#   against the real checkpoint's safetensors index (MLA weights only at layers 5, 11, ...,
#   41; dense MLPs at layers 0 and 1); the code index does not name its repository. Every
#   key it gives equals transformers 5.25's `BailingHybridConfig` defaults, and the
#   `architectures` entry is Ling 3.0's (`BailingMoeV3ForCausalLM`, KDA). Left out: keys
#   the parse does not read (`rotary_dim` 64 = qk_rope_head_dim, `no_kda_lora`,
#   `gated_attention_proj_granularity_type` "head_wise", `moe_shared_expert_intermediate_size`
#   768 = moe_intermediate_size). The copy has no `max_position_embeddings` (the class's
#   default, 262144, applies; informational) nor `expert_swiglu_limit_list` (SwiGLU
#   clipping changes no cost).
LING_3_0_FLASH: Final[Mapping[str, object]] = MappingProxyType(
    {
        "model_type": "bailing_hybrid",
        "architectures": ["BailingMoeV3ForCausalLM"],
        "num_hidden_layers": 42,
        "hidden_size": 2560,
        "vocab_size": 157184,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": False,
        "first_k_dense_replace": 2,
        "intermediate_size": 6144,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "head_dim": 128,
        "rope_theta": 6000000,
        "rope_interleave": True,
        "short_conv_kernel_size": 4,
        "kda_safe_gate": True,
        "kda_lower_bound": -5.0,
        "num_experts": 512,
        "num_experts_per_tok": 8,
        "num_shared_experts": 1,
        "moe_intermediate_size": 768,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "n_group": 8,
        "topk_group": 4,
        "layer_group_size": 6,
    }
)
"""inclusionAI/Ling-3.0-flash: 35 KDA layers (32 heads of 128, conv 4, safe gate) and 7 MLA
layers (latent 512 + shared RoPE key 64 cached per token, a per-head gate), the last of
every 6; two dense SwiGLU layers, then 512-expert top-8 grouped sigmoid MoEs with one
shared expert."""
