"""Prefill attention of several packed sequences over a token-row table: the reference
against each sequence's own causal attention over its rows (a fresh prefill, one resumed
after cached rows, a one-token part), and the Triton kernel (under TRITON_INTERPRET=1
without a GPU) against the reference, with GQA, ragged lengths across tile boundaries,
shared and shuffled rows, padding that points at live rows, and bad shapes."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.paged_prefill import paged_prefill_attention_ref
from marconi_ray.engine.model.layers.attention import causal_attention

TOL = 1e-5


def _inputs(H: int, KV: int, hd: int, parts: list[tuple[int, int]], seed: int = 0):
    """parts: (past, new) per sequence. Returns q [T, H, hd], pools [KV, R, hd], a table of
    shuffled pool rows (the first two sequences share their first past rows, as two hits
    on one cached prefix do; padding points at row 0, a live row), cu_q, lens, max_q."""
    g = torch.Generator().manual_seed(seed)
    lens = [p + n for p, n in parts]
    rows = sum(lens) + 5
    total = sum(n for _, n in parts)
    q = torch.randn(total, H, hd, generator=g)
    k = torch.randn(KV, rows, hd, generator=g)
    v = torch.randn(KV, rows, hd, generator=g)
    perm = torch.randperm(rows, generator=g)
    table = torch.zeros(len(parts), max(lens) + 2, dtype=torch.long)
    off = 0
    for s, n in enumerate(lens):
        table[s, :n] = perm[off : off + n]
        off += n
    if len(parts) > 1 and min(parts[0][0], parts[1][0]) > 2:
        table[1, :2] = table[0, :2]
    cu = torch.tensor([0] + [sum(n for _, n in parts[: s + 1]) for s in range(len(parts))])
    return q, k, v, table, cu, torch.tensor(lens), max(n for _, n in parts)


def _per_sequence(q, k, v, table, cu, lens, scale=None):
    out = []
    for s in range(table.shape[0]):
        rows = table[s, : int(lens[s])]
        qs = q[int(cu[s]) : int(cu[s + 1])].transpose(0, 1)
        out.append(causal_attention(qs, k[:, rows], v[:, rows], scale).transpose(0, 1))
    return torch.cat(out)


CASES = [
    (2, 2, 8, [(0, 5)]),
    (8, 2, 16, [(0, 33), (7, 1), (20, 17)]),
    (6, 3, 12, [(40, 16), (0, 2), (3, 31), (0, 32)]),
]


@pytest.mark.parametrize(("H", "KV", "hd", "parts"), CASES)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_ref_equals_each_sequence_alone(H, KV, hd, parts, scale):
    q, k, v, table, cu, lens, max_q = _inputs(H, KV, hd, parts)
    got = paged_prefill_attention_ref(q, k, v, table, cu, lens, max_q, scale)
    assert_close_scaled(got, _per_sequence(q, k, v, table, cu, lens, scale), TOL)


def test_ref_reads_only_each_sequences_rows():
    q, k, v, table, cu, lens, max_q = _inputs(4, 2, 8, [(4, 3), (0, 9), (2, 2)])
    want = paged_prefill_attention_ref(q, k, v, table, cu, lens, max_q)
    used = torch.cat([table[s, : int(lens[s])] for s in range(3)]).unique()
    spare = torch.ones(k.shape[1], dtype=torch.bool)
    spare[used] = False
    k2, v2 = k.clone(), v.clone()
    k2[:, spare], v2[:, spare] = 1e4, -1e4
    table2 = table.clone()
    table2[0, 7:] = table[1, 0]  # padding pointing at another sequence's live row
    assert torch.equal(paged_prefill_attention_ref(q, k2, v2, table2, cu, lens, max_q), want)
    wider = paged_prefill_attention_ref(q, k2, v2, table2, cu, lens, max_q + 3)
    assert_close_scaled(wider, want, TOL)  # a larger max_q only pads


def test_ref_rejects_bad_shapes_naming_them():
    q, k, v, table, cu, lens, max_q = _inputs(4, 2, 8, [(1, 3), (0, 5)])
    with pytest.raises(ValueError, match="multiple of KV"):
        paged_prefill_attention_ref(q[:, :3], k, v, table, cu, lens, max_q)
    with pytest.raises(ValueError, match=r"cu_q must be \[S \+ 1\]"):
        paged_prefill_attention_ref(q, k, v, table, cu[:2], lens, max_q)
    with pytest.raises(ValueError, match=r"table must be \[S, W\] and lens \[S\]"):
        paged_prefill_attention_ref(q, k, v, table[:1], cu, lens, max_q)
    with pytest.raises(ValueError, match="max_q must be at least 1, got 0"):
        paged_prefill_attention_ref(q, k, v, table, cu, lens, 0)


@pytest.mark.triton
@pytest.mark.parametrize(("H", "KV", "hd", "parts"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_ref(H, KV, hd, parts, dtype):
    from marconi_kernels.triton_paged_prefill import paged_prefill_attention_triton

    q, k, v, table, cu, lens, max_q = _inputs(H, KV, hd, parts, seed=3)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    got = paged_prefill_attention_triton(q, k, v, table, cu, lens, max_q, 0.25)
    want = paged_prefill_attention_ref(
        q.float(), k.float(), v.float(), table, cu, lens, max_q, 0.25
    )
    assert got.dtype == dtype
    assert_close_scaled(got.float(), want, TOL if dtype == torch.float32 else 2e-2)


@pytest.mark.triton
def test_triton_reads_pool_strides_and_rejects_bad_layouts():
    from marconi_kernels.triton_paged_prefill import paged_prefill_attention_triton

    q, k, v, table, cu, lens, max_q = _inputs(4, 2, 8, [(30, 20), (0, 3)])
    wide = torch.randn(2, k.shape[1], 3, 8)  # a pool slice with a gap between heads
    wide[:, :, 1] = k
    got = paged_prefill_attention_triton(q, wide[:, :, 1], v, table, cu, lens, max_q)
    assert_close_scaled(got, paged_prefill_attention_ref(q, k, v, table, cu, lens, max_q), TOL)
    with pytest.raises(ValueError, match="contiguous in their last dim"):
        paged_prefill_attention_triton(
            q, k.transpose(1, 2).contiguous().transpose(1, 2), v, table, cu, lens, max_q
        )
