"""The engine's MLA layer against transformers' `KimiLinearAttention` (NoPE latent
attention) on the same random weights: a prefill, then decode steps that multiply the
query into the cached latent (over a sequence's own buffer and over KV pool rows), a
resumed prefill over cached rows, q_lora_rank, and two shards summing to the layer."""

from __future__ import annotations

import pytest
import torch
from kimi_helpers import load_shard, randomize, tiny_config

from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.layers.mla import MLAttention
from marconi_ray.engine.model.model_config import MLAConfig
from marconi_ray.engine.model.paged_kv import BufferDecode, PagedDecode, PagedPrefill
from marconi_ray.engine.model.parallel import TPGroup

kl = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")

L, STEPS = 11, 3
TOL = 2e-5


def _layers(tp: TPGroup | None = None, **overrides):
    config = tiny_config(**overrides)
    ref = kl.KimiLinearAttention(config, 1).eval()
    weights = randomize(ref, seed=7)
    cfg = MLAConfig(
        config.num_attention_heads, config.kv_lora_rank, config.qk_nope_head_dim,
        config.qk_rope_head_dim, config.v_head_dim, config.q_lora_rank,
    )  # fmt: skip
    layer = MLAttention(config.hidden_size, cfg, "self_attn", tp or TPGroup(), torch.float32)
    load_shard(layer, weights, "self_attn", tp or TPGroup())
    return config, ref, layer


def _hf_run(ref, config, x):
    """transformers' layer over x [1, n, D]: a prefill of L tokens, then one at a time."""
    from transformers import DynamicCache
    from transformers.masking_utils import create_causal_mask

    cache = DynamicCache(config=config)
    outs = []
    with torch.no_grad():
        for a, b in [(0, L), *((t, t + 1) for t in range(L, x.shape[1]))]:
            pos = torch.arange(a, b)[None]
            mask = create_causal_mask(
                config=config, inputs_embeds=x[:, a:b], attention_mask=None, cache=cache,
                position_ids=pos,
            )  # fmt: skip
            outs.append(ref(x[:, a:b], attention_mask=mask, cache=cache)[0])
    return torch.cat(outs, dim=1)[0]


@pytest.mark.parametrize("q_lora_rank", [None, 10])
def test_prefill_and_absorbed_decode_equal_transformers(q_lora_rank):
    config, ref, layer = _layers(q_lora_rank=q_lora_rank)
    x = torch.randn(1, L + STEPS, config.hidden_size, generator=torch.Generator().manual_seed(1))
    want = _hf_run(ref, config, x)
    buf = layer.empty_cache(torch.device("cpu"))
    pos = torch.arange(L)
    torch.testing.assert_close(layer.prefill(x[0, :L], pos, buf), want[:L], atol=TOL, rtol=0)
    assert buf.k.shape[0] == 1 and buf.length == L
    for t in range(L, L + STEPS):
        out = layer.decode(x[0, t : t + 1], pos[:1], BufferDecode([buf]))
        torch.testing.assert_close(out[0], want[t], atol=TOL, rtol=0)


def test_pool_rows_hold_only_latent_and_key_part():
    """On pool rows: each token's row is [norm(latent) | k_rope] split over k and v (no
    expanded keys or values); a resumed prefill and a paged decode step over those rows
    equal transformers."""
    config, ref, layer = _layers()
    w = config.kv_lora_rank + config.qk_rope_head_dim
    assert layer.kv_shape == (1, w // 2)
    x = torch.randn(1, L + 1, config.hidden_size, generator=torch.Generator().manual_seed(4))
    want = _hf_run(ref, config, x)
    k_pool, v_pool = torch.zeros(1, 40, w // 2), torch.zeros(1, 40, w // 2)
    rows = torch.arange(3, 3 + L + 1) * 2  # scattered rows
    first = PagedPrefill(k_pool, v_pool, rows[:0], rows[:5])
    layer.prefill(x[0, :5], torch.arange(5), first)
    rest = PagedPrefill(k_pool, v_pool, rows[:5], rows[5:L])  # resumed over cached rows
    torch.testing.assert_close(
        layer.prefill(x[0, 5:L], torch.arange(5, L), rest), want[5:L], atol=TOL, rtol=0
    )
    latent = torch.cat([k_pool[0, rows[:L]], v_pool[0, rows[:L]]], dim=-1)
    with torch.no_grad():
        ckv = ref.kv_a_proj_with_mqa(x[0, :L])
        expect = torch.cat([ref.kv_a_layernorm(ckv[:, :12]), ckv[:, 12:]], dim=-1)
    torch.testing.assert_close(latent, expect, atol=1e-6, rtol=0)
    table = torch.cat([rows, torch.zeros(3, dtype=torch.long)])[None]  # padded
    step = PagedDecode(k_pool, v_pool, table, torch.tensor([L + 1]), rows[L:], lambda *a: None)
    out = layer.decode(x[0, L:], torch.tensor([L]), step)
    torch.testing.assert_close(out[0], want[L], atol=TOL, rtol=0)


def test_two_shards_sum_to_the_whole_layer():
    config, _, whole = _layers()
    x = torch.randn(9, config.hidden_size, generator=torch.Generator().manual_seed(3))
    pos = torch.arange(9)
    want = whole.prefill(x, pos, whole.empty_cache(torch.device("cpu")))
    step_want = whole.decode(
        x[:1], pos[:1], BufferDecode([KVBuffer.empty(1, 8, torch.float32, torch.device("cpu"))])
    )
    total, step_total = torch.zeros_like(want), torch.zeros_like(step_want)
    for rank in range(2):
        _, _, shard = _layers(TPGroup(rank, 2))
        shard.o_proj.tp = TPGroup()  # the partial product, all-reduced here by the sum
        assert shard.heads == 2
        total += shard.prefill(x, pos, shard.empty_cache(torch.device("cpu")))
        buf = KVBuffer.empty(1, 8, torch.float32, torch.device("cpu"))
        step_total += shard.decode(x[:1], pos[:1], BufferDecode([buf]))
    torch.testing.assert_close(total, want, atol=TOL, rtol=0)
    torch.testing.assert_close(step_total, step_want, atol=TOL, rtol=0)


def test_decode_never_expands_the_latent():
    """A decode step multiplies the query into the latent: `kv_b_proj` (the expansion to
    per-head keys and values) is never run on cached rows, only its weight is read."""
    config, _, layer = _layers()
    x = torch.randn(6, config.hidden_size, generator=torch.Generator().manual_seed(8))
    buf = layer.empty_cache(torch.device("cpu"))
    layer.prefill(x[:5], torch.arange(5), buf)
    calls = []
    layer.kv_b_proj.register_forward_hook(lambda *_: calls.append(1))
    layer.decode(x[5:], torch.tensor([5]), BufferDecode([buf]))
    assert calls == [] and buf.length == 6
    layer.prefill(x[:2], torch.arange(2), layer.empty_cache(torch.device("cpu")))
    assert calls == [1]  # a prefill expands
