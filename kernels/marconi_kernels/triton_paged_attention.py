"""Triton decode attention over a token-row table (see :mod:`marconi_kernels.paged_attention`
for the contract; :func:`paged_decode_attention_ref` is its pure-torch twin).

Design: one program per (sequence, KV head) serves the G = H / KV query heads that share
that KV head, so each key and value row is loaded once for its group. It walks the
sequence's rows ``BLOCK_N`` at a time, gathering them through the table (int64 offsets:
a pool can exceed 2**31 elements), and keeps an online softmax (running max, sum and
output) in float32, so the scores are never materialised beyond one block. The products
are elementwise broadcasts reduced in registers rather than ``tl.dot``: G is often below
the 16 rows a dot needs, and decode attention is bound by reading the rows, not by math.
Compute is float32 for every input dtype; the output takes q's dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .paged_attention import check_paged_shapes, check_window
from .triton_runtime import device_guard

_BLOCK_N = 32


@triton.jit  # type: ignore[untyped-decorator]
def _paged_decode_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, o_ptr,
    sqb, sqh, skh, skr, svh, svr, stb, sob, soh,
    scale, window,
    G: tl.constexpr, HD: tl.constexpr, WINDOWED: tl.constexpr,
    BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    gm = g < G
    dm = d < HD
    heads = kvh * G + g
    q = tl.load(
        q_ptr + b * sqb + heads[:, None] * sqh + d[None, :],
        mask=gm[:, None] & dm[None, :],
        other=0.0,
    ).to(tl.float32)
    length = tl.load(lens_ptr + b)
    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    total = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    lo = 0
    if WINDOWED:  # the window's first position: every block below holds a visible key
        lo = tl.maximum(length - window, 0)
    for start in range(lo, length, BLOCK_N):
        n = start + tl.arange(0, BLOCK_N)
        nm = n < length
        rows = tl.load(table_ptr + b * stb + n, mask=nm, other=0).to(tl.int64)
        kv_mask = nm[:, None] & dm[None, :]
        k = tl.load(
            k_ptr + kvh * skh + rows[:, None] * skr + d[None, :], mask=kv_mask, other=0.0
        ).to(tl.float32)
        s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale
        s = tl.where(nm[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(
            v_ptr + kvh * svh + rows[:, None] * svr + d[None, :], mask=kv_mask, other=0.0
        ).to(tl.float32)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
        m = m_new
    out = acc / total[:, None]
    tl.store(
        o_ptr + b * sob + heads[:, None] * soh + d[None, :],
        out.to(o_ptr.dtype.element_ty),
        mask=gm[:, None] & dm[None, :],
    )


def paged_decode_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Same contract as :func:`paged_decode_attention_ref`: q [B, H, hd] over the pool rows
    ``table[b, :lens[b]]`` of k_pool, v_pool [KV, R, hd] (only the last ``window`` of
    them with a window: the walk starts there); returns [B, H, hd] in q's dtype.
    The pools must be contiguous in their last dim (a row of one head is hd values)."""
    check_paged_shapes(q, k_pool, v_pool, table, lens)
    check_window(window)
    batch, n_heads, hd = q.shape
    n_kv = k_pool.shape[0]
    if k_pool.stride(2) != 1 or v_pool.stride(2) != 1 or table.stride(1) != 1:
        raise ValueError("k_pool, v_pool and table must be contiguous in their last dim")
    q = q.contiguous()
    lens = lens.contiguous()
    out = torch.empty_like(q)
    group = n_heads // n_kv
    if batch == 0:
        return out
    with device_guard(q):
        _paged_decode_kernel[(batch, n_kv)](
            q, k_pool, v_pool, table, lens, out,
            q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1),
            v_pool.stride(0), v_pool.stride(1), table.stride(0), out.stride(0), out.stride(1),
            hd**-0.5 if scale is None else float(scale), window or 0,
            G=group, HD=hd, WINDOWED=window is not None,
            BLOCK_G=triton.next_power_of_2(group), BLOCK_D=triton.next_power_of_2(hd),
            BLOCK_N=_BLOCK_N,
        )  # fmt: skip
    return out
