"""LFM3 presets: the transformers config keywords of a `ModelPreset` built as `lfm3`, and
how `factory.make_model` prepares its random weights (`lfm3_prepare`).

Layers: one per mixer of the pattern, in reverse order (as LFM2's presets), `M` a short
conv and `*` attention, the attention layers alternately sliding-window and full (the
first sliding), so the last layer is a short conv. The tiny preset is
swa, conv, conv, full, conv with a window of 16 (`WINDOWS`), so a 300-token prompt
crosses it many times; small is 8 convs, one sliding and one full attention layer,
window 64. head_dim is the preset's; the short conv has LFM3's kernel of 7
(`conv_L_cache`); the feed-forward is a SwiGLU of the preset's gated width. Every other
setting is transformers' default: sandwich norms, per-head attention gates, RoPE default
(theta 1e4) on sliding and proportional (theta 1e6, half the head) on full attention.

Weights: std 1 / sqrt(hidden) (`initializer_range`), so a projection keeps a unit-RMS
input at about unit RMS. With transformers' 0.02 a block's raw output (a short conv
multiplies three small projections) has an RMS far below sqrt(norm_eps), where the
sandwich norm's epsilon dominates and it no longer normalises: the model would not
exercise LFM3's post norms. Then (`lfm3_prepare`, from the seeded RNG) every RMSNorm
weight is drawn around 1 (N(1, `NORM_STD`^2)) and the attention gates' `g_proj` with a
std that spreads the gates over (0, 1), because a sandwich norm divides out any
constant factor: a missing gate, a swapped q/k norm or a post norm left at 1 would
otherwise change nothing.

Logit lift: LFM3 writes every block through a post norm, so a bias alone cannot add a
constant channel to the residual stream. The last layer's short conv `out_proj` (biases
on, `conv_bias`; all others zero) writes its bias `LIFT_BIAS_RATIO` times its output's
median norm on `LIFT_CHANNEL` (its weight row there zero): its post norm then divides by
a nearly constant norm, so the channel leaves it nearly constant, at the target its
weight there sets, and its other weights (sqrt(1 + ratio^2)) give the conv's own
channels back their usual scale. That layer's feed-forward neither reads the channel
(ffn_norm weight 0 there) nor writes it (w2 row 0), so the final norm (weight 1 on the
channel) sees it, as in the other families' lift (`factory._separate_logits`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import torch

from marconi_ray.engine.presets.byte_tokenizer import (
    BOS_ID,
    BYTE_OFFSET,
    BYTE_VOCAB_SIZE,
    EOS_ID,
    PAD_ID,
)
from marconi_ray.engine.presets.model_presets import ModelPreset

FAMILY: Final = "lfm3"
CONV_KERNEL: Final = 7
"""`conv_L_cache` of every preset (transformers' default)."""
DEFAULT_WINDOW: Final = 128
WINDOWS: Final[Mapping[str, int]] = MappingProxyType({"tiny": 16, "small": 64})
"""`sliding_window` per preset (`DEFAULT_WINDOW` for the others)."""
NORM_STD: Final = 0.2
GATE_STD: Final = 2.0
"""Std of each head's gate logit g = g_proj(x) at a unit-RMS input x."""
LIFT_BIAS_RATIO: Final = 8.0
CALIBRATION_LEN: Final = 32
CALIBRATION_SEED: Final = 0


def lfm3_kwargs(p: ModelPreset) -> dict[str, Any]:
    """Keyword arguments of `transformers.Lfm3Config` for preset `p` (see the module
    docstring)."""
    types: list[str] = []
    attention = 0
    for c in p.mixers[::-1]:
        if c == "*":
            types.append("sliding_attention" if attention % 2 == 0 else "full_attention")
            attention += 1
        else:
            types.append("conv")
    return {
        "vocab_size": p.vocab_size,
        "hidden_size": p.hidden_size,
        "intermediate_size": p.gated_intermediate_size,
        "num_hidden_layers": len(types),
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "head_dim": p.head_dim,
        "max_position_embeddings": p.max_position_embeddings,
        "initializer_range": 1.0 / math.sqrt(p.hidden_size),
        "layer_types": types,
        "sliding_window": WINDOWS.get(p.name, DEFAULT_WINDOW),
        "conv_L_cache": CONV_KERNEL,
        "conv_bias": True,  # zero, but the last layer's out_proj lifts the printable logits
        "tie_word_embeddings": False,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


def _draw_norms_and_gates(model: Any) -> None:
    """Every RMSNorm weight N(1, NORM_STD^2), every g_proj weight N(0, (GATE_STD^2 / D))."""
    d = model.config.hidden_size
    for module in model.modules():
        name = type(module).__name__
        if name.endswith("RMSNorm"):
            module.weight.normal_(1.0, NORM_STD)
        elif name.endswith("Attention") and getattr(module, "g_proj", None) is not None:
            module.g_proj.weight.normal_(0.0, GATE_STD / math.sqrt(d))


def _calibration_norms(model: Any, conv: Any) -> tuple[float, float]:
    """Medians over a calibration prompt's positions of the norms of `conv`'s output and
    of the final norm's input."""
    seen: list[torch.Tensor] = []
    hooks = [
        conv.out_proj.register_forward_hook(lambda _m, _a, out: seen.append(out.detach())),
        model.model.embedding_norm.register_forward_hook(
            lambda _m, args, _out: seen.append(args[0].detach())
        ),
    ]
    g = torch.Generator().manual_seed(CALIBRATION_SEED)
    prompt = torch.randint(BYTE_OFFSET, BYTE_VOCAB_SIZE, (1, CALIBRATION_LEN), generator=g)
    try:
        model(input_ids=prompt.to(model.device))
    finally:
        for hook in hooks:
            hook.remove()
    conv_out, final = (float(t[0].float().norm(dim=-1).median()) for t in seen)
    return conv_out, final


def lfm3_prepare(model: Any, channel: int, ratio: float) -> None:
    """Draw the norms and gates, then make the last layer write `ratio` times the final
    residual's median norm on `channel` (the geometry `factory._separate_logits` gives
    the LM head) and keep its feed-forward off it (see the module docstring); in place.
    ValueError when the last layer is not a short conv."""
    last = model.model.layers[-1]
    conv = getattr(last, "conv", None)
    if conv is None:
        raise ValueError("the last layer of an LFM3 preset must be a short conv")
    d = model.config.hidden_size
    with torch.no_grad():
        _draw_norms_and_gates(model)
        for module in model.modules():
            if type(module).__name__.endswith("ShortConv"):
                for part in (module.in_proj, module.conv, module.out_proj):
                    torch.nn.init.zeros_(part.bias)
        conv.out_proj.weight[channel, :] = 0.0
        conv_out, final = _calibration_norms(model, conv)
        conv.out_proj.bias[channel] = LIFT_BIAS_RATIO * conv_out
        keep = math.sqrt(1.0 + LIFT_BIAS_RATIO**2)
        post = last.post_operator_norm.weight
        post.mul_(keep)
        # the channel leaves the post norm at about w * sqrt(d) * R / sqrt(1 + R^2)
        post[channel] = ratio * final * keep / (LIFT_BIAS_RATIO * math.sqrt(d))
        ffn = last.ffn_norm.weight
        ffn.mul_(math.sqrt(1.0 + ratio**2))
        ffn[channel] = 0.0
        last.feed_forward.w2.weight[channel, :] = 0.0
        model.model.embedding_norm.weight[channel] = 1.0  # the factory's lift geometry
