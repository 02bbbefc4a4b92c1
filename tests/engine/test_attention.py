"""Causal attention of a resumed prefill: equal to the explicit offset mask, and never
built from an Lq x Lk boolean mask (on GPU that falls back to the math kernel)."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F
from torch.nn.attention.bias import CausalBias

from marconi_ray.engine.model.layers import attention
from marconi_ray.engine.model.layers.attention import causal_attention


def _masked(q, k, v):
    n_q, n_k = q.shape[1], k.shape[1]
    group = q.shape[0] // k.shape[0]
    mask = torch.arange(n_k)[None, :] <= torch.arange(n_q)[:, None] + (n_k - n_q)
    k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)[0]


@pytest.mark.parametrize(
    ("heads", "kv_heads", "n_q", "n_k"),
    [(4, 2, 5, 12), (4, 4, 5, 12), (4, 1, 1, 9), (2, 2, 7, 7), (4, 2, 7, 7), (6, 3, 30, 31)],
)
def test_causal_attention_equals_offset_mask(heads, kv_heads, n_q, n_k):
    g = torch.Generator().manual_seed(n_q * n_k)
    q = torch.randn(heads, n_q, 8, generator=g)
    k, v = (torch.randn(kv_heads, n_k, 8, generator=g) for _ in range(2))
    torch.testing.assert_close(causal_attention(q, k, v), _masked(q, k, v), atol=1e-6, rtol=0)


def test_resumed_prefill_passes_no_dense_mask(monkeypatch):
    seen = []
    real = attention.sdpa

    def spy(*args, **kwargs):
        seen.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    monkeypatch.setattr(attention, "sdpa", spy)
    causal_attention(torch.randn(4, 6, 8), torch.randn(2, 20, 8), torch.randn(2, 20, 8))
    assert len(seen) == 1 and isinstance(seen[0], CausalBias)
    seen.clear()
    causal_attention(torch.randn(4, 6, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8))
    assert seen == [None]
