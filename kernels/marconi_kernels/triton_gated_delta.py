"""Gated DeltaNet (gated delta rule) as Triton kernels: chunked prefill with state emission,
and the in-place decode step.

Same contracts as :func:`marconi_kernels.gated_delta.gated_delta_chunk_ref` and
:func:`marconi_kernels.gated_delta.gated_delta_step_ref`; the math and the chunked (WY) form
are described in :mod:`marconi_kernels.gated_delta`. Everything is computed in float32 (the
references use float64 for float64 inputs); every ``tl.dot`` uses IEEE float32, not TF32:
slower on a GPU, but the rounding stays that of float32 arithmetic (the chunk's triangular
inverse amplifies TF32's 10-bit mantissa errors).

Prefill, two launches:

* ``_wy_kernel``, one program per (chunk, batch x head), all chunks in parallel: loads the
  chunk's (normalised) keys, cumulates g, builds the strictly lower A_ij = beta_i
  exp(gamma_i - gamma_j) k_i.k_j, inverts I + A by forward substitution (row i of the inverse
  is e_i - sum_{j<i} A_ij T_j) and stores W = T (beta exp(gamma) k) [BT, K] and
  U0 = T (beta v) [BT, V] (looping over V blocks) into float32 scratch of [b*H, Lp, *].
* ``_state_kernel``, one program per (V block, batch x head), loops over the chunks in order
  with its [K, BV] state tile in registers: U = U0 - W S, o = exp(gamma) q S + (decayed causal
  q k^T) U, then S = exp(gamma_last) S + (decayed k)^T U. The host gives each chunk the range
  of emit positions that end inside it; for each, the program stores exp(gamma_m) S +
  (k decayed to m, rows <= m)^T U, the exact state after local token m.

Tokens past L in the last chunk load as zeros (g = beta = k = v = 0): decay 1 and no write.
The chunk length is ``chunk_size`` rounded up to a power of two >= 16 (``tl.dot``'s minimum).

Decode: ``_step_kernel``, one program per (V block, batch x head), reads its [K, BV] slice of
the state (any strides), applies decay, the delta-rule write and the read-out, and stores the
slice back; programs own disjoint columns, so the update is in place without a copy.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .chunk_table import ChunkTable
from .gated_delta import (
    L2_EPS,
    check_delta_varlen,
    check_gated_delta_shapes,
    check_positions,
    check_step_shapes,
)
from .triton_runtime import device_guard
from .triton_tiles import MIN_BLOCK, block_k

_BV = 32  # value columns per program (prefill state pass, WY value blocks, decode step)


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
def _l2norm_rows(x, EPS: tl.constexpr):  # type: ignore[no-untyped-def]
    """Each row of a [rows, cols] tile times rsqrt(sum of its squares + EPS)."""
    return x * tl.rsqrt(tl.sum(x * x, axis=1) + EPS)[:, None]


@triton.jit  # type: ignore[untyped-decorator]
def _wy_kernel(  # type: ignore[no-untyped-def]
    k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, cstart_ptr, clen_ptr,
    L, H, K, V, Lp,
    skb, skt, skh, skk, svb, svt, svh, svv, sgb, sgt, sgh, sbb, sbt, sbh,
    USE_L2: tl.constexpr, EPS: tl.constexpr, BT: tl.constexpr, KP: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    i_b = pid_bh // H
    i_h = pid_bh % H
    rows = tl.arange(0, BT)
    if VARLEN:  # chunk pid_c of the packed sequences: its first token and length
        tok0 = tl.load(cstart_ptr + pid_c)
        n = tl.load(clen_ptr + pid_c)
    else:
        tok0 = pid_c * BT
        n = L - tok0
    offs_t = tok0 + rows
    tmask = rows < n
    offs_k = tl.arange(0, KP)
    kmask = offs_k < K

    k = _load_rows(k_ptr + i_b * skb + i_h * skh, offs_t, tmask, offs_k, kmask, skt, skk)
    if USE_L2:
        k = _l2norm_rows(k, EPS)
    g = tl.load(g_ptr + i_b * sgb + i_h * sgh + offs_t * sgt, mask=tmask, other=0.0)
    beta = tl.load(beta_ptr + i_b * sbb + i_h * sbh + offs_t * sbt, mask=tmask, other=0.0)
    gam = tl.cumsum(g.to(tl.float32), 0)
    beta = beta.to(tl.float32)

    lower = rows[:, None] > rows[None, :]
    decay = tl.where(lower, tl.exp(tl.where(lower, gam[:, None] - gam[None, :], 0.0)), 0.0)
    kb = k * beta[:, None]
    A = tl.dot(kb, tl.trans(k), input_precision=PRECISION) * decay
    # T = (I + A)^-1, row by row; rows not yet computed are still identity rows, and
    # A_ij = 0 for j >= i, so they do not contribute.
    T = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for i in range(1, BT):
        a_i = tl.sum(tl.where(rows[:, None] == i, A, 0.0), axis=0)  # row i of A, over j
        t_i = tl.where(rows == i, 1.0, 0.0) - tl.sum(a_i[:, None] * T, axis=0)
        T = tl.where(rows[:, None] == i, t_i[None, :], T)

    base = pid_bh * Lp + pid_c * BT  # the scratch row of the chunk's first token
    w = tl.dot(T, kb * tl.exp(gam)[:, None], input_precision=PRECISION)
    w_ptrs = w_ptr + (base + rows[:, None]) * K + offs_k[None, :]
    tl.store(w_ptrs, w, mask=kmask[None, :])
    v_rows = v_ptr + i_b * svb + i_h * svh
    for v0 in range(0, V, BV):
        offs_v = v0 + tl.arange(0, BV)
        vmask = offs_v < V
        vt = _load_rows(v_rows, offs_t, tmask, offs_v, vmask, svt, svv)
        u = tl.dot(T, vt * beta[:, None], input_precision=PRECISION)
        tl.store(u_ptr + (base + rows[:, None]) * V + offs_v[None, :], u, mask=vmask[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _state_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, g_ptr, w_ptr, u_ptr, h0_ptr, o_ptr, hT_ptr, emit_ptr, epos_ptr, erange_ptr,
    cstart_ptr, clen_ptr, crange_ptr,
    L, H, K, V, Lp, scale,
    sqb, sqt, sqh, sqk, skb, skt, skh, skk, sgb, sgt, sgh, s_ob, s_emit,
    USE_L2: tl.constexpr, EPS: tl.constexpr, HAS_H0: tl.constexpr, BT: tl.constexpr,
    KP: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    i_b = pid_bh // H  # varlen: the sequence
    i_h = pid_bh % H
    if VARLEN:  # the sequence's chunks and the scratch rows of its head
        c_lo = tl.load(crange_ptr + i_b)
        c_hi = tl.load(crange_ptr + i_b + 1)
        scratch = i_h * Lp
        e_head = i_h
    else:
        c_lo = 0
        c_hi = tl.cdiv(L, BT)
        scratch = pid_bh * Lp
        e_head = pid_bh
    rows = tl.arange(0, BT)
    offs_k = tl.arange(0, KP)
    kmask = offs_k < K
    offs_v = pid_v * BV + tl.arange(0, BV)
    vmask = offs_v < V
    smask = kmask[:, None] & vmask[None, :]
    # [b, H, K, V] row-major offsets of this program's state tile.
    s_offs = pid_bh * K * V + offs_k[:, None] * V + offs_v[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + s_offs, mask=smask, other=0.0)
    else:
        S = tl.zeros([KP, BV], dtype=tl.float32)

    incl = rows[:, None] >= rows[None, :]
    q_rows = q_ptr + i_b * sqb + i_h * sqh
    k_rows = k_ptr + i_b * skb + i_h * skh
    g_rows = g_ptr + i_b * sgb + i_h * sgh
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
        if USE_L2:
            q = _l2norm_rows(q, EPS)
            k = _l2norm_rows(k, EPS)
        q = q * scale
        gam = tl.cumsum(tl.load(g_rows + offs_t * sgt, mask=tmask, other=0.0).to(tl.float32), 0)
        w = tl.load(
            w_ptr + (scratch + c * BT + rows[:, None]) * K + offs_k[None, :],
            mask=kmask[None, :],
            other=0.0,
        )
        u = tl.load(
            u_ptr + (scratch + c * BT + rows[:, None]) * V + offs_v[None, :],
            mask=vmask[None, :],
            other=0.0,
        )
        u = u - tl.dot(w, S, input_precision=PRECISION)

        decay = tl.where(incl, tl.exp(tl.where(incl, gam[:, None] - gam[None, :], 0.0)), 0.0)
        att = tl.dot(q, tl.trans(k), input_precision=PRECISION) * decay
        o = tl.dot(q * tl.exp(gam)[:, None], S, input_precision=PRECISION)
        o += tl.dot(att, u, input_precision=PRECISION)
        tl.store(
            o_rows + offs_t[:, None] * H * V + offs_v[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=tmask[:, None] & vmask[None, :],
        )

        e_lo = tl.load(erange_ptr + c)
        e_hi = tl.load(erange_ptr + c + 1)
        for e in range(e_lo, e_hi):
            m = tl.load(epos_ptr + e) - 1  # local index of the emit's last token
            g_m = tl.sum(tl.where(rows == m, gam, 0.0))
            upto = rows <= m
            coef = tl.where(upto, tl.exp(tl.where(upto, g_m - gam, 0.0)), 0.0)
            S_m = tl.exp(g_m) * S + tl.dot(
                tl.trans(k * coef[:, None]), u, input_precision=PRECISION
            )
            e_offs = e * s_emit + e_head * K * V + offs_k[:, None] * V + offs_v[None, :]
            tl.store(emit_ptr + e_offs, S_m, mask=smask)  # e is int64

        g_last = tl.sum(tl.where(rows == BT - 1, gam, 0.0))
        k_end = k * tl.exp(g_last - gam)[:, None]
        S = tl.exp(g_last) * S + tl.dot(tl.trans(k_end), u, input_precision=PRECISION)
    tl.store(hT_ptr + s_offs, S, mask=smask)


@triton.jit  # type: ignore[untyped-decorator]
def _step_kernel(  # type: ignore[no-untyped-def]
    state_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr,
    H, K, V, scale,
    ssb, ssh, ssk, ssv, sqb, sqh, sqk, skb, skh, skk, svb, svh, svv, sgb, sgh, sbb, sbh,
    USE_L2: tl.constexpr, EPS: tl.constexpr, KP: tl.constexpr, BV: tl.constexpr,
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
    q = q.to(tl.float32)
    k = k.to(tl.float32)
    if USE_L2:
        q = q * tl.rsqrt(tl.sum(q * q, axis=0) + EPS)
        k = k * tl.rsqrt(tl.sum(k * k, axis=0) + EPS)
    q = q * scale
    v = tl.load(v_ptr + i_b * svb + i_h * svh + offs_v * svv, mask=vmask, other=0.0)
    g = tl.load(g_ptr + i_b * sgb + i_h * sgh).to(tl.float32)
    beta = tl.load(beta_ptr + i_b * sbb + i_h * sbh).to(tl.float32)

    s_ptrs = state_ptr + i_b * ssb + i_h * ssh + offs_k[:, None] * ssk + offs_v[None, :] * ssv
    S = tl.load(s_ptrs, mask=smask, other=0.0).to(tl.float32) * tl.exp(g)
    delta = (v.to(tl.float32) - tl.sum(S * k[:, None], axis=0)) * beta
    S = S + k[:, None] * delta[None, :]
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=smask)
    o = tl.sum(S * q[:, None], axis=0)
    tl.store(o_ptr + pid_bh * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=vmask)


def gated_delta_chunk_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule over a prefill (Triton), resuming from a state and emitting
    states in the same pass.

    Args:
        q, k: [b, L, H, K]; v: [b, L, H, V]; g, beta: [b, L, H] (any float dtypes, any
            strides); H counts value heads (grouped key heads are expanded by the caller).
        chunk_size: tokens per chunk, rounded up to a power of two >= 16.
        initial_state: [b, H, K, V] state before the first token, or None (zeros).
        emit_at: sorted, distinct positions p (1 <= p <= L): return the state after the
            first p tokens.
        use_qk_l2norm: L2-normalise q and k over K (eps 1e-6) before use.

    Returns:
        o: [b, L, H, V] in q.dtype.
        final_state: [b, H, K, V] float32.
        emitted: [len(emit_at), b, H, K, V] float32.

    Raises ValueError on bad shapes, chunk_size < 1 or bad emit positions, like the reference.
    """
    b, L, H, K, V = check_gated_delta_shapes(q, k, v, g, beta, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    positions = check_positions(emit_at, L)
    dev = q.device
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    if L == 0 or b * H * K * V == 0:  # nothing to launch: no tokens, or an empty state
        final = torch.zeros(b, H, K, V, dtype=torch.float32, device=dev) if h0 is None else h0
        emitted_0 = final.expand(len(positions), b, H, K, V).clone()
        return torch.zeros(b, L, H, V, dtype=q.dtype, device=dev), final.clone(), emitted_0

    BT = max(MIN_BLOCK, int(triton.next_power_of_2(chunk_size)))
    KP = block_k(K)
    nc = triton.cdiv(L, BT)
    Lp = nc * BT
    w = torch.empty(b * H, Lp, K, dtype=torch.float32, device=dev)
    u = torch.empty(b * H, Lp, V, dtype=torch.float32, device=dev)
    o = torch.empty(b, L, H, V, dtype=q.dtype, device=dev)
    final = torch.empty(b, H, K, V, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(positions), b, H, K, V, dtype=torch.float32, device=dev)
    chunk_of = [(p - 1) // BT for p in positions]
    erange = [bisect.bisect_left(chunk_of, c) for c in range(nc + 1)]
    local = [p - c * BT for p, c in zip(positions, chunk_of, strict=True)]
    epos = torch.tensor(local or [0], dtype=torch.int32, device=dev)
    erange_t = torch.tensor(erange, dtype=torch.int64, device=dev)  # int64 loop index
    # [BT, KP] q/k/w tiles and the [KP, BV] state: more warps for wide heads (fewer spills).
    warps = 4 if KP * BT <= 4096 else 8
    common = {"USE_L2": bool(use_qk_l2norm), "EPS": L2_EPS, "BT": BT, "KP": KP, "BV": _BV,
              "PRECISION": "ieee", "num_warps": warps, "VARLEN": False}  # fmt: skip
    with device_guard(q):
        _wy_kernel[(nc, b * H)](
            k, v, g, beta, w, u, epos, epos,
            L, H, K, V, Lp,
            *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
            **common,
        )  # fmt: skip
        _state_kernel[(triton.cdiv(V, _BV), b * H)](
            q, k, g, w, u, final if h0 is None else h0, o, final, emitted, epos, erange_t,
            epos, epos, epos,
            L, H, K, V, Lp, K**-0.5,
            *q.stride(), *k.stride(), *g.stride(), L * H * V, b * H * K * V,
            HAS_H0=h0 is not None, **common,
        )  # fmt: skip
    return o, final, emitted


def gated_delta_step_triton(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """One decode token of the gated delta rule per sequence (Triton); ``state`` in place.

    Args:
        state: [b, H, K, V] (float32; any strides, e.g. rows of a cache), updated in place.
        q, k: [b, H, K]; v: [b, H, V]; g, beta: [b, H] (any strides and float dtypes).
        use_qk_l2norm: L2-normalise q and k over K (eps 1e-6) before use.

    Returns:
        o: [b, H, V] in q.dtype, read from the updated state (computed in float32).
    """
    b, H, K, V = check_step_shapes(state, q, k, v, g, beta)
    o = torch.empty(b, H, V, dtype=q.dtype, device=q.device)
    if b == 0 or H == 0 or V == 0:
        return o
    with device_guard(q):
        _step_kernel[(triton.cdiv(V, _BV), b * H)](
            state, q, k, v, g, beta, o,
            H, K, V, K**-0.5,
            *state.stride(), *q.stride(), *k.stride(), *v.stride(), *g.stride(),
            *beta.stride(),
            USE_L2=bool(use_qk_l2norm), EPS=L2_EPS, KP=block_k(K), BV=_BV,
        )  # fmt: skip
    return o


def gated_delta_chunk_varlen_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    chunk_size: int = 64,
    initial_states: torch.Tensor | None = None,
    emit_at: Sequence[Sequence[int]] = (),
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`gated_delta_chunk_varlen_ref`, in the same two launches as
    one sequence: the sequences are cut into chunks of their own (a chunk never spans
    two), the WY pass runs every chunk of every sequence in parallel, and the state pass
    has one program row per (sequence, head) walking its sequence's chunks from its own
    state. The host lists each chunk's first token and length, each sequence's chunk
    range, and each chunk's emit positions (local to the chunk)."""
    H, K, V, cu, emits = check_delta_varlen(q, k, v, g, beta, initial_states, cu_seqlens, emit_at)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n_seq, total = len(cu) - 1, q.shape[0]
    dev = q.device
    BT = max(MIN_BLOCK, int(triton.next_power_of_2(chunk_size)))
    KP = block_k(K)
    table = ChunkTable.of(cu, emits, BT)
    nc = len(table.starts)
    h0 = None if initial_states is None else initial_states.to(torch.float32).contiguous()
    o = torch.zeros(total, H, V, dtype=q.dtype, device=dev)
    final = torch.empty(n_seq, H, K, V, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(table.epos), H, K, V, dtype=torch.float32, device=dev)
    if n_seq == 0 or H * K * V == 0:
        return o, torch.zeros_like(final) if h0 is None else h0.clone(), emitted.zero_()
    Lp = max(nc, 1) * BT
    w = torch.empty(H, Lp, K, dtype=torch.float32, device=dev)
    u = torch.empty(H, Lp, V, dtype=torch.float32, device=dev)

    cstart, clen, crange_t, erange_t, epos_t = table.tensors(dev)
    warps = 4 if KP * BT <= 4096 else 8
    common = {"USE_L2": bool(use_qk_l2norm), "EPS": L2_EPS, "BT": BT, "KP": KP, "BV": _BV,
              "PRECISION": "ieee", "num_warps": warps, "VARLEN": True}  # fmt: skip
    with device_guard(q):
        if nc:
            _wy_kernel[(nc, H)](
                k, v, g, beta, w, u, cstart, clen,
                total, H, K, V, Lp,
                0, *k.stride(), 0, *v.stride(), 0, *g.stride(), 0, *beta.stride(),
                **common,
            )  # fmt: skip
        _state_kernel[(triton.cdiv(V, _BV), n_seq * H)](
            q, k, g, w, u, final if h0 is None else h0, o, final, emitted, epos_t, erange_t,
            cstart, clen, crange_t,
            total, H, K, V, Lp, K**-0.5,
            0, *q.stride(), 0, *k.stride(), 0, *g.stride(), 0, H * K * V,
            HAS_H0=h0 is not None, **common,
        )  # fmt: skip
    return o, final, emitted
