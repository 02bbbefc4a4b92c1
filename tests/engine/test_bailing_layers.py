"""The engine's KDA and MLA layers in Ling's variant against transformers'
`BailingHybridDeltaAttention` (full-rank gates, the safe gate's lower bound) and
`BailingHybridAttention` (interleaved RoPE on the shared key part, the per-head output
gate) on the same random weights, larger than an init's so every piece shows: a prefill,
then decode steps (MLA's query multiplied into the rotated latent), and MLA resumed over
pool rows at later positions."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from kimi_helpers import load_shard, randomize

from marconi_kernels import get_kernels
from marconi_ray.engine.model.layers.kda import KDAMixer
from marconi_ray.engine.model.layers.mla import MLAttention
from marconi_ray.engine.model.model_config import KDAConfig, MLAConfig
from marconi_ray.engine.model.paged_kv import BufferDecode, PagedDecode, PagedPrefill
from marconi_ray.engine.model.parallel import TPGroup

bh = pytest.importorskip("transformers.models.bailing_hybrid.modeling_bailing_hybrid")

L, STEPS = 23, 3
TOL = 2e-5
THETA = 50.0
"""A small RoPE base: over 26 positions the rotated channels turn through whole cycles."""


def _config(**overrides: Any) -> Any:
    from transformers import BailingHybridConfig

    kw: dict[str, Any] = {
        "vocab_size": 128, "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "head_dim": 8, "kv_lora_rank": 12, "qk_rope_head_dim": 4,
        "qk_nope_head_dim": 6, "v_head_dim": 5, "short_conv_kernel_size": 4,
        "layer_group_size": 2, "num_local_experts": 4, "num_experts_per_tok": 2,
        "n_group": 2, "topk_group": 1, "num_mtp_layers": 0, "pad_token_id": 0,
        "eos_token_id": 2, "rope_parameters": {"rope_type": "default", "rope_theta": THETA},
    }  # fmt: skip
    kw.update(overrides)
    config = BailingHybridConfig(**kw)
    config._attn_implementation = "eager"
    return config


def _mla(q_lora_rank: int | None = None):
    config = _config(q_lora_rank=q_lora_rank)
    ref = bh.BailingHybridAttention(config, 1).eval()
    weights = randomize(ref, seed=7)
    cfg = MLAConfig(4, 12, 6, 4, 5, q_lora_rank, rope_theta=THETA, head_gate=True)
    layer = MLAttention(config.hidden_size, cfg, "self_attn", TPGroup(), torch.float32)
    load_shard(layer, weights, "self_attn", TPGroup())
    return config, ref, layer


def _mla_hf(ref: Any, config: Any, x: torch.Tensor) -> torch.Tensor:
    """transformers' MLA over x [1, n, D]: a prefill of L tokens, then one at a time."""
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    rotary = bh.BailingHybridRotaryEmbedding(config)
    cache = DynamicCache(config=config)
    outs = []
    with torch.no_grad():
        for a, b in [(0, L), *((t, t + 1) for t in range(L, x.shape[1]))]:
            pos = torch.arange(a, b)[None]
            mask = create_causal_mask(
                config=config, inputs_embeds=x[:, a:b], attention_mask=None, cache=cache,
                position_ids=pos,
            )  # fmt: skip
            emb = rotary(x[:, a:b], pos)
            outs.append(ref(x[:, a:b], emb, attention_mask=mask, cache=cache)[0])
    return torch.cat(outs, dim=1)[0]


@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_mla_prefill_and_absorbed_decode_equal_transformers(q_lora_rank):
    """Ling 3.0's released configs use a query low rank (256); the class default none."""
    config, ref, layer = _mla(q_lora_rank)
    x = torch.randn(1, L + STEPS, config.hidden_size, generator=torch.Generator().manual_seed(1))
    want = _mla_hf(ref, config, x)
    buf = layer.empty_cache(torch.device("cpu"))
    torch.testing.assert_close(
        layer.prefill(x[0, :L], torch.arange(L), buf), want[:L], atol=TOL, rtol=0
    )
    for t in range(L, L + STEPS):
        out = layer.decode(x[0, t : t + 1], torch.tensor([t]), BufferDecode([buf]))
        torch.testing.assert_close(out[0], want[t], atol=TOL, rtol=0)

    def moved(layer: MLAttention) -> float:
        buf = layer.empty_cache(torch.device("cpu"))
        return (layer.prefill(x[0, :L], torch.arange(L), buf) - want[:L]).abs().max().item()

    # without the rotation, or without the gate, the layer is far from transformers'
    no_rope, no_gate = _mla(q_lora_rank)[2], _mla(q_lora_rank)[2]
    no_rope.rope, no_gate.g_proj = None, None
    assert min(moved(no_rope), moved(no_gate)) > 1e-2


def test_mla_pool_rows_resumed_at_later_positions():
    """Rows cached rotated at their positions: a prefill resumed at position 5 over pool
    rows, then a paged decode step, equal transformers."""
    config, ref, layer = _mla()
    w = 12 + 4
    x = torch.randn(1, L + 1, config.hidden_size, generator=torch.Generator().manual_seed(4))
    want = _mla_hf(ref, config, x)
    k_pool, v_pool = torch.zeros(1, 60, w // 2), torch.zeros(1, 60, w // 2)
    rows = torch.arange(3, 3 + L + 1) * 2
    layer.prefill(x[0, :5], torch.arange(5), PagedPrefill(k_pool, v_pool, rows[:0], rows[:5]))
    rest = PagedPrefill(k_pool, v_pool, rows[:5], rows[5:L])
    got = layer.prefill(x[0, 5:L], torch.arange(5, L), rest)
    torch.testing.assert_close(got, want[5:L], atol=TOL, rtol=0)
    table = rows[None]
    step = PagedDecode(k_pool, v_pool, table, torch.tensor([L + 1]), rows[L:], lambda *a: None)
    out = layer.decode(x[0, L:], torch.tensor([L]), step)
    torch.testing.assert_close(out[0], want[L], atol=TOL, rtol=0)


@pytest.mark.parametrize("safe", [True, False])
def test_kda_prefill_and_decode_equal_transformers(safe):
    """The safe gate (lower bound -5) and, with `kda_safe_gate` off, Kimi's softplus gate
    through Ling's full-rank projections."""
    from transformers import DynamicCache

    config = _config(kda_safe_gate=safe)
    ref = bh.BailingHybridDeltaAttention(config, 0).eval()
    weights = randomize(ref, seed=5)
    cfg = KDAConfig(4, 8, 4, chunk_size=16, low_rank_gates=False,
                    gate_lower_bound=-5.0 if safe else None)  # fmt: skip
    mixer = KDAMixer(32, cfg, config.rms_norm_eps, "self_attn", TPGroup(), torch.float32,
                     get_kernels("cpu", "ref"))  # fmt: skip
    load_shard(mixer, weights, "self_attn", TPGroup())
    x = torch.randn(1, L + STEPS, 32, generator=torch.Generator().manual_seed(1))
    cache = DynamicCache(config=config)
    with torch.no_grad():
        outs = [ref(x[:, :L], cache=cache)]
        outs += [ref(x[:, t : t + 1], cache=cache) for t in range(L, L + STEPS)]
    want = torch.cat(outs, dim=1)[0]
    y, conv, ssm, _, _ = mixer.prefill(x[0, :L], None, None)
    torch.testing.assert_close(y, want[:L], atol=TOL, rtol=0)
    conv, ssm = conv[None].clone(), ssm[None].clone()
    for t in range(L, L + STEPS):
        out = mixer.decode(x[0, t : t + 1], conv, ssm)
        torch.testing.assert_close(out[0], want[t], atol=TOL, rtol=0)
