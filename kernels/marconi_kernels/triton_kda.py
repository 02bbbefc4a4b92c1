"""KDA (the gated delta rule with a per-channel decay) as Triton kernels: chunked prefill
with state emission (one sequence, or several packed), and the in-place decode step.

Same contracts as :func:`marconi_kernels.kda.kda_chunk_ref`, `kda_chunk_varlen_ref` and
`kda_step_ref`; the chunked (WY) form is described in :mod:`marconi_kernels.kda`, the
kernel layout follows :mod:`marconi_kernels.triton_gated_delta`. Everything is computed in
float32 with IEEE-precision ``tl.dot``.

Prefill, two launches:

* ``_wy_kernel``, one program per (chunk, batch x head), all chunks in parallel: loads the
  chunk's normalised q and k and its log decays g [BT, K], cumulates them per channel
  (gamma), forms the pairwise decays exp(gamma_i - gamma_j) over [BT, BT, K] (exponents
  <= 0 only: exact under any decay), and from them A_ij = beta_i sum_c k_ic k_jc
  exp(gamma_ic - gamma_jc) (i > j) and the decayed causal scores P_ij = sum_c q_ic k_jc
  exp(gamma_ic - gamma_jc) (i >= j). It inverts I + A by forward substitution and stores
  W = T (beta exp(gamma) * k) [BT, K], U0 = T (beta v) [BT, V] and P [BT, BT] into float32
  scratch.
* ``_state_kernel``, one program per (V block, batch x head), walks the chunks in order
  with its [K, BV] state tile: U = U0 - W S, o = (exp(gamma) * q) S + P U, then
  S = exp(gamma_last)[:, None] * S + (k * exp(gamma_last - gamma))^T U; for each emit
  position m inside the chunk it stores exp(gamma_m)[:, None] * S + (k decayed to m, rows
  <= m)^T U.

The chunk is always ``BT = 16`` tokens (whatever ``chunk_size`` asks, which only has to be
>= 1): the [BT, BT, K] pairwise decays grow with the square of the chunk, and results do
not depend on the chunk length beyond rounding. Tokens past the end load as zeros (g =
beta = k = v = 0): decay 1 and no write.

Decode: ``_step_kernel``, one program per (V block, batch x head), updates its [K, BV]
slice of the state in place (any strides): decay per key row, delta-rule write, read-out.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from .chunk_table import ChunkTable
from .gated_delta import L2_EPS, check_positions
from .kda import check_kda_shapes, check_kda_step_shapes, check_kda_varlen
from .triton_gated_delta import _l2norm_rows, _load_rows
from .triton_runtime import device_guard
from .triton_tiles import block_k

_BV = 32  # value columns per program
_BT = 16  # tokens per chunk (tl.dot's minimum; see the module docstring)


@triton.jit  # type: ignore[untyped-decorator]
def _wy_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, w_ptr, u_ptr, p_ptr, cstart_ptr, clen_ptr,
    L, H, K, V, Lp,
    sqb, sqt, sqh, sqk, skb, skt, skh, skk, svb, svt, svh, svv, sgb, sgt, sgh, sgk,
    sbb, sbt, sbh, scale,
    USE_L2: tl.constexpr, EPS: tl.constexpr, BT: tl.constexpr, KP: tl.constexpr,
    BV: tl.constexpr, PRECISION: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    pid_c = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    i_b = pid_bh // H
    i_h = pid_bh % H
    rows = tl.arange(0, BT)
    if VARLEN:
        tok0 = tl.load(cstart_ptr + pid_c)
        n = tl.load(clen_ptr + pid_c)
    else:
        tok0 = pid_c * BT
        n = L - tok0
    offs_t = tok0 + rows
    tmask = rows < n
    offs_k = tl.arange(0, KP)
    kmask = offs_k < K

    q = _load_rows(q_ptr + i_b * sqb + i_h * sqh, offs_t, tmask, offs_k, kmask, sqt, sqk)
    k = _load_rows(k_ptr + i_b * skb + i_h * skh, offs_t, tmask, offs_k, kmask, skt, skk)
    if USE_L2:
        q = _l2norm_rows(q, EPS)
        k = _l2norm_rows(k, EPS)
    q = q * scale
    g = _load_rows(g_ptr + i_b * sgb + i_h * sgh, offs_t, tmask, offs_k, kmask, sgt, sgk)
    gam = tl.cumsum(g, 0)  # [BT, KP]
    beta = tl.load(beta_ptr + i_b * sbb + i_h * sbh + offs_t * sbt, mask=tmask, other=0.0)
    beta = beta.to(tl.float32)

    incl = rows[:, None] >= rows[None, :]
    lower = rows[:, None] > rows[None, :]
    diff = gam[:, None, :] - gam[None, :, :]  # [BT, BT, KP]: gamma_i - gamma_j
    decay = tl.exp(tl.where(incl[:, :, None], diff, 0.0))
    kd = k[None, :, :] * decay  # k_j decayed to row i
    kb = k * beta[:, None]
    A = tl.where(lower, tl.sum(kb[:, None, :] * kd, axis=2), 0.0)
    P = tl.where(incl, tl.sum(q[:, None, :] * kd, axis=2), 0.0)
    # T = (I + A)^-1, row by row (rows not yet computed are identity rows; A_ij = 0, j >= i).
    T = tl.where(rows[:, None] == rows[None, :], 1.0, 0.0)
    for i in range(1, BT):
        a_i = tl.sum(tl.where(rows[:, None] == i, A, 0.0), axis=0)
        t_i = tl.where(rows == i, 1.0, 0.0) - tl.sum(a_i[:, None] * T, axis=0)
        T = tl.where(rows[:, None] == i, t_i[None, :], T)

    base = pid_bh * Lp + pid_c * BT
    w = tl.dot(T, kb * tl.exp(gam), input_precision=PRECISION)
    tl.store(w_ptr + (base + rows[:, None]) * K + offs_k[None, :], w, mask=kmask[None, :])
    tl.store(p_ptr + (base + rows[:, None]) * BT + rows[None, :], P)
    v_rows = v_ptr + i_b * svb + i_h * svh
    for v0 in range(0, V, BV):
        offs_v = v0 + tl.arange(0, BV)
        vmask = offs_v < V
        vt = _load_rows(v_rows, offs_t, tmask, offs_v, vmask, svt, svv)
        u = tl.dot(T, vt * beta[:, None], input_precision=PRECISION)
        tl.store(u_ptr + (base + rows[:, None]) * V + offs_v[None, :], u, mask=vmask[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _state_kernel(  # type: ignore[no-untyped-def]
    q_ptr, k_ptr, g_ptr, w_ptr, u_ptr, p_ptr, h0_ptr, o_ptr, hT_ptr, emit_ptr, epos_ptr,
    erange_ptr, cstart_ptr, clen_ptr, crange_ptr,
    L, H, K, V, Lp, scale,
    sqb, sqt, sqh, sqk, skb, skt, skh, skk, sgb, sgt, sgh, sgk, s_ob, s_emit,
    USE_L2: tl.constexpr, EPS: tl.constexpr, HAS_H0: tl.constexpr, BT: tl.constexpr,
    KP: tl.constexpr, BV: tl.constexpr, PRECISION: tl.constexpr, VARLEN: tl.constexpr,
):  # fmt: skip
    pid_v = tl.program_id(0)
    pid_bh = tl.program_id(1).to(tl.int64)
    i_b = pid_bh // H
    i_h = pid_bh % H
    if VARLEN:
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
    s_offs = pid_bh * K * V + offs_k[:, None] * V + offs_v[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + s_offs, mask=smask, other=0.0)
    else:
        S = tl.zeros([KP, BV], dtype=tl.float32)

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
        gam = tl.cumsum(_load_rows(g_rows, offs_t, tmask, offs_k, kmask, sgt, sgk), 0)
        row0 = scratch + c * BT + rows[:, None]
        w = tl.load(w_ptr + row0 * K + offs_k[None, :], mask=kmask[None, :], other=0.0)
        u = tl.load(u_ptr + row0 * V + offs_v[None, :], mask=vmask[None, :], other=0.0)
        P = tl.load(p_ptr + row0 * BT + rows[None, :])
        u = u - tl.dot(w, S, input_precision=PRECISION)

        o = tl.dot(q * tl.exp(gam), S, input_precision=PRECISION)
        o += tl.dot(P, u, input_precision=PRECISION)
        tl.store(
            o_rows + offs_t[:, None] * H * V + offs_v[None, :],
            o.to(o_ptr.dtype.element_ty),
            mask=tmask[:, None] & vmask[None, :],
        )

        e_lo = tl.load(erange_ptr + c)
        e_hi = tl.load(erange_ptr + c + 1)
        for e in range(e_lo, e_hi):
            m = tl.load(epos_ptr + e) - 1
            g_m = tl.sum(tl.where(rows[:, None] == m, gam, 0.0), axis=0)  # [KP]
            upto = (rows <= m)[:, None]
            coef = tl.where(upto, tl.exp(tl.where(upto, g_m[None, :] - gam, 0.0)), 0.0)
            S_m = tl.exp(g_m)[:, None] * S + tl.dot(
                tl.trans(k * coef), u, input_precision=PRECISION
            )
            e_offs = e * s_emit + e_head * K * V + offs_k[:, None] * V + offs_v[None, :]
            tl.store(emit_ptr + e_offs, S_m, mask=smask)

        g_last = tl.sum(tl.where(rows[:, None] == BT - 1, gam, 0.0), axis=0)  # [KP]
        k_end = k * tl.exp(g_last[None, :] - gam)
        S = tl.exp(g_last)[:, None] * S + tl.dot(tl.trans(k_end), u, input_precision=PRECISION)
    tl.store(hT_ptr + s_offs, S, mask=smask)


@triton.jit  # type: ignore[untyped-decorator]
def _step_kernel(  # type: ignore[no-untyped-def]
    state_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr,
    H, K, V, scale,
    ssb, ssh, ssk, ssv, sqb, sqh, sqk, skb, skh, skk, svb, svh, svv, sgb, sgh, sgk, sbb, sbh,
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
    g = tl.load(g_ptr + i_b * sgb + i_h * sgh + offs_k * sgk, mask=kmask, other=0.0)
    beta = tl.load(beta_ptr + i_b * sbb + i_h * sbh).to(tl.float32)

    s_ptrs = state_ptr + i_b * ssb + i_h * ssh + offs_k[:, None] * ssk + offs_v[None, :] * ssv
    S = tl.load(s_ptrs, mask=smask, other=0.0).to(tl.float32) * tl.exp(g.to(tl.float32))[:, None]
    delta = (v.to(tl.float32) - tl.sum(S * k[:, None], axis=0)) * beta
    S = S + k[:, None] * delta[None, :]
    tl.store(s_ptrs, S.to(state_ptr.dtype.element_ty), mask=smask)
    o = tl.sum(S * q[:, None], axis=0)
    tl.store(o_ptr + pid_bh * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=vmask)


def kda_chunk_triton(
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
    """Chunked KDA over a prefill (Triton), resuming from a state and emitting states.

    Args:
        q, k, g: [b, L, H, K]; v: [b, L, H, V]; beta: [b, L, H] (any float dtypes and
            strides).
        chunk_size: must be >= 1; the kernels run 16-token chunks (module docstring).
        initial_state: [b, H, K, V] state before the first token, or None (zeros).
        emit_at: sorted, distinct positions p (1 <= p <= L): the state after p tokens.
        use_qk_l2norm: L2-normalise q and k over K (eps 1e-6) before use.

    Returns:
        o [b, L, H, V] in q.dtype, final_state [b, H, K, V] float32, emitted
        [len(emit_at), b, H, K, V] float32. ValueError on bad input, like the reference.
    """
    b, L, H, K, V = check_kda_shapes(q, k, v, g, beta, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    positions = check_positions(emit_at, L)
    dev = q.device
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    if L == 0 or b * H * K * V == 0:
        final = torch.zeros(b, H, K, V, dtype=torch.float32, device=dev) if h0 is None else h0
        emitted_0 = final.expand(len(positions), b, H, K, V).clone()
        return torch.zeros(b, L, H, V, dtype=q.dtype, device=dev), final.clone(), emitted_0

    BT, KP = _BT, block_k(K)
    nc = triton.cdiv(L, BT)
    Lp = nc * BT
    w = torch.empty(b * H, Lp, K, dtype=torch.float32, device=dev)
    u = torch.empty(b * H, Lp, V, dtype=torch.float32, device=dev)
    p = torch.empty(b * H, Lp, BT, dtype=torch.float32, device=dev)
    o = torch.empty(b, L, H, V, dtype=q.dtype, device=dev)
    final = torch.empty(b, H, K, V, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(positions), b, H, K, V, dtype=torch.float32, device=dev)
    chunk_of = [(pos - 1) // BT for pos in positions]
    erange = [bisect.bisect_left(chunk_of, c) for c in range(nc + 1)]
    local = [pos - c * BT for pos, c in zip(positions, chunk_of, strict=True)]
    epos = torch.tensor(local or [0], dtype=torch.int32, device=dev)
    erange_t = torch.tensor(erange, dtype=torch.int64, device=dev)
    common = {"USE_L2": bool(use_qk_l2norm), "EPS": L2_EPS, "BT": BT, "KP": KP, "BV": _BV,
              "PRECISION": "ieee", "num_warps": 4, "VARLEN": False}  # fmt: skip
    with device_guard(q):
        _wy_kernel[(nc, b * H)](
            q, k, v, g, beta, w, u, p, epos, epos,
            L, H, K, V, Lp,
            *q.stride(), *k.stride(), *v.stride(), *g.stride(), *beta.stride(), K**-0.5,
            **common,
        )  # fmt: skip
        _state_kernel[(triton.cdiv(V, _BV), b * H)](
            q, k, g, w, u, p, final if h0 is None else h0, o, final, emitted, epos, erange_t,
            epos, epos, epos,
            L, H, K, V, Lp, K**-0.5,
            *q.stride(), *k.stride(), *g.stride(), L * H * V, b * H * K * V,
            HAS_H0=h0 is not None, **common,
        )  # fmt: skip
    return o, final, emitted


def kda_step_triton(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """One decode token of KDA per sequence (Triton); ``state`` [b, H, K, V] (float32, any
    strides) is updated in place. q, k, g [b, H, K]; v [b, H, V]; beta [b, H].
    Returns o [b, H, V] in q.dtype (computed in float32)."""
    b, H, K, V = check_kda_step_shapes(state, q, k, v, g, beta)
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


def kda_chunk_varlen_triton(
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
    """Same contract as :func:`kda_chunk_varlen_ref`, in the same two launches as one
    sequence: each sequence cut into chunks of its own (`ChunkTable`), the WY pass over
    every chunk in parallel, the state pass one program row per (sequence, head)."""
    H, K, V, cu, emits = check_kda_varlen(q, k, v, g, beta, initial_states, cu_seqlens, emit_at)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n_seq, total = len(cu) - 1, q.shape[0]
    dev = q.device
    BT, KP = _BT, block_k(K)
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
    p = torch.empty(H, Lp, BT, dtype=torch.float32, device=dev)
    cstart, clen, crange_t, erange_t, epos_t = table.tensors(dev)
    common = {"USE_L2": bool(use_qk_l2norm), "EPS": L2_EPS, "BT": BT, "KP": KP, "BV": _BV,
              "PRECISION": "ieee", "num_warps": 4, "VARLEN": True}  # fmt: skip
    with device_guard(q):
        if nc:
            _wy_kernel[(nc, H)](
                q, k, v, g, beta, w, u, p, cstart, clen,
                total, H, K, V, Lp,
                0, *q.stride(), 0, *k.stride(), 0, *v.stride(), 0, *g.stride(),
                0, *beta.stride(), K**-0.5,
                **common,
            )  # fmt: skip
        _state_kernel[(triton.cdiv(V, _BV), n_seq * H)](
            q, k, g, w, u, p, final if h0 is None else h0, o, final, emitted, epos_t,
            erange_t, cstart, clen, crange_t,
            total, H, K, V, Lp, K**-0.5,
            0, *q.stride(), 0, *k.stride(), 0, *g.stride(), 0, H * K * V,
            HAS_H0=h0 is not None, **common,
        )  # fmt: skip
    return o, final, emitted
