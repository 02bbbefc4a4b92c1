"""xLSTM's mLSTM cell as Triton kernels: chunked prefill with state emission (one sequence
or several packed), and the in-place decode step.

Same contracts as :func:`marconi_kernels.mlstm.mlstm_chunk_ref`,
:func:`marconi_kernels.mlstm.mlstm_chunk_varlen_ref` and
:func:`marconi_kernels.mlstm.mlstm_step_ref`; the math, the chunked form and the packed
state layout (C [K, V] row-major, n [K], m per head) are described in
:mod:`marconi_kernels.mlstm`. Everything is computed in float32; every ``tl.dot`` uses
IEEE float32, not TF32.

Prefill: ``_chunk_kernel``, one program per (V block, batch x head) (varlen: per
(V block, sequence x head)), walks the chunks in order with its [K, BV] slice of C, the
normaliser n [K] and the stabiliser m in registers (every V block carries n and m along:
they are cheap; the first one stores them). Per chunk: b = cumsum(logsigmoid(f)), each
token's m_t = max(b_t + m_0, max_{j<=t} (b_t - b_j + i_j)), the outputs from the carried
state plus the masked intra-chunk product, then the state advanced to the chunk end; for
each emit position ending in the chunk the state advanced by the chunk's first tokens.
Padded rows get log-forget 0 and input gate -inf: they change nothing.

Decode: ``_step_kernel``, one program per (batch x head), loops over the V blocks of its
C (any strides); n and m are updated once and stored after the loop, so the update is in
place without a copy or a race between programs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .chunk_table import ChunkTable
from .gated_delta import check_positions
from .mlstm import (
    MLSTM_EPS,
    check_mlstm_shapes,
    check_mlstm_step_shapes,
    check_mlstm_varlen,
    mlstm_state_size,
)
from .triton_runtime import device_guard
from .triton_tiles import block_k, chunk_len, warps

_BV = 32  # value columns per program


@triton.jit
def _logsigmoid(x):  # type: ignore[no-untyped-def]
    """log(sigmoid(x)) without overflow: min(x, 0) - log(1 + exp(-|x|))."""
    return tl.minimum(x, 0.0) - tl.log(1.0 + tl.exp(-tl.abs(x)))


@triton.jit
def _load_rows(ptr, offs_t, tmask, offs_c, cmask, s_t, s_c):  # type: ignore[no-untyped-def]
    """A [rows, cols] float32 tile of ``ptr[t * s_t + c * s_c]``, zeros outside the masks."""
    tile = tl.load(
        ptr + offs_t[:, None] * s_t + offs_c[None, :] * s_c,
        mask=tmask[:, None] & cmask[None, :],
        other=0.0,
    )
    return tile.to(tl.float32)


@triton.jit
def _advance(C, n, m0, k, v, b, ig, b_end, upto, PRECISION: tl.constexpr):  # type: ignore[no-untyped-def]
    """The state (C [KP, BV], n [KP], m) after the chunk's rows `upto` from (C, n, m0):
    b the rows' cumulative log-forget, b_end its value at the last row kept, ig the input
    gates."""
    a = tl.where(upto, b_end - b + ig, float("-inf"))
    m = tl.maximum(b_end + m0, tl.max(a, axis=0))
    w = tl.where(upto, tl.exp(a - m), 0.0)
    carry = tl.exp(b_end + m0 - m)
    kw = k * w[:, None]
    C = carry * C + tl.dot(tl.trans(kw), v, input_precision=PRECISION)
    n = carry * n + tl.sum(kw, axis=0)
    return C, n, m


@triton.jit  # type: ignore[untyped-decorator]
def _chunk_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, i_ptr, f_ptr, h0_ptr, o_ptr, hT_ptr, emit_ptr, epos_ptr,
    erange_ptr, cstart_ptr, clen_ptr, crange_ptr,
    L, H, K, V, P,
    sqb, sqt, sqh, sqk, skb, skt, skh, skk, svb, svt, svh, svv, sib, sit, sih,
    sfb, sft, sfh, s_ob, s_emit, scale, eps,
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
    c_offs = offs_k[:, None] * V + offs_v[None, :]
    base = pid_bh * P
    if HAS_H0:
        C = tl.load(h0_ptr + base + c_offs, mask=smask, other=0.0)
        n = tl.load(h0_ptr + base + K * V + offs_k, mask=kmask, other=0.0)
        m = tl.load(h0_ptr + base + K * V + K)
    else:
        C = tl.zeros([KP, BV], dtype=tl.float32)
        n = tl.zeros([KP], dtype=tl.float32)
        m = tl.sum(tl.zeros([KP], dtype=tl.float32), axis=0)  # a float32 scalar 0

    causal = rows[:, None] >= rows[None, :]
    q_rows = q_ptr + i_b * sqb + i_h * sqh
    k_rows = k_ptr + i_b * skb + i_h * skh
    v_rows = v_ptr + i_b * svb + i_h * svh
    i_rows = i_ptr + i_b * sib + i_h * sih
    f_rows = f_ptr + i_b * sfb + i_h * sfh
    o_rows = o_ptr + i_b * s_ob + i_h * V
    for c in range(c_lo, c_hi):
        if VARLEN:
            tok0 = tl.load(cstart_ptr + c)
            nt = tl.load(clen_ptr + c)
        else:
            tok0 = c * BT
            nt = L - tok0
        offs_t = tok0 + rows
        tmask = rows < nt
        q = _load_rows(q_rows, offs_t, tmask, offs_k, kmask, sqt, sqk) * scale
        k = _load_rows(k_rows, offs_t, tmask, offs_k, kmask, skt, skk)
        v = _load_rows(v_rows, offs_t, tmask, offs_v, vmask, svt, svv)
        fg = tl.load(f_rows + offs_t * sft, mask=tmask, other=0.0).to(tl.float32)
        ig = tl.load(i_rows + offs_t * sit, mask=tmask, other=0.0).to(tl.float32)
        lf = tl.where(tmask, _logsigmoid(fg), 0.0)
        ig = tl.where(tmask, ig, float("-inf"))
        b = tl.cumsum(lf, axis=0)

        log_d = tl.where(causal, b[:, None] - b[None, :] + ig[None, :], float("-inf"))
        m_in = b + m
        m_t = tl.maximum(m_in, tl.max(log_d, axis=1))
        d = tl.where(causal, tl.exp(log_d - m_t[:, None]), 0.0)
        qc = q * tl.exp(m_in - m_t)[:, None]
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * d
        num = tl.dot(qc, C, input_precision=PRECISION)
        num += tl.dot(scores, v, input_precision=PRECISION)
        den = tl.sum(qc * n[None, :], axis=1) + tl.sum(scores, axis=1)
        h = num / (tl.maximum(tl.abs(den), tl.exp(-m_t)) + eps)[:, None]
        tl.store(
            o_rows + offs_t[:, None] * H * V + offs_v[None, :],
            h.to(o_ptr.dtype.element_ty),
            mask=tmask[:, None] & vmask[None, :],
        )

        e_lo = tl.load(erange_ptr + c)
        e_hi = tl.load(erange_ptr + c + 1)
        for e in range(e_lo, e_hi):
            last = tl.load(epos_ptr + e) - 1  # local index of the emit's last token
            upto = rows <= last
            b_end = tl.sum(tl.where(rows == last, b, 0.0), axis=0)
            C_e, n_e, m_e = _advance(C, n, m, k, v, b, ig, b_end, upto, PRECISION)
            e_base = e * s_emit + e_head * P
            tl.store(emit_ptr + e_base + c_offs, C_e, mask=smask)
            if pid_v == 0:
                tl.store(emit_ptr + e_base + K * V + offs_k, n_e, mask=kmask)
                tl.store(emit_ptr + e_base + K * V + K, m_e)

        C, n, m = _advance(C, n, m, k, v, b, ig, tl.sum(lf, axis=0), tmask, PRECISION)
    tl.store(hT_ptr + base + c_offs, C, mask=smask)
    if pid_v == 0:
        tl.store(hT_ptr + base + K * V + offs_k, n, mask=kmask)
        tl.store(hT_ptr + base + K * V + K, m)


@triton.jit  # type: ignore[untyped-decorator]
def _step_kernel(  # type: ignore[no-untyped-def]
    state_ptr, q_ptr, k_ptr, v_ptr, i_ptr, f_ptr, o_ptr,
    H, K, V,
    ssb, ssh, ssp, sqb, sqh, sqk, skb, skh, skk, svb, svh, svv, sib, sih, sfb, sfh,
    scale, eps,
    KP: tl.constexpr, BV: tl.constexpr,
):  # fmt: skip
    pid_bh = tl.program_id(0).to(tl.int64)
    i_b = pid_bh // H
    i_h = pid_bh % H
    offs_k = tl.arange(0, KP)
    kmask = offs_k < K
    s_row = state_ptr + i_b * ssb + i_h * ssh
    q = tl.load(q_ptr + i_b * sqb + i_h * sqh + offs_k * sqk, mask=kmask, other=0.0)
    q = q.to(tl.float32) * scale
    k = tl.load(k_ptr + i_b * skb + i_h * skh + offs_k * skk, mask=kmask, other=0.0)
    k = k.to(tl.float32)
    ig = tl.load(i_ptr + i_b * sib + i_h * sih).to(tl.float32)
    lf = _logsigmoid(tl.load(f_ptr + i_b * sfb + i_h * sfh).to(tl.float32))
    n = tl.load(s_row + (K * V + offs_k) * ssp, mask=kmask, other=0.0).to(tl.float32)
    m = tl.load(s_row + (K * V + K) * ssp).to(tl.float32)
    m_new = tl.maximum(lf + m, ig)
    a_f = tl.exp(lf + m - m_new)
    a_i = tl.exp(ig - m_new)
    n = a_f * n + a_i * k
    den = tl.maximum(tl.abs(tl.sum(q * n, axis=0)), tl.exp(-m_new)) + eps
    for v0 in range(0, V, BV):
        offs_v = v0 + tl.arange(0, BV)
        vmask = offs_v < V
        smask = kmask[:, None] & vmask[None, :]
        c_ptrs = s_row + (offs_k[:, None] * V + offs_v[None, :]) * ssp
        v = tl.load(v_ptr + i_b * svb + i_h * svh + offs_v * svv, mask=vmask, other=0.0)
        C = tl.load(c_ptrs, mask=smask, other=0.0).to(tl.float32)
        C = a_f * C + (a_i * k)[:, None] * v.to(tl.float32)[None, :]
        tl.store(c_ptrs, C.to(state_ptr.dtype.element_ty), mask=smask)
        h = tl.sum(C * q[:, None], axis=0) / den
        tl.store(o_ptr + pid_bh * V + offs_v, h.to(o_ptr.dtype.element_ty), mask=vmask)
    tl.store(s_row + (K * V + offs_k) * ssp, n.to(state_ptr.dtype.element_ty), mask=kmask)
    tl.store(s_row + (K * V + K) * ssp, m_new.to(state_ptr.dtype.element_ty))


def mlstm_chunk_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    *,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
    eps: float = MLSTM_EPS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked mLSTM over a prefill (Triton), resuming from a state and emitting states in
    the same pass.

    Args:
        q, k: [b, L, H, K]; v: [b, L, H, V]; igate, fgate: [b, L, H] (any float dtypes,
            any strides).
        chunk_size: tokens per chunk, rounded up to a power of two >= 16.
        initial_state: [b, H, P] packed state before the first token, or None (zeros).
        emit_at: sorted, distinct positions p (1 <= p <= L).
        eps: added to the output's denominator.

    Returns:
        h: [b, L, H, V] in q.dtype; final_state: [b, H, P] float32; emitted:
        [len(emit_at), b, H, P] float32.

    Raises ValueError on bad shapes, chunk_size < 1 or bad emit positions, like the reference.
    """
    b, L, H, K, V = check_mlstm_shapes(q, k, v, igate, fgate, initial_state)
    BT = chunk_len(chunk_size)
    positions = check_positions(emit_at, L)
    dev = q.device
    P = mlstm_state_size(K, V)
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    if L == 0 or b * H == 0:
        final = torch.zeros(b, H, P, dtype=torch.float32, device=dev) if h0 is None else h0
        emitted_0 = final.expand(len(positions), b, H, P).clone()
        return torch.zeros(b, L, H, V, dtype=q.dtype, device=dev), final.clone(), emitted_0

    KP = block_k(K)
    table = ChunkTable.of([0, L], [positions], BT)
    o = torch.empty(b, L, H, V, dtype=q.dtype, device=dev)
    final = torch.empty(b, H, P, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(positions), b, H, P, dtype=torch.float32, device=dev)
    _, _, _, erange_t, epos_t = table.tensors(dev)
    with device_guard(q):
        _chunk_kernel[(triton.cdiv(V, _BV), b * H)](
            q, k, v, igate, fgate, final if h0 is None else h0, o, final, emitted, epos_t,
            erange_t, epos_t, epos_t, epos_t,
            L, H, K, V, P,
            *q.stride(), *k.stride(), *v.stride(), *igate.stride(), *fgate.stride(),
            L * H * V, b * H * P, K**-0.5, eps,
            HAS_H0=h0 is not None, BT=BT, KP=KP, BV=_BV, PRECISION="ieee", VARLEN=False,
            num_warps=warps(KP, BT),
        )  # fmt: skip
    return o, final, emitted


def mlstm_chunk_varlen_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    chunk_size: int = 64,
    initial_states: torch.Tensor | None = None,
    emit_at: Sequence[Sequence[int]] = (),
    eps: float = MLSTM_EPS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`mlstm_chunk_varlen_ref`, in one launch: the sequences are
    cut into chunks of their own (a chunk never spans two) and each (sequence, head)
    program row walks its sequence's chunks from its own state."""
    H, K, V, cu, emits = check_mlstm_varlen(
        q, k, v, igate, fgate, initial_states, cu_seqlens, emit_at
    )
    BT = chunk_len(chunk_size)
    n_seq, total = len(cu) - 1, q.shape[0]
    dev = q.device
    P = mlstm_state_size(K, V)
    KP = block_k(K)
    table = ChunkTable.of(cu, emits, BT)
    h0 = None if initial_states is None else initial_states.to(torch.float32).contiguous()
    o = torch.zeros(total, H, V, dtype=q.dtype, device=dev)
    final = torch.empty(n_seq, H, P, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(table.epos), H, P, dtype=torch.float32, device=dev)
    if n_seq == 0 or H == 0:
        return o, torch.zeros_like(final) if h0 is None else h0.clone(), emitted.zero_()
    cstart, clen, crange_t, erange_t, epos_t = table.tensors(dev)
    with device_guard(q):
        _chunk_kernel[(triton.cdiv(V, _BV), n_seq * H)](
            q, k, v, igate, fgate, final if h0 is None else h0, o, final, emitted, epos_t,
            erange_t, cstart, clen, crange_t,
            total, H, K, V, P,
            0, *q.stride(), 0, *k.stride(), 0, *v.stride(), 0, *igate.stride(),
            0, *fgate.stride(), 0, H * P, K**-0.5, eps,
            HAS_H0=h0 is not None, BT=BT, KP=KP, BV=_BV, PRECISION="ieee", VARLEN=True,
            num_warps=warps(KP, BT),
        )  # fmt: skip
    return o, final, emitted


def mlstm_step_triton(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    eps: float = MLSTM_EPS,
) -> torch.Tensor:
    """One decode token of the mLSTM per sequence (Triton); ``state`` in place.

    Args:
        state: [b, H, P] packed float32 states (any strides, e.g. rows of a cache).
        q, k: [b, H, K]; v: [b, H, V]; igate, fgate: [b, H] (any strides and float dtypes).
        eps: added to the output's denominator.

    Returns:
        h: [b, H, V] in q.dtype (computed in float32).
    """
    b, H, K, V = check_mlstm_step_shapes(state, q, k, v, igate, fgate)
    o = torch.empty(b, H, V, dtype=q.dtype, device=q.device)
    if b == 0 or H == 0 or V == 0:
        return o
    with device_guard(q):
        _step_kernel[(b * H,)](
            state, q, k, v, igate, fgate, o,
            H, K, V,
            *state.stride(), *q.stride(), *k.stride(), *v.stride(), *igate.stride(),
            *fgate.stride(), K**-0.5, eps,
            KP=block_k(K), BV=_BV,
        )  # fmt: skip
    return o
