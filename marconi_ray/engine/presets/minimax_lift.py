"""How `factory.make_model` prepares a random MiniMax model: its printable logits are
lifted through the embedding table (MiniMax has no bias to write a constant channel
with), and every block's write to the residual stream is scaled to a fixed share of it.

The lift: column `LIFT_CHANNEL` of every embedding row is set to `LIFT_RATIO` times the
median norm of the rows; every projection that reads the residual stream (q/k/v,
qkv_proj, output_gate, the router, the experts' gate and up) has a zero column there and
every one that writes it (o_proj, out_proj, the experts' down) a zero row, so no mixer
sees or changes the channel; the decoder norms (all of them RMSNorms read by the mixers,
and with MiniMax's post-norm layers also the next residual) have the scale
`sqrt(1 + LIFT_RATIO**2)` on every channel, which gives the mixers their usual unit-RMS
input and carries the channel on at about `LIFT_RATIO` times the others' norm. At the
final norm (weights 1) the channel is about `sqrt(hidden) * R / sqrt(1 + R**2)`, the
geometry `factory._separate_logits` sets the printable rows of the LM head for.

The writes: MiniMax's residual is the normed input itself (unit RMS), and with the usual
0.02 init a mixer writes a few percent of that and the experts about 0.1%, so the tokens
would hardly depend on them (a broken attention or MoE would still give transformers'
tokens). `balance_writes` measures each layer's attention (softmax or lightning) and MoE
output RMS on a calibration prompt and scales its output projection (o_proj / out_proj,
the experts' down_proj) so that it is `WRITE_RMS` (one pass: later layers' inputs move a
little, so the results land near it).
"""

from __future__ import annotations

import math
from typing import Any, Final

import torch

from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET, BYTE_VOCAB_SIZE

READERS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "output_gate")
"""Attention and lightning projections that read the (normed) residual stream."""
WRITERS = ("o_proj", "out_proj")
"""Attention and lightning projections that write the residual stream."""
WRITE_RMS: Final = 0.25
"""Each block's output RMS after `balance_writes`, against the unit-RMS residual."""
CALIBRATION_LEN: Final = 32
CALIBRATION_SEED: Final = 0


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


def _output_rms(model: Any) -> dict[tuple[int, str], float]:
    """(layer, "attn" / "mlp") -> the RMS of that block's output on the calibration
    prompt (random byte ids from a fixed seed)."""
    seen: dict[tuple[int, str], float] = {}
    hooks = []
    for i, layer in enumerate(model.model.layers):
        for name, module in (("attn", layer.self_attn), ("mlp", layer.mlp)):

            def hook(_m: Any, _args: Any, out: Any, key: tuple[int, str] = (i, name)) -> None:
                out = out[0] if isinstance(out, tuple) else out
                seen[key] = float(out.detach().float().pow(2).mean().sqrt())

            hooks.append(module.register_forward_hook(hook))
    g = torch.Generator().manual_seed(CALIBRATION_SEED)
    prompt = torch.randint(BYTE_OFFSET, BYTE_VOCAB_SIZE, (1, CALIBRATION_LEN), generator=g)
    try:
        with torch.no_grad():
            model(input_ids=prompt.to(model.device))
    finally:
        for h in hooks:
            h.remove()
    return seen


def balance_writes(model: Any, target: float = WRITE_RMS) -> None:
    """Scale each layer's attention output projection and its experts' down projections
    so that the block writes `target` RMS (see the module docstring); in place."""
    seen = _output_rms(model)
    with torch.no_grad():
        for i, layer in enumerate(model.model.layers):
            attn = layer.self_attn
            out = attn.o_proj if hasattr(attn, "o_proj") else attn.out_proj
            out.weight.mul_(target / seen[(i, "attn")])
            layer.mlp.experts.down_proj.mul_(target / seen[(i, "mlp")])
