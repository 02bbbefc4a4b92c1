"""Sliding-window attention in the decode and varlen prefill attention kernels: with
`window` W a query at position p sees the keys at positions p - W < k <= p (W keys,
itself included). The references against a naive softmax over exactly those keys (the
window larger than, equal to, one past and far below the sequence), no window equal to
the plain call, and the Triton kernels (TRITON_INTERPRET=1 without a GPU) against the
references across key tiles; a bad window is named."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.paged_attention import paged_decode_attention_ref
from marconi_kernels.paged_prefill import paged_prefill_attention_ref

TOL = 1e-5


def _pool(KV: int, hd: int, rows: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(KV, rows, hd, generator=g)
    v = torch.randn(KV, rows, hd, generator=g)
    return k, v, torch.randperm(rows, generator=g), g


def _naive(q, keys, values, positions, window):
    """q [n, H, hd] at `positions` over keys/values [KV, L, hd] (positions 0..L-1)."""
    n_heads, n_kv = q.shape[1], keys.shape[0]
    group = n_heads // n_kv
    out = torch.empty_like(q)
    for i, p in enumerate(positions):
        lo = 0 if window is None else max(0, p - window + 1)
        for h in range(n_heads):
            k = keys[h // group, lo : p + 1]
            w = torch.softmax((k @ q[i, h]) * q.shape[-1] ** -0.5, dim=0)
            out[i, h] = w @ values[h // group, lo : p + 1]
    return out


def _decode_inputs(lens: list[int], H=4, KV=2, hd=8, seed=0):
    k, v, perm, g = _pool(KV, hd, sum(lens) + 3, seed)
    table = torch.zeros(len(lens), max(lens) + 2, dtype=torch.long)
    off = 0
    for b, n in enumerate(lens):
        table[b, :n] = perm[off : off + n]
        off += n
    q = torch.randn(len(lens), H, hd, generator=g)
    return q, k, v, table, torch.tensor(lens)


def _prefill_inputs(parts: list[tuple[int, int]], H=4, KV=2, hd=8, seed=0):
    lens = [p + n for p, n in parts]
    k, v, perm, g = _pool(KV, hd, sum(lens) + 3, seed)
    table = torch.zeros(len(parts), max(lens) + 2, dtype=torch.long)
    off = 0
    for s, n in enumerate(lens):
        table[s, :n] = perm[off : off + n]
        off += n
    total = sum(n for _, n in parts)
    q = torch.randn(total, H, hd, generator=g)
    cu = torch.tensor([0] + [sum(n for _, n in parts[: s + 1]) for s in range(len(parts))])
    return q, k, v, table, cu, torch.tensor(lens), max(n for _, n in parts)


LENS = [1, 5, 16, 17, 40]
WINDOWS = [1, 4, 16, 17, 100]


@pytest.mark.parametrize("window", WINDOWS)
def test_decode_ref_sees_the_last_window_positions(window):
    q, k, v, table, lens = _decode_inputs(LENS)
    out = paged_decode_attention_ref(q, k, v, table, lens, window=window)
    for b, n in enumerate(LENS):
        rows = table[b, :n]
        want = _naive(q[b : b + 1], k[:, rows], v[:, rows], [n - 1], window)
        assert_close_scaled(out[b : b + 1], want, TOL)


PARTS = [(0, 20), (7, 1), (30, 9), (3, 33)]


@pytest.mark.parametrize("window", WINDOWS)
def test_prefill_ref_sees_the_last_window_positions(window):
    q, k, v, table, cu, lens, max_q = _prefill_inputs(PARTS)
    out = paged_prefill_attention_ref(q, k, v, table, cu, lens, max_q, window=window)
    for s, (past, new) in enumerate(PARTS):
        rows = table[s, : past + new]
        a, b = int(cu[s]), int(cu[s + 1])
        want = _naive(q[a:b], k[:, rows], v[:, rows], list(range(past, past + new)), window)
        assert_close_scaled(out[a:b], want, TOL)


def test_no_window_is_the_plain_call_and_a_bad_window_is_named():
    q, k, v, table, lens = _decode_inputs(LENS)
    assert torch.equal(
        paged_decode_attention_ref(q, k, v, table, lens, window=None),
        paged_decode_attention_ref(q, k, v, table, lens),
    )
    with pytest.raises(ValueError, match="window"):
        paged_decode_attention_ref(q, k, v, table, lens, window=0)
    p = _prefill_inputs(PARTS)
    with pytest.raises(ValueError, match="window"):
        paged_prefill_attention_ref(*p, window=-3)


@pytest.mark.triton
@pytest.mark.parametrize("window", [1, 16, 33])
def test_triton_decode_matches_ref(window):
    from marconi_kernels.triton_paged_attention import paged_decode_attention_triton

    q, k, v, table, lens = _decode_inputs([1, 17, 40, 70], seed=2)
    want = paged_decode_attention_ref(q, k, v, table, lens, window=window)
    got = paged_decode_attention_triton(q, k, v, table, lens, window=window)
    assert_close_scaled(got, want, TOL)


@pytest.mark.triton
@pytest.mark.parametrize("window", [1, 16, 33])
def test_triton_prefill_matches_ref(window):
    from marconi_kernels.triton_paged_prefill import paged_prefill_attention_triton

    p = _prefill_inputs([(0, 20), (7, 1), (45, 18)], seed=3)
    want = paged_prefill_attention_ref(*p, window=window)
    got = paged_prefill_attention_triton(*p, window=window)
    assert_close_scaled(got, want, TOL)
