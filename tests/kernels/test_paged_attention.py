"""Decode attention over a token-row table: the reference against per-sequence SDPA over
each sequence's own rows, and the Triton kernel (under TRITON_INTERPRET=1 without a GPU)
against the reference, with GQA, ragged lengths across block boundaries, shuffled and
shared rows, padding that points at live rows, and bad shapes."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled
from torch.nn.functional import scaled_dot_product_attention as sdpa

from marconi_kernels.paged_attention import paged_decode_attention_ref

TOL = 1e-5


def _inputs(B: int, H: int, KV: int, hd: int, lens: list[int], seed: int = 0):
    """q [B, H, hd], pools [KV, R, hd], a table whose rows are a shuffle of the pool (two
    sequences share their first rows, as a cache hit does) and whose padding points at
    live rows (row 0) that must be masked out."""
    g = torch.Generator().manual_seed(seed)
    rows = sum(lens) + 7
    q = torch.randn(B, H, hd, generator=g)
    k = torch.randn(KV, rows, hd, generator=g)
    v = torch.randn(KV, rows, hd, generator=g)
    perm = torch.randperm(rows, generator=g)
    width = max(lens) + 3
    table = torch.zeros(B, width, dtype=torch.long)
    off = 0
    for b, n in enumerate(lens):
        table[b, :n] = perm[off : off + n]
        off += n
    if B > 1 and min(lens[0], lens[1]) > 2:
        table[1, :2] = table[0, :2]  # a shared prefix: the same rows read by two rows
    return q, k, v, table, torch.tensor(lens)


def _per_sequence(q, k, v, table, lens, scale=None):
    out = []
    for b in range(q.shape[0]):
        rows = table[b, : int(lens[b])]
        o = sdpa(
            q[b, :, None][None],
            k[:, rows][None],
            v[:, rows][None],
            enable_gqa=q.shape[1] != k.shape[0],
            scale=scale,
        )
        out.append(o[0, :, 0])
    return torch.stack(out)


CASES = [(1, 2, 2, 8, [5]), (3, 8, 2, 16, [1, 33, 64]), (4, 6, 3, 12, [70, 2, 31, 32])]


@pytest.mark.parametrize(("B", "H", "KV", "hd", "lens"), CASES)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_ref_equals_per_sequence_attention(B, H, KV, hd, lens, scale):
    q, k, v, table, n = _inputs(B, H, KV, hd, lens)
    got = paged_decode_attention_ref(q, k, v, table, n, scale)
    assert_close_scaled(got, _per_sequence(q, k, v, table, n, scale), TOL)


def test_ref_ignores_padding_and_rows_of_others():
    q, k, v, table, n = _inputs(3, 4, 2, 8, [4, 9, 2])
    want = paged_decode_attention_ref(q, k, v, table, n)
    k2, v2 = k.clone(), v.clone()
    used = torch.cat([table[b, : int(n[b])] for b in range(3)]).unique()
    spare = torch.ones(k.shape[1], dtype=torch.bool)
    spare[used] = False
    k2[:, spare], v2[:, spare] = 1e4, -1e4
    table2 = table.clone()
    table2[0, 4:] = table[1, 0]  # padding pointing at another sequence's live row
    assert torch.equal(paged_decode_attention_ref(q, k2, v2, table2, n), want)


def test_ref_rejects_bad_shapes_naming_them():
    q, k, v, table, n = _inputs(2, 4, 2, 8, [3, 5])
    with pytest.raises(ValueError, match="multiple of KV"):
        paged_decode_attention_ref(q[:, :3], k, v, table, n)
    with pytest.raises(ValueError, match=r"table must be \[B, W\]"):
        paged_decode_attention_ref(q, k, v, table[:1], n)
    with pytest.raises(ValueError, match=r"one \[KV, R, hd\] shape"):
        paged_decode_attention_ref(q, k, v[:1], table, n)


@pytest.mark.triton
@pytest.mark.parametrize(("B", "H", "KV", "hd", "lens"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_ref(B, H, KV, hd, lens, dtype):
    from marconi_kernels.triton_paged_attention import paged_decode_attention_triton

    q, k, v, table, n = _inputs(B, H, KV, hd, lens, seed=3)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    got = paged_decode_attention_triton(q, k, v, table, n, 0.25)
    want = paged_decode_attention_ref(q.float(), k.float(), v.float(), table, n, 0.25)
    assert got.dtype == dtype
    assert_close_scaled(got.float(), want, TOL if dtype == torch.float32 else 1e-2)


@pytest.mark.triton
def test_triton_reads_pool_strides_and_rejects_bad_layouts():
    from marconi_kernels.triton_paged_attention import paged_decode_attention_triton

    q, k, v, table, n = _inputs(2, 4, 2, 8, [40, 3])
    wide = torch.randn(2, k.shape[1], 3, 8)  # a pool slice with a gap between heads
    wide[:, :, 1] = k
    got = paged_decode_attention_triton(q, wide[:, :, 1], v, table, n)
    assert_close_scaled(got, paged_decode_attention_ref(q, k, v, table, n), TOL)
    with pytest.raises(ValueError, match="contiguous in their last dim"):
        paged_decode_attention_triton(
            q, k.transpose(1, 2).contiguous().transpose(1, 2), v, table, n
        )
