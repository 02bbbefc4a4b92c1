"""Mamba-1 selective scan as a Triton kernel, resuming from a state and emitting states.

Same contract as :func:`marconi_kernels.selective_scan.selective_scan_ref`; per channel d and
state index n (delta already biased and softplus'd):

    h_t = exp(delta_t * A[d, n]) * h_{t-1} + delta_t * u_t * B_t[n]
    y_t = sum_n h_t[n] * C_t[n] + D[d] * u_t          (then y_t *= silu(z_t) if z given)

Design. The grid is (channel blocks of ``_BLOCK_D``, batch). Each program keeps its
[_BLOCK_D, NP] state tile in registers (NP = N padded to a power of two; padded lanes have
A = B = C = 0 and stay zero) and walks the tokens in order. It is chunked because the inputs are
[b, Dm, L] with the token axis innermost: loading one token at a time would be a strided
gather per step, while a [_BLOCK_D, _CHUNK] tile reads ``_CHUNK`` contiguous tokens per channel.
Everything that is not sequential (delta bias + softplus, delta * u, the D skip and the silu(z)
gate) is computed on the whole chunk tile at once; the per-token loop only selects column i of
the tiles (a masked row sum), updates the state and writes column i of a y tile, which is stored
once per chunk. Tokens past L in the last chunk get delta = 0, so they leave the state as is.

Emission. The host maps each token to the slot of the (deduplicated) emit position it ends, or
-1 (an int32 array padded to whole chunks); after token t the program stores its state tile
into ``emitted[slot[t]]`` when that slot is >= 0. Duplicated positions are expanded on the
host. All math is float32; y is cast to u.dtype on store and states are float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ._util import check_emit_at
from .selective_scan import check_scan_varlen
from .triton_runtime import device_guard

_BLOCK_D = 32  # channels per program
_CHUNK = 16  # tokens loaded per tile


@triton.jit  # type: ignore[untyped-decorator]
def _scan_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations
    u_ptr,
    dt_ptr,
    z_ptr,
    b_ptr,
    c_ptr,  # [b, Dm, L] x3, [b, N, L] x2 (any strides)
    a_ptr,
    d_ptr,
    bias_ptr,  # [Dm, N] contiguous, [Dm], [Dm]
    h0_ptr,
    y_ptr,
    hT_ptr,
    emit_ptr,
    slot_ptr,  # [b, Dm, N], [b, Dm, L], .., [E, b, Dm, N], [Lp]
    start_ptr,
    len_ptr,  # varlen: each sequence's first token and length [S] (int64)
    Dm,
    N,
    L,
    s_ub,
    s_ud,
    s_ut,
    s_db,
    s_dd,
    s_dt,
    s_zb,
    s_zd,
    s_zt,
    s_bb,
    s_bn,
    s_bt,
    s_cb,
    s_cn,
    s_ct,
    s_yb,
    s_yd,
    s_emit,  # elements between consecutive emitted states (b * Dm * N; varlen Dm * N)
    s_emit_b,  # elements between batch rows of one emitted state (Dm * N; varlen 0)
    VARLEN: tl.constexpr,
    HAS_D: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_H0: tl.constexpr,
    SOFTPLUS: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NP: tl.constexpr,
    CHUNK: tl.constexpr,
):
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, NP)
    offs_c = tl.arange(0, CHUNK)
    dmask = offs_d < Dm
    nmask = offs_n < N
    hmask = dmask[:, None] & nmask[None, :]
    d64 = offs_d.to(tl.int64)
    n64 = offs_n.to(tl.int64)
    # [b, Dm, N] row-major offsets of this program's state tile
    tile = d64[:, None] * N + n64[None, :]
    h_offs = pid_b * Dm * N + tile
    if VARLEN:  # pid_b is a sequence of the packed tokens: its own start and length
        tok0 = tl.load(start_ptr + pid_b)
        L = tl.load(len_ptr + pid_b)
    else:
        tok0 = 0

    A = tl.load(a_ptr + d64[:, None] * N + n64[None, :], mask=hmask, other=0.0).to(tl.float32)
    if HAS_H0:
        h = tl.load(h0_ptr + h_offs, mask=hmask, other=0.0).to(tl.float32)
    else:
        h = tl.zeros([BLOCK_D, NP], dtype=tl.float32)
    if HAS_D:
        Dv = tl.load(d_ptr + offs_d, mask=dmask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_d, mask=dmask, other=0.0).to(tl.float32)

    u_rows = u_ptr + pid_b * s_ub + d64 * s_ud + tok0 * s_ut
    dt_rows = dt_ptr + pid_b * s_db + d64 * s_dd + tok0 * s_dt
    z_rows = z_ptr + pid_b * s_zb + d64 * s_zd + tok0 * s_zt
    b_rows = b_ptr + pid_b * s_bb + n64 * s_bn + tok0 * s_bt
    c_rows = c_ptr + pid_b * s_cb + n64 * s_cn + tok0 * s_ct
    y_rows = y_ptr + pid_b * s_yb + d64 * s_yd + tok0

    for c0 in range(0, L, CHUNK):
        offs_t = c0 + offs_c
        tmask = offs_t < L
        xmask = dmask[:, None] & tmask[None, :]
        u = tl.load(u_rows[:, None] + offs_t[None, :] * s_ut, mask=xmask, other=0.0)
        u = u.to(tl.float32)
        dt = tl.load(dt_rows[:, None] + offs_t[None, :] * s_dt, mask=xmask, other=0.0)
        dt = dt.to(tl.float32)
        if HAS_BIAS:
            dt = dt + bias[:, None]
        if SOFTPLUS:  # F.softplus, threshold 20
            dt = tl.where(dt > 20.0, dt, tl.log(1.0 + tl.exp(tl.minimum(dt, 20.0))))
        dt = tl.where(xmask, dt, 0.0)  # padded tokens: decay 1, no input
        du = dt * u
        bmask = nmask[:, None] & tmask[None, :]
        Bt = tl.load(b_rows[:, None] + offs_t[None, :] * s_bt, mask=bmask, other=0.0)
        Bt = Bt.to(tl.float32)  # [NP, CHUNK]
        Ct = tl.load(c_rows[:, None] + offs_t[None, :] * s_ct, mask=bmask, other=0.0)
        Ct = Ct.to(tl.float32)
        y = tl.zeros([BLOCK_D, CHUNK], dtype=tl.float32)
        for i in tl.static_range(CHUNK):  # unrolled: the column selects are static masks
            sel = offs_c == i
            dt_i = tl.sum(tl.where(sel[None, :], dt, 0.0), axis=1)  # [BLOCK_D]
            du_i = tl.sum(tl.where(sel[None, :], du, 0.0), axis=1)
            b_i = tl.sum(tl.where(sel[None, :], Bt, 0.0), axis=1)  # [NP]
            c_i = tl.sum(tl.where(sel[None, :], Ct, 0.0), axis=1)
            h = tl.exp(dt_i[:, None] * A) * h + du_i[:, None] * b_i[None, :]
            y_i = tl.sum(h * c_i[None, :], axis=1)
            y = tl.where(sel[None, :], y_i[:, None], y)
            slot = tl.load(slot_ptr + tok0 + c0 + i)
            if (slot >= 0) & (c0 + i < L):  # past L: another sequence's token (varlen)
                e_offs = slot.to(tl.int64) * s_emit + pid_b * s_emit_b + tile
                tl.store(emit_ptr + e_offs, h, mask=hmask)
        if HAS_D:
            y = y + Dv[:, None] * u
        if HAS_Z:
            z = tl.load(z_rows[:, None] + offs_t[None, :] * s_zt, mask=xmask, other=0.0)
            z = z.to(tl.float32)
            y = y * (z / (1.0 + tl.exp(-z)))
        tl.store(y_rows[:, None] + offs_t[None, :], y.to(y_ptr.dtype.element_ty), mask=xmask)
    tl.store(hT_ptr + h_offs, h, mask=hmask)


def _flags(
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    delta_bias: torch.Tensor | None,
    h0: torch.Tensor | None,
    softplus: bool,
    N: int,
) -> dict[str, object]:
    """The scan kernel's compile-time options for these inputs."""
    return {
        "HAS_D": D is not None, "HAS_Z": z is not None, "HAS_BIAS": delta_bias is not None,
        "HAS_H0": h0 is not None, "SOFTPLUS": bool(softplus), "BLOCK_D": _BLOCK_D,
        "NP": triton.next_power_of_2(max(N, 1)), "CHUNK": _CHUNK,
    }  # fmt: skip


def selective_scan_triton(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = True,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mamba-1 selective scan in one Triton launch, resuming from ``initial_state``.

    Args:
        u, delta: [b, Dm, L] inputs and raw time steps (delta_bias + softplus applied here).
        A: [Dm, N] negative; B, C: [b, N, L]; D: [Dm] or None.
        z: [b, Dm, L] gate (``y *= silu(z)``) or None; delta_bias: [Dm] or None.
        initial_state: [b, Dm, N] state before the first token, or None (zeros).
        emit_at: sorted positions p (1 <= p <= L), duplicates allowed: return the state after
            the first p tokens.

    Returns:
        y: [b, Dm, L] in u.dtype.
        final_state: [b, Dm, N] float32 (always: the kernel computes in float32).
        emitted: [len(emit_at), b, Dm, N] float32, captured during the single pass.

    Tensors may be non-contiguous along any axis of u, delta, z, B and C. Raises ValueError
    on bad shapes or emit positions, like the reference.
    """
    if u.dim() != 3 or delta.shape != u.shape:
        raise ValueError(
            f"u and delta must be [b, Dm, L], got {tuple(u.shape)}, {tuple(delta.shape)}"
        )
    b, Dm, L = u.shape
    if A.dim() != 2 or A.shape[0] != Dm:
        raise ValueError(f"A must be [Dm, N] with Dm = {Dm}, got {tuple(A.shape)}")
    N = A.shape[1]
    if B.shape != (b, N, L) or C.shape != (b, N, L):
        raise ValueError(f"B, C must be {(b, N, L)}, got {tuple(B.shape)}, {tuple(C.shape)}")
    if initial_state is not None and initial_state.shape != (b, Dm, N):
        raise ValueError(f"initial_state must be {(b, Dm, N)}, got {tuple(initial_state.shape)}")
    if z is not None and z.shape != u.shape:
        raise ValueError(f"z must be {(b, Dm, L)}, got {tuple(z.shape)}")
    for name, vec in (("D", D), ("delta_bias", delta_bias)):
        if vec is not None and vec.shape != (Dm,):
            raise ValueError(f"{name} must be [{Dm}], got {tuple(vec.shape)}")
    positions = check_emit_at(emit_at, L)

    dev = u.device
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    if L == 0 or b == 0 or Dm == 0:  # nothing to launch (L == 0 also means no positions)
        final = torch.zeros(b, Dm, N, dtype=torch.float32, device=dev) if h0 is None else h0
        emitted_0 = final.expand(len(positions), b, Dm, N).clone()
        return u.new_zeros((b, Dm, L)), final.clone(), emitted_0

    uniq = sorted(set(positions))
    n_chunks = triton.cdiv(L, _CHUNK)
    slot = torch.full((n_chunks * _CHUNK,), -1, dtype=torch.int32)
    if uniq:
        slot[torch.tensor(uniq) - 1] = torch.arange(len(uniq), dtype=torch.int32)
    slot = slot.to(dev)
    y = torch.empty(b, Dm, L, dtype=u.dtype, device=dev)
    final = torch.empty(b, Dm, N, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(uniq), b, Dm, N, dtype=torch.float32, device=dev)
    A_c = A.contiguous()
    zz = u if z is None else z
    grid = (triton.cdiv(Dm, _BLOCK_D), b)
    with device_guard(u):
        _scan_kernel[grid](
            u,
            delta,
            zz,
            B,
            C,
            A_c,
            u if D is None else D.contiguous(),
            u if delta_bias is None else delta_bias.contiguous(),
            final if h0 is None else h0,
            y,
            final,
            emitted,
            slot,
            slot,
            slot,
            Dm,
            N,
            L,
            *u.stride(),
            *delta.stride(),
            *zz.stride(),
            *B.stride(),
            *C.stride(),
            Dm * L,
            L,
            b * Dm * N,
            Dm * N,
            VARLEN=False,
            **_flags(D, z, delta_bias, h0, delta_softplus, N),
        )
    if len(uniq) != len(positions):  # expand duplicated positions
        slot_of = {p: i for i, p in enumerate(uniq)}
        index = torch.tensor([slot_of[p] for p in positions], device=dev)
        emitted = emitted.index_select(0, index)
    return y, final, emitted


def selective_scan_varlen_triton(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = True,
    initial_states: torch.Tensor | None = None,
    emit_at: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`selective_scan_varlen_ref`, in one launch: the grid's
    second axis is the sequence, each program reading its sequence's first token and
    length and starting from its own state; emitted states land in their (sequence,
    depth) slots, a per-token map over the packed tokens."""
    Dm, N, cu, emits = check_scan_varlen(u, delta, A, B, C, z, initial_states, cu_seqlens, emit_at)
    total = u.shape[1]
    n_seq = len(cu) - 1
    dev = u.device
    h0 = None if initial_states is None else initial_states.to(torch.float32).contiguous()
    uniq = [sorted(set(e)) for e in emits]
    flat = [(s, p) for s in range(n_seq) for p in uniq[s]]
    slot = torch.full((total + _CHUNK,), -1, dtype=torch.int32)
    if flat:
        tokens = torch.tensor([cu[s] + p - 1 for s, p in flat])
        slot[tokens] = torch.arange(len(flat), dtype=torch.int32)
    slot = slot.to(dev)
    y = torch.empty(Dm, total, dtype=u.dtype, device=dev)
    final = torch.empty(n_seq, Dm, N, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(flat), Dm, N, dtype=torch.float32, device=dev)
    starts = torch.tensor(cu[:-1], dtype=torch.int64, device=dev)
    lengths = torch.tensor([cu[s + 1] - cu[s] for s in range(n_seq)], dtype=torch.int64, device=dev)
    zz = u if z is None else z
    if Dm > 0 and n_seq > 0:
        grid = (triton.cdiv(Dm, _BLOCK_D), n_seq)
        with device_guard(u):
            _scan_kernel[grid](
                u, delta, zz, B, C, A.contiguous(),
                u if D is None else D.contiguous(),
                u if delta_bias is None else delta_bias.contiguous(),
                final if h0 is None else h0, y, final, emitted, slot, starts, lengths,
                Dm, N, total,
                0, *u.stride(), 0, *delta.stride(), 0, *zz.stride(), 0, *B.stride(),
                0, *C.stride(),
                0, total, Dm * N, 0,
                VARLEN=True, **_flags(D, z, delta_bias, h0, delta_softplus, N),
            )  # fmt: skip
    index = [flat.index((s, p)) for s in range(n_seq) for p in emits[s]]
    if index != list(range(len(flat))):  # duplicated positions
        emitted = emitted.index_select(0, torch.tensor(index, dtype=torch.long, device=dev))
    return y, final, emitted
