"""Mamba-1 selective scan with an initial state and state emission (Jamba-style layers).

transformers' pure-torch Mamba-1 path cannot resume from a state; this one can. The
recurrence per channel d and state index n:

    h_t = exp(delta_t * A[d, n]) * h_{t-1} + delta_t * u_t * B_t[n]
    y_t = sum_n h_t[n] * C_t[n] + D[d] * u_t          (then y_t *= silu(z_t) if z given)

The decay and input terms are precomputed for a block of tokens with vectorised ops, so the
per-token loop is one fused multiply-add; blocks bound the memory to O(block * Dm * N).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._util import Outputs, check_emit_at, check_varlen, compute_dtype, per_sequence, process_dt

_BLOCK = 256  # tokens whose [T, b, Dm, N] terms are materialised at once


def selective_scan_ref(
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
    """Mamba-1 selective scan over a sequence, resuming from ``initial_state``.

    Args:
        u, delta: [b, Dm, L] inputs and raw time steps (delta_bias + softplus applied here).
        A: [Dm, N] negative; B, C: [b, N, L]; D: [Dm] or None.
        z: [b, Dm, L] gate (``y *= silu(z)``) or None; delta_bias: [Dm] or None.
        initial_state: [b, Dm, N] float32 state before the first token, or None (zeros).
        emit_at: sorted positions p (1 <= p <= L): return the state after the first p tokens.

    Returns:
        y: [b, Dm, L] in u.dtype.
        final_state: [b, Dm, N] float32 (float64 for float64 inputs).
        emitted: [len(emit_at), b, Dm, N], captured during the single pass.
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
    positions = check_emit_at(emit_at, L)
    cdt = compute_dtype(u, delta, A, B, C, initial_state)
    if initial_state is None:
        h = torch.zeros(b, Dm, N, dtype=cdt, device=u.device)
    else:
        h = initial_state.to(cdt).clone()

    d = process_dt(delta.transpose(1, 2), delta_bias, delta_softplus, dtype=cdt)  # [b, L, Dm]
    uf = u.to(cdt).transpose(1, 2)  # [b, L, Dm]
    Bt = B.to(cdt).permute(2, 0, 1)  # [L, b, N]
    Ct = C.to(cdt).permute(2, 0, 1)
    Af = A.to(cdt)
    y = torch.empty(L, b, Dm, dtype=cdt, device=u.device)
    emitted: list[torch.Tensor] = []
    next_emit = 0
    for t0 in range(0, L, _BLOCK):
        t1 = min(t0 + _BLOCK, L)
        d_blk = d[:, t0:t1].transpose(0, 1)  # [T, b, Dm]
        decay = torch.exp(d_blk.unsqueeze(-1) * Af)  # [T, b, Dm, N]
        # hs starts as delta*u*B and is overwritten in place with the states h_t.
        hs = (d_blk * uf[:, t0:t1].transpose(0, 1)).unsqueeze(-1) * Bt[t0:t1].unsqueeze(2)
        for i in range(t1 - t0):
            h = hs[i].addcmul_(decay[i], h)
            while next_emit < len(positions) and positions[next_emit] == t0 + i + 1:
                emitted.append(h.clone())
                next_emit += 1
        y[t0:t1] = (hs @ Ct[t0:t1].unsqueeze(-1)).squeeze(-1)  # [T, b, Dm]
        h = h.clone()  # detach from the block buffer before it is freed
    y = y.permute(1, 2, 0)  # [b, Dm, L]
    if D is not None:
        y = y + D.to(cdt).unsqueeze(-1) * u.to(cdt)
    if z is not None:
        y = y * F.silu(z.to(cdt))
    emitted_t = torch.stack(emitted) if emitted else h.new_empty((0, b, Dm, N))
    return y.to(u.dtype), h, emitted_t


def check_scan_varlen(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    z: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    cu_seqlens: Sequence[int],
    emit_at: Sequence[Sequence[int]],
) -> tuple[int, int, list[int], list[list[int]]]:
    """Validate a varlen selective scan's arguments (see `selective_scan_varlen_ref`);
    returns (Dm, N, cu_seqlens, each sequence's emit positions)."""
    if u.dim() != 2 or delta.shape != u.shape:
        raise ValueError(f"u and delta must be [Dm, T], got {tuple(u.shape)}, {tuple(delta.shape)}")
    Dm, total = u.shape
    if A.dim() != 2 or A.shape[0] != Dm:
        raise ValueError(f"A must be [Dm, N] with Dm = {Dm}, got {tuple(A.shape)}")
    N = A.shape[1]
    if B.shape != (N, total) or C.shape != (N, total):
        raise ValueError(f"B, C must be {(N, total)}, got {tuple(B.shape)}, {tuple(C.shape)}")
    if z is not None and z.shape != u.shape:
        raise ValueError(f"z must be {(Dm, total)}, got {tuple(z.shape)}")
    cu, emits = check_varlen(cu_seqlens, total, emit_at, initial_states, (Dm, N))
    return Dm, N, cu, emits


def selective_scan_varlen_ref(
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
    """`selective_scan_ref` of S sequences packed one after another.

    Args:
        u, delta, z: [Dm, T]; B, C: [N, T]; sequence s at columns cu_seqlens[s]:[s + 1]
            (S + 1 host ints rising from 0 to T). A, D, delta_bias, delta_softplus: as
            `selective_scan_ref`.
        initial_states: [S, Dm, N] each sequence's state before it, or None (zeros).
        emit_at: S lists of sorted positions p, 1 <= p <= L_s (or none at all).

    Returns:
        y: [Dm, T] in u.dtype; final_states: [S, Dm, N]; emitted: [E, Dm, N], sequence
        by sequence in emit order. Each sequence is scanned alone from its state (the
        reference: a loop over the sequences).
    """
    _, _, cu, emits = check_scan_varlen(u, delta, A, B, C, z, initial_states, cu_seqlens, emit_at)

    def run(cols: slice, state: torch.Tensor | None, e: list[int]) -> Outputs:
        return selective_scan_ref(
            u[None, :, cols], delta[None, :, cols], A, B[None, :, cols], C[None, :, cols],
            D=D, z=None if z is None else z[None, :, cols], delta_bias=delta_bias,
            delta_softplus=delta_softplus, initial_state=state, emit_at=e,
        )  # fmt: skip

    return per_sequence(cu, emits, initial_states, run, dim=-1)
