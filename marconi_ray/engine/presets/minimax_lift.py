"""How `factory.make_model` lifts a MiniMax model's printable logits: MiniMax has no bias
to write a constant channel with, so the embedding table writes it.

Column `LIFT_CHANNEL` of every embedding row is set to `LIFT_RATIO` times the median
norm of the rows; every projection that reads the residual stream (q/k/v, qkv_proj,
output_gate, the router, the experts' gate and up) has a zero column there and every
one that writes it (o_proj, out_proj, the experts' down) a zero row, so no mixer sees or
changes the channel; the decoder norms (all of them RMSNorms read by the mixers, and
with MiniMax's post-norm layers also the next residual) have the scale
`sqrt(1 + LIFT_RATIO**2)` on every channel, which gives the mixers their usual
unit-RMS input and carries the channel on at about `LIFT_RATIO` times the others' norm.
At the final norm (weights 1) the channel is about `sqrt(hidden) * R / sqrt(1 + R**2)`,
the geometry `factory._separate_logits` sets the printable rows of the LM head for.
"""

from __future__ import annotations

import math
from typing import Any

import torch

READERS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "output_gate")
"""Attention and lightning projections that read the (normed) residual stream."""
WRITERS = ("o_proj", "out_proj")
"""Attention and lightning projections that write the residual stream."""


def lift_through_embedding(model: Any, channel: int, ratio: float) -> None:
    """Write the lift channel into the embedding table of a MiniMax causal LM and hide it
    from every mixer (see the module docstring); in place, no RNG draw."""
    decoder = model.model
    scale = math.sqrt(1.0 + ratio**2)
    with torch.no_grad():
        for layer in decoder.layers:
            for name in READERS:
                proj = getattr(layer.self_attn, name, None)
                if proj is not None:
                    proj.weight[:, channel] = 0.0
            for name in WRITERS:
                proj = getattr(layer.self_attn, name, None)
                if proj is not None:
                    proj.weight[channel, :] = 0.0
            moe = layer.mlp
            moe.gate.weight[:, channel] = 0.0
            moe.experts.gate_up_proj[:, :, channel] = 0.0
            moe.experts.down_proj[:, channel, :] = 0.0
            layer.input_layernorm.weight.fill_(scale)
            layer.post_attention_layernorm.weight.fill_(scale)
        embed = decoder.embed_tokens.weight
        others = torch.cat([embed[:, :channel], embed[:, channel + 1 :]], dim=1)
        embed[:, channel] = ratio * others.float().norm(dim=-1).median().to(embed.dtype)
