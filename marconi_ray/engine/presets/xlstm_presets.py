"""Preset configs of xLSTM (`xlstm`: NX-AI/xLSTM-7b's architecture in small), and how
`factory.make_model` prepares its random weights.

One xLSTM block (an mLSTM layer, then the gated SiLU feed-forward) per mixer of the
preset's pattern (`ModelPreset.mixers`: tiny 5, small 8), `XLSTM_HEADS` heads, the
released model's factors (qk 0.5, v 1.0, feed-forward 2.667 rounded to 64). The width is
the preset's hidden size rounded up to `WIDTH_MULTIPLE` (tiny: 128): transformers' cache
takes its head sizes from the config's widths rounded up to 64 while the layers use them
unrounded, so both must agree. transformers' own chunk is the preset's (tiny 16), unlike
the engine's 64, so the tests also show the result does not depend on it.
`PRESET_SOFT_CAP` replaces transformers' logit cap of 30, which would squash the lifted
printable logits (~44) below the factory's spread and stray-probability checks; the cap
still applies (tanh is not linear there).

The weights: transformers' init zeroes every weight named "gate" (the input, forget and
output gates, and the feed-forward's `proj_up_gate`, which would silence the
feed-forward), so `prepare_xlstm` redraws them from the seeded RNG: the input gate wide
enough that its soft cap bends (`GATE_STD`), the forget gate around
transformers' biases (`FORGET_STD`), the output gate and `proj_up_gate` like the other
projections. Each block's write is then scaled to `WRITE_SHARE` of the embeddings' RMS
(transformers' small embeddings would otherwise drown the lift channel below). xLSTM has
no bias anywhere, so the printable logits are lifted through the embedding table, the
channel hidden from every projection that reads or writes the residual stream and the
block norms scaled to give the layers their usual unit-RMS input (as MiniMax's presets
do: `minimax_lift`).

Exact parameter counts (from `factory.count_parameters`, meta device):

| preset          | xlstm         |
|-----------------|---------------|
| tiny            | 1,203,240     |
| small           | 32,693,840    |
| paper-7b-shape  | 5,907,894,496 |
"""

from __future__ import annotations

import math
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

XLSTM_HEADS: Final = 4
WIDTH_MULTIPLE: Final = 128
PRESET_SOFT_CAP: Final = 200.0
GATE_STD: Final = 2.0
"""Std of the input gate preactivations' weights times sqrt(hidden): with their N(0, 1)
biases the preactivations spread over about +-6, where the soft cap (15) takes ~5% off.
Wider ones (4) left the tiny model's float32 logits ~1e-3 from float64 (measured), above
the 1e-4 the resume checks allow: the mLSTM is then ill-conditioned in float32."""
FORGET_STD: Final = 1.0
"""Std of the forget gate preactivations' weights times sqrt(hidden), around
transformers' biases (3 to 6 over the heads): the memory fades over tens to hundreds of
tokens."""
READERS: Final = ("q", "k", "v", "ogate_preact", "igate_preact", "fgate_preact")
"""mLSTM projections that read the (normed) residual stream."""
WRITE_SHARE: Final = 0.25
"""Each block's output RMS after `_balance_writes`, against the embeddings' RMS."""
CALIBRATION_LEN: Final = 32
CALIBRATION_SEED: Final = 0


def xlstm_kwargs(p: ModelPreset) -> dict[str, Any]:
    """Keyword arguments of `transformers.xLSTMConfig` for preset `p` (see the module
    docstring)."""
    return {
        "vocab_size": p.vocab_size,
        "hidden_size": math.ceil(p.hidden_size / WIDTH_MULTIPLE) * WIDTH_MULTIPLE,
        "num_hidden_layers": len(p.mixers),
        "num_heads": XLSTM_HEADS,
        "chunk_size": p.chunk_size,
        "output_logit_soft_cap": PRESET_SOFT_CAP,
        "tie_word_embeddings": False,
        "max_position_embeddings": p.max_position_embeddings,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


def _redraw_gates(model: Any) -> None:
    """Draw the weights transformers' init zeroes (see the module docstring) from the
    seeded RNG; in place."""
    d = model.config.hidden_size
    for block in model.backbone.blocks:
        layer = block.mlstm_layer
        layer.igate_preact.weight.normal_(0.0, GATE_STD / math.sqrt(d))
        layer.igate_preact.bias.normal_(0.0, 1.0)
        layer.fgate_preact.weight.normal_(0.0, FORGET_STD / math.sqrt(d))
        layer.ogate_preact.weight.normal_(0.0, math.sqrt(2 / (5 * d)))
        block.ffn.proj_up_gate.weight.normal_(0.0, math.sqrt(2 / (5 * d)))


def _balance_writes(model: Any, channel: int) -> None:
    """Scale each block's output projections (the mLSTM's `out_proj`, the feed-forward's
    `proj_down`) so that it writes `WRITE_SHARE` times the embeddings' RMS on a
    calibration prompt (one pass: later blocks' inputs move a little, so the results land
    near it); in place."""
    seen: dict[tuple[int, str], float] = {}
    hooks = []
    for i, block in enumerate(model.backbone.blocks):
        for name, module in (("mlstm", block.mlstm_layer), ("ffn", block.ffn)):

            def hook(_m: Any, _args: Any, out: Any, key: tuple[int, str] = (i, name)) -> None:
                out = out[0] if isinstance(out, tuple) else out
                seen[key] = float(out.detach().float().pow(2).mean().sqrt())

            hooks.append(module.register_forward_hook(hook))
    g = torch.Generator().manual_seed(CALIBRATION_SEED)
    prompt = torch.randint(BYTE_OFFSET, BYTE_VOCAB_SIZE, (1, CALIBRATION_LEN), generator=g)
    try:
        model(input_ids=prompt.to(model.device))
    finally:
        for h in hooks:
            h.remove()
    embed = model.backbone.embeddings.weight
    others = torch.cat([embed[:, :channel], embed[:, channel + 1 :]], dim=1)
    target = WRITE_SHARE * float(others.float().pow(2).mean().sqrt())
    for i, block in enumerate(model.backbone.blocks):
        block.mlstm_layer.out_proj.weight.mul_(target / seen[(i, "mlstm")])
        block.ffn.proj_down.weight.mul_(target / seen[(i, "ffn")])


def prepare_xlstm(model: Any, channel: int, ratio: float) -> None:
    """Redraw the zeroed gates, balance the blocks' writes, then write the lift channel
    into the embedding table and hide it from every layer (see the module docstring); in
    place."""
    scale = math.sqrt(1.0 + ratio**2)
    with torch.no_grad():
        _redraw_gates(model)
        _balance_writes(model, channel)
        for block in model.backbone.blocks:
            layer = block.mlstm_layer
            for name in READERS:
                getattr(layer, name).weight[:, channel] = 0.0
            layer.out_proj.weight[channel, :] = 0.0
            block.ffn.proj_up_gate.weight[:, channel] = 0.0
            block.ffn.proj_up.weight[:, channel] = 0.0
            block.ffn.proj_down.weight[channel, :] = 0.0
            block.norm_mlstm.weight.fill_(scale)
            block.norm_ffn.weight.fill_(scale)
        embed = model.backbone.embeddings.weight
        others = torch.cat([embed[:, :channel], embed[:, channel + 1 :]], dim=1)
        embed[:, channel] = ratio * others.float().norm(dim=-1).median().to(embed.dtype)
