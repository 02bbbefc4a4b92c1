"""Lightning attention (MiniMax linear attention) as Triton kernels: chunked prefill with
state emission (one sequence or several packed), and the in-place decode step.

Same contracts as :func:`marconi_kernels.lightning.lightning_chunk_ref`,
:func:`marconi_kernels.lightning.lightning_chunk_varlen_ref` and
:func:`marconi_kernels.lightning.lightning_step_ref`; the math and the chunked form are
described in :mod:`marconi_kernels.lightning`. Everything is computed in float32; every
``tl.dot`` uses IEEE float32, not TF32.

Prefill: ``_chunk_kernel``, one program per (V block, batch x head) (varlen: per
(V block, sequence x head)), loops over the chunks in order with its [K, BV] state tile in
registers: o = (exp(gamma) q) S + (decayed causal q k^T) v with gamma_i = -s (i + 1), then
S = exp(-s n) S + (k decayed to the chunk end)^T v for a chunk of n tokens. The host gives
each chunk the range of emit positions that end inside it; for each, the program stores
exp(-s m) S + (k decayed to m, rows <= m)^T v, the exact state after local token m.
There is no intra-chunk solve (no delta term), so one launch does everything.

Decode: ``_step_kernel``, one program per (V block, batch x head), reads its [K, BV] slice
of the state (any strides), decays it, adds k v^T, reads out q^T S and stores the slice
back; programs own disjoint columns, so the update is in place without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .chunk_table import ChunkTable
from .gated_delta import check_positions
from .lightning import check_lightning_shapes, check_lightning_step_shapes, check_lightning_varlen
from .triton_runtime import device_guard
from .triton_tiles import block_k, chunk_len, warps

_BV = 32  # value columns per program


@triton.jit
def _load_rows(ptr, offs_t, tmask, offs_c, cmask, s_t, s_c):  # type: ignore[no-untyped-def]
    """A [rows, cols] float32 tile of ``ptr[t * s_t + c * s_c]``, zeros outside the masks."""
    tile = tl.load(
        ptr + offs_t[:, None] * s_t + offs_c[None, :] * s_c,
        mask=tmask[:, None] & cmask[None, :],
        other=0.0,
    )
    return tile.to(tl.float32)


@triton.jit  # type: ignore[untyped-decorator]
def _chunk_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, slope_ptr, h0_ptr, o_ptr, hT_ptr, emit_ptr, epos_ptr, erange_ptr,
    cstart_ptr, clen_ptr, crange_ptr,
    L, H, K, V,
    sqb, sqt, sqh, sqk, skb, skt, skh, skk, svb, svt, svh, svv, s_ob, s_emit,
    HAS_H0: tl.constexpr, BT: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
    PRECISION: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    i_b = pid_bh // H  # varlen: the sequence
    i_h = pid_bh % H
    if VARLEN:
        c_lo = tl.load(crange_ptr + i_b)
        c_hi = tl.load(crange_ptr + i_b + 1)
        e_head = i_h
    else:
        c_lo = 0
        c_hi = tl.cdiv(L, BT)
        e_head = pid_bh
    rows = tl.arange(0, BT)
    offs_k = tl.arange(0, KP)
    kmask = offs_k < K
    offs_v = pid_v * BV + tl.arange(0, BV)
    vmask = offs_v < V
    smask = kmask[:, None] & vmask[None, :]
    s_offs = pid_bh * K * V + offs_k[:, None] * V + offs_v[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + s_offs, mask=smask, other=0.0)
    else:
        S = tl.zeros([KP, BV], dtype=tl.float32)

    s = tl.load(slope_ptr + i_h).to(tl.float32)
    gam = -s * (rows + 1).to(tl.float32)  # log-decay from the chunk start to each token
    incl = rows[:, None] >= rows[None, :]
    decay = tl.where(incl, tl.exp(tl.where(incl, gam[:, None] - gam[None, :], 0.0)), 0.0)
    q_rows = q_ptr + i_b * sqb + i_h * sqh
    k_rows = k_ptr + i_b * skb + i_h * skh
    v_rows = v_ptr + i_b * svb + i_h * svh
    o_rows = o_ptr + i_b * s_ob + i_h * V
    for c in range(c_lo, c_hi):
        if VARLEN:
            tok0 = tl.load(cstart_ptr + c)
            n = tl.load(clen_ptr + c)
        else:
            tok0 = c * BT
            n = L - tok0
        offs_t = tok0 + rows
        tmask = rows < n
        q = _load_rows(q_rows, offs_t, tmask, offs_k, kmask, sqt, sqk)
        k = _load_rows(k_rows, offs_t, tmask, offs_k, kmask, skt, skk)
        v = _load_rows(v_rows, offs_t, tmask, offs_v, vmask, svt, svv)

        att = tl.dot(q, tl.trans(k), input_precision=PRECISION) * decay
        o = tl.dot(q * tl.exp(gam)[:, None], S, input_precision=PRECISION)
        o += tl.dot(att, v, input_precision=PRECISION)
        tl.store(
            o_rows + offs_t[:, None] * H * V + offs_v[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=tmask[:, None] & vmask[None, :],
        )

        e_lo = tl.load(erange_ptr + c)
        e_hi = tl.load(erange_ptr + c + 1)
        for e in range(e_lo, e_hi):
            m = tl.load(epos_ptr + e) - 1  # local index of the emit's last token
            upto = rows <= m
            g_m = -s * (m + 1).to(tl.float32)
            coef = tl.where(upto, tl.exp(tl.where(upto, g_m - gam, 0.0)), 0.0)
            S_m = tl.exp(g_m) * S + tl.dot(
                tl.trans(k * coef[:, None]), v, input_precision=PRECISION
            )
            e_offs = e * s_emit + e_head * K * V + offs_k[:, None] * V + offs_v[None, :]
            tl.store(emit_ptr + e_offs, S_m, mask=smask)

        g_last = -s * tl.minimum(n, BT).to(tl.float32)
        coef_end = tl.where(tmask, tl.exp(tl.where(tmask, g_last - gam, 0.0)), 0.0)
        S = tl.exp(g_last) * S + tl.dot(
            tl.trans(k * coef_end[:, None]), v, input_precision=PRECISION
        )
    tl.store(hT_ptr + s_offs, S, mask=smask)


@triton.jit  # type: ignore[untyped-decorator]
def _step_kernel(  # type: ignore[no-untyped-def]
    state_ptr, q_ptr, k_ptr, v_ptr, slope_ptr, o_ptr,
    H, K, V,
    ssb, ssh, ssk, ssv, sqb, sqh, sqk, skb, skh, skk, svb, svh, svv,
    KP: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    i_b = pid_bh // H
    i_h = pid_bh % H
    offs_k = tl.arange(0, KP)
    kmask = offs_k < K
    offs_v = pid_v * BV + tl.arange(0, BV)
    vmask = offs_v < V
    smask = kmask[:, None] & vmask[None, :]

    q = tl.load(q_ptr + i_b * sqb + i_h * sqh + offs_k * sqk, mask=kmask, other=0.0)
    k = tl.load(k_ptr + i_b * skb + i_h * skh + offs_k * skk, mask=kmask, other=0.0)
    v = tl.load(v_ptr + i_b * svb + i_h * svh + offs_v * svv, mask=vmask, other=0.0)
    s = tl.load(slope_ptr + i_h).to(tl.float32)

    s_ptrs = state_ptr + i_b * ssb + i_h * ssh + offs_k[:, None] * ssk + offs_v[None, :] * ssv
    S = tl.load(s_ptrs, mask=smask, other=0.0).to(tl.float32) * tl.exp(-s)
    S = S + k.to(tl.float32)[:, None] * v.to(tl.float32)[None, :]
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=smask)
    o = tl.sum(S * q.to(tl.float32)[:, None], axis=0)
    tl.store(o_ptr + pid_bh * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=vmask)


def lightning_chunk_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    *,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked lightning attention over a prefill (Triton), resuming from a state and
    emitting states in the same pass.

    Args:
        q, k: [b, L, H, K]; v: [b, L, H, V] (any float dtypes, any strides); slope: [H].
        chunk_size: tokens per chunk, rounded up to a power of two >= 16.
        initial_state: [b, H, K, V] state before the first token, or None (zeros).
        emit_at: sorted, distinct positions p (1 <= p <= L).

    Returns:
        o: [b, L, H, V] in q.dtype; final_state: [b, H, K, V] float32; emitted:
        [len(emit_at), b, H, K, V] float32.

    Raises ValueError on bad shapes, chunk_size < 1 or bad emit positions, like the reference.
    """
    b, L, H, K, V = check_lightning_shapes(q, k, v, slope, initial_state)
    BT = chunk_len(chunk_size)
    positions = check_positions(emit_at, L)
    dev = q.device
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    if L == 0 or b * H * K * V == 0:
        final = torch.zeros(b, H, K, V, dtype=torch.float32, device=dev) if h0 is None else h0
        emitted_0 = final.expand(len(positions), b, H, K, V).clone()
        return torch.zeros(b, L, H, V, dtype=q.dtype, device=dev), final.clone(), emitted_0

    KP = block_k(K)
    table = ChunkTable.of([0, L], [positions], BT)
    o = torch.empty(b, L, H, V, dtype=q.dtype, device=dev)
    final = torch.empty(b, H, K, V, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(positions), b, H, K, V, dtype=torch.float32, device=dev)
    _, _, _, erange_t, epos_t = table.tensors(dev)
    with device_guard(q):
        _chunk_kernel[(triton.cdiv(V, _BV), b * H)](
            q, k, v, slope.to(torch.float32).contiguous(), final if h0 is None else h0, o,
            final, emitted, epos_t, erange_t, epos_t, epos_t, epos_t,
            L, H, K, V,
            *q.stride(), *k.stride(), *v.stride(), L * H * V, b * H * K * V,
            HAS_H0=h0 is not None, BT=BT, KP=KP, BV=_BV, PRECISION="ieee", VARLEN=False,
            num_warps=warps(KP, BT),
        )  # fmt: skip
    return o, final, emitted


def lightning_chunk_varlen_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    chunk_size: int = 64,
    initial_states: torch.Tensor | None = None,
    emit_at: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`lightning_chunk_varlen_ref`, in one launch: the sequences
    are cut into chunks of their own (a chunk never spans two) and each (sequence, head)
    program row walks its sequence's chunks from its own state."""
    H, K, V, cu, emits = check_lightning_varlen(q, k, v, slope, initial_states, cu_seqlens, emit_at)
    BT = chunk_len(chunk_size)
    n_seq, total = len(cu) - 1, q.shape[0]
    dev = q.device
    KP = block_k(K)
    table = ChunkTable.of(cu, emits, BT)
    h0 = None if initial_states is None else initial_states.to(torch.float32).contiguous()
    o = torch.zeros(total, H, V, dtype=q.dtype, device=dev)
    final = torch.empty(n_seq, H, K, V, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(table.epos), H, K, V, dtype=torch.float32, device=dev)
    if n_seq == 0 or H * K * V == 0:
        return o, torch.zeros_like(final) if h0 is None else h0.clone(), emitted.zero_()
    cstart, clen, crange_t, erange_t, epos_t = table.tensors(dev)
    with device_guard(q):
        _chunk_kernel[(triton.cdiv(V, _BV), n_seq * H)](
            q, k, v, slope.to(torch.float32).contiguous(), final if h0 is None else h0, o,
            final, emitted, epos_t, erange_t, cstart, clen, crange_t,
            total, H, K, V,
            0, *q.stride(), 0, *k.stride(), 0, *v.stride(), 0, H * K * V,
            HAS_H0=h0 is not None, BT=BT, KP=KP, BV=_BV, PRECISION="ieee", VARLEN=True,
            num_warps=warps(KP, BT),
        )  # fmt: skip
    return o, final, emitted


def lightning_step_triton(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor
) -> torch.Tensor:
    """One decode token of lightning attention per sequence (Triton); ``state`` in place.

    Args:
        state: [b, H, K, V] (float32; any strides, e.g. rows of a cache), updated in place.
        q, k: [b, H, K]; v: [b, H, V] (any strides and float dtypes); slope: [H].

    Returns:
        o: [b, H, V] in q.dtype, read from the updated state (computed in float32).
    """
    b, H, K, V = check_lightning_step_shapes(state, q, k, v, slope)
    o = torch.empty(b, H, V, dtype=q.dtype, device=q.device)
    if b == 0 or H == 0 or V == 0:
        return o
    with device_guard(q):
        _step_kernel[(triton.cdiv(V, _BV), b * H)](
            state, q, k, v, slope.to(torch.float32).contiguous(), o,
            H, K, V,
            *state.stride(), *q.stride(), *k.stride(), *v.stride(),
            KP=block_k(K), BV=_BV,
        )  # fmt: skip
    return o
