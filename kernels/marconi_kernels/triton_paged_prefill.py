"""Triton prefill attention of several sequences over a token-row table (see
:mod:`marconi_kernels.paged_prefill` for the contract; :func:`paged_prefill_attention_ref`
is its pure-torch twin).

Design (FlashAttention's forward over a row table): one program per (sequence, query
head, block of ``BLOCK_M`` of the sequence's new queries). It walks the sequence's rows
``BLOCK_N`` at a time up to its block's last query position, gathering keys and values
through the table (int64 offsets: a pool can exceed 2**31 elements), with an online
softmax (running max, sum and output) in float32: scores are never materialised beyond one
tile. Products are ``tl.dot`` tiles in the inputs' dtype with float32 accumulation;
float32 inputs, and every input under the interpreter (whose bfloat16 dot is wrong in
Triton 3.9), multiply in float32 at "ieee" precision, so the result matches the reference
rather than TF32.
Programs whose block lies past a sequence's queries exit at once, so the grid is sized by
the longest sequence (``max_q``) without a host sync.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .paged_attention import check_window
from .paged_prefill import check_prefill_shapes
from .triton_runtime import device_guard, interpreting

_BLOCK_M = 16
_BLOCK_N = 32


@triton.jit  # type: ignore[untyped-decorator]
def _paged_prefill_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, table_ptr, cu_ptr, lens_ptr, o_ptr,
    sqt, sqh, skh, skr, svh, svr, stb, sot, soh,
    scale, window,
    G: tl.constexpr, HD: tl.constexpr, F32: tl.constexpr, WINDOWED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    s = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    first = tl.program_id(2) * BLOCK_M
    start = tl.load(cu_ptr + s)
    n_q = tl.load(cu_ptr + s + 1) - start
    if first < n_q:
        length = tl.load(lens_ptr + s)
        past = length - n_q
        i = first + tl.arange(0, BLOCK_M)
        im = i < n_q
        d = tl.arange(0, BLOCK_D)
        dm = d < HD
        token = (start + i).to(tl.int64)
        q = tl.load(
            q_ptr + token[:, None] * sqt + h * sqh + d[None, :],
            mask=im[:, None] & dm[None, :],
            other=0.0,
        )
        if F32:
            q = q.to(tl.float32)
        kvh = h // G
        position = past + i
        last = tl.minimum(length, past + first + BLOCK_M)
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        total = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        lo = 0
        if WINDOWED:  # the first position the block's first query sees
            lo = tl.maximum(past + first - window + 1, 0)
        for n0 in range(lo, last, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            nm = n < length
            rows = tl.load(table_ptr + s * stb + n, mask=nm, other=0).to(tl.int64)
            kv_mask = nm[:, None] & dm[None, :]
            k = tl.load(
                k_ptr + kvh * skh + rows[:, None] * skr + d[None, :], mask=kv_mask, other=0.0
            ).to(q.dtype)
            scores = tl.dot(q, tl.trans(k), input_precision="ieee" if F32 else "tf32") * scale
            allowed = (n[None, :] <= position[:, None]) & nm[None, :]
            if WINDOWED:
                allowed = allowed & (n[None, :] > position[:, None] - window)
            scores = tl.where(allowed, scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - shift)
            p = tl.exp(scores - shift[:, None])
            total = total * alpha + tl.sum(p, axis=1)
            v = tl.load(
                v_ptr + kvh * svh + rows[:, None] * svr + d[None, :], mask=kv_mask, other=0.0
            ).to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(
                p.to(q.dtype), v, input_precision="ieee" if F32 else "tf32"
            )
            m = m_new
        out = acc / tl.where(total == 0.0, 1.0, total)[:, None]
        tl.store(
            o_ptr + token[:, None] * sot + h * soh + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=im[:, None] & dm[None, :],
        )


def paged_prefill_attention_triton(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    table: torch.Tensor,
    cu_q: torch.Tensor,
    lens: torch.Tensor,
    max_q: int,
    scale: float | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Same contract as :func:`paged_prefill_attention_ref`: packed q [T, H, hd] over the
    pool rows ``table[s, :lens[s]]`` of k_pool, v_pool [KV, R, hd] (with a window, each
    query block walks from its first query's window start); returns [T, H, hd] in q's
    dtype. The pools must be contiguous in their last dim."""
    check_prefill_shapes(q, k_pool, v_pool, table, cu_q, lens, max_q)
    check_window(window)
    total, n_heads, hd = q.shape
    n_kv = k_pool.shape[0]
    if k_pool.stride(2) != 1 or v_pool.stride(2) != 1 or table.stride(1) != 1:
        raise ValueError("k_pool, v_pool and table must be contiguous in their last dim")
    q = q.contiguous()
    cu_q, lens = cu_q.contiguous(), lens.contiguous()
    out = torch.empty_like(q)
    if total == 0:
        return out
    upcast = q.dtype == torch.float32 or interpreting()
    grid = (table.shape[0], n_heads, triton.cdiv(max_q, _BLOCK_M))
    with device_guard(q):
        _paged_prefill_kernel[grid](
            q, k_pool, v_pool, table, cu_q, lens, out,
            q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1),
            v_pool.stride(0), v_pool.stride(1), table.stride(0), out.stride(0), out.stride(1),
            hd**-0.5 if scale is None else float(scale), window or 0,
            G=n_heads // n_kv, HD=hd, F32=upcast, WINDOWED=window is not None,
            BLOCK_M=_BLOCK_M, BLOCK_D=max(16, triton.next_power_of_2(hd)), BLOCK_N=_BLOCK_N,
        )  # fmt: skip
    return out
