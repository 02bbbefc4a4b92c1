"""RecurrentGemma presets: the transformers config keywords of a `ModelPreset` built as
`recurrent_gemma`, and the bias that lifts its printable logits (see `factory`).

Layers: one fewer than the preset's mixers (the tiny preset: 4), temporal blocks cycling
through transformers' default `block_types` (recurrent, recurrent, attention), so the
tiny model is R, R, W, R. The RG-LRU is as wide as the residual stream (`lru_width`
None) with the preset's heads as gate blocks and conv width; the attention has the
preset's query and KV heads (head_dim = hidden / heads, as RecurrentGemma derives it),
RoPE over half of each head and a window of `WINDOWS[preset]` tokens (16 for tiny, so a
300-token prompt crosses it many times). The MLP (gelu, biases, width intermediate // 2)
is Bamba's gated width. Embeddings untied (the logit lift rewrites the LM head). The
preset's context limit is written as `max_position_embeddings` (the config class has
none; transformers keeps the extra key).

Logit lift: every MLP has biases, so the last layer's MLP `down_proj.bias` writes the
lift channel (`rgemma_lift`). `PRESET_SOFT_CAP` replaces transformers' cap of 30, which
would squash the lifted printable logits (~44) below the spread and stray-probability
checks; the cap still applies (tanh is not linear there). The other biases of the
recurrent block and the attention output are drawn N(0, `BIAS_STD`^2) so that loading
them is tested.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import torch

from marconi_ray.engine.presets.byte_tokenizer import BOS_ID, EOS_ID, PAD_ID
from marconi_ray.engine.presets.model_presets import ModelPreset

FAMILY: Final = "recurrent_gemma"
PRESET_SOFT_CAP: Final = 200.0
BIAS_STD: Final = 0.1
DEFAULT_WINDOW: Final = 128
WINDOWS: Final[Mapping[str, int]] = MappingProxyType({"tiny": 16, "small": 64})
"""`attention_window_size` per preset (`DEFAULT_WINDOW` for the others)."""
_RANDOM_BIASES: Final = (
    "linear_x",
    "linear_y",
    "linear_out",
    "conv_1d",
    "o_proj",
)


def recurrent_gemma_kwargs(p: ModelPreset) -> dict[str, Any]:
    """Keyword arguments of `transformers.RecurrentGemmaConfig` for preset `p` (see the
    module docstring)."""
    return {
        "vocab_size": p.vocab_size,
        "hidden_size": p.hidden_size,
        "num_hidden_layers": max(1, len(p.mixers) - 1),
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "intermediate_size": 2 * p.gated_intermediate_size,
        "attention_window_size": WINDOWS.get(p.name, DEFAULT_WINDOW),
        "conv1d_width": p.conv_kernel,
        "logits_soft_cap": PRESET_SOFT_CAP,
        "block_types": ["recurrent", "recurrent", "attention"],
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
        "tie_word_embeddings": False,
        "max_position_embeddings": p.max_position_embeddings,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


def rgemma_lift(model: Any) -> Any:
    """Draw the recurrent blocks' and attention outputs' biases and the RG-LRU gate
    biases (from the seeded RNG), and return the last layer's MLP `down_proj`, whose
    bias carries the lift (every MLP bias stays 0 but that one's lift channel)."""
    layers = model.model.layers
    with torch.no_grad():
        for layer in layers:
            block = layer.temporal_block
            for name in _RANDOM_BIASES:
                mod = getattr(block, name, None)
                if mod is not None and mod.bias is not None:
                    mod.bias.normal_(0.0, BIAS_STD)
            lru = getattr(block, "rg_lru", None)
            if lru is not None:
                lru.input_gate_bias.normal_(0.0, BIAS_STD)
                lru.recurrent_gate_bias.normal_(0.0, BIAS_STD)
    return layers[-1].mlp_block.down_proj
