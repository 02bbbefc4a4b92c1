"""Mamba-2 SSD (state-space duality) scan: chunked reference and a token-by-token ground truth.

Recurrence per head h (group g = h // (H // G)), with dt already biased/softplussed/clamped:

    h_t = exp(dt_t * A_h) * h_{t-1} + dt_t * x_t B_t^T          state [P, N]
    y_t = h_t C_t + D_h * x_t                                    output [P]

The chunked form splits the sequence into chunks of ``chunk_size`` tokens: inside a chunk
the output is a masked (decay-weighted) attention-like matmul, across chunks a state is
carried. States at arbitrary positions (``emit_at``) are read off the chunk-start state and
rolled forward over the partial chunk, so no work is redone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import torch

from ._util import Outputs, check_emit_at, check_varlen, compute_dtype, per_sequence, process_dt

_INF = float("inf")


def _check_ssd_shapes(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    initial_state: torch.Tensor | None,
) -> tuple[int, int, int, int, int, int]:
    """Validate SSD argument shapes; return (b, L, H, P, G, N)."""
    if x.dim() != 4:
        raise ValueError(f"x must be [b, L, H, P], got shape {tuple(x.shape)}")
    b, L, H, P = x.shape
    if B.dim() != 4 or B.shape[:2] != (b, L) or B.shape != C.shape:
        raise ValueError(
            f"B, C must be [b, L, G, N] matching x; got {tuple(B.shape)}, {tuple(C.shape)}"
        )
    G, N = B.shape[2], B.shape[3]
    if H % G != 0:
        raise ValueError(f"number of heads {H} is not a multiple of groups {G}")
    if dt.shape != (b, L, H):
        raise ValueError(f"dt must be [b, L, H] = {(b, L, H)}, got {tuple(dt.shape)}")
    if A.shape != (H,):
        raise ValueError(f"A must be [H] = [{H}], got {tuple(A.shape)}")
    if D is not None and D.shape != (H,):
        raise ValueError(f"D must be [H] = [{H}], got {tuple(D.shape)}")
    if initial_state is not None and initial_state.shape != (b, H, P, N):
        raise ValueError(f"initial_state must be {(b, H, P, N)}, got {tuple(initial_state.shape)}")
    return b, L, H, P, G, N


def ssd_chunk_scan_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, _INF),
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked Mamba-2 SSD scan in pure torch (no Python loop over tokens).

    Args:
        x: [b, L, H, P] inputs (any float dtype).
        dt: [b, L, H] raw time steps (before bias/softplus/clamp).
        A: [H] negative decay rates (already ``-exp(A_log)``).
        B, C: [b, L, G, N] input/output projections; head h uses group h // (H // G).
        chunk_size: tokens per chunk (L need not be a multiple: padded internally; a
            sequence shorter than it is one chunk of its own length).
        D: [H] skip weight (``y += D[h] * x``) or None.
        dt_bias: [H] added to dt before softplus, or None.
        dt_softplus: apply softplus to dt.
        dt_limit: (lo, hi) clamp applied after softplus.
        initial_state: [b, H, P, N] (float32) state before the first token, or None (zeros).
        emit_at: sorted positions p (1 <= p <= L) at which to return the state after the
            first p tokens.

    Returns:
        y: [b, L, H, P] in x.dtype.
        final_state: [b, H, P, N] float32 (float64 when inputs are float64).
        emitted: [len(emit_at), b, H, P, N] same dtype as final_state; emitted[i] equals the
            final state of a separate scan over x[:, :emit_at[i]].

    Computation is done in float32 (float64 for float64 inputs).
    """
    b, L, H, P, G, N = _check_ssd_shapes(x, dt, A, B, C, D, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    positions = check_emit_at(emit_at, L)
    cdt = compute_dtype(x, dt, A, B, C, initial_state)
    dev = x.device
    R = H // G
    if initial_state is None:
        state0 = torch.zeros(b, H, P, N, dtype=cdt, device=dev)
    else:
        state0 = initial_state.to(cdt)
    if L == 0:
        return x.clone(), state0.clone(), state0.new_empty((0, b, H, P, N))

    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, cdt)  # [b, L, H]
    xf, Bf, Cf = x.to(cdt), B.to(cdt), C.to(cdt)
    # a sequence shorter than a chunk is one chunk of its own length (the same scan,
    # without padding it to `chunk_size`: a verified speculative step is a few tokens)
    cs = min(chunk_size, L)
    nc = -(-L // cs)
    pad = nc * cs - L
    if pad:
        # Padded tokens get dt = 0: decay 1 and no contribution, so states stay exact.
        xf = torch.nn.functional.pad(xf, (0, 0, 0, 0, 0, pad))
        dtp = torch.nn.functional.pad(dtp, (0, 0, 0, pad))
        Bf = torch.nn.functional.pad(Bf, (0, 0, 0, 0, 0, pad))
        Cf = torch.nn.functional.pad(Cf, (0, 0, 0, 0, 0, pad))

    # Layouts: heads split as (G, R); token axis inside a chunk is `cs`.
    x_t = xf.view(b, nc, cs, G, R, P).permute(0, 1, 3, 4, 2, 5)  # [b, nc, G, R, cs, P]
    dt_t = dtp.view(b, nc, cs, G, R).permute(0, 1, 3, 4, 2)  # [b, nc, G, R, cs]
    Bg = Bf.view(b, nc, cs, G, N).transpose(2, 3)  # [b, nc, G, cs, N]
    Cg = Cf.view(b, nc, cs, G, N).transpose(2, 3)  # [b, nc, G, cs, N]
    dA_cs = torch.cumsum(dt_t * A.to(cdt).view(G, R, 1), dim=-1)  # [b, nc, G, R, cs]

    # 1. Intra-chunk output: y_i = sum_{j<=i} (C_i.B_j) exp(cs_i - cs_j) dt_j x_j.
    #    Zero the upper triangle before exp (it could overflow: inf * 0 = nan) and after it;
    #    two multiplies by a 0/1 mask are cheaper than masked_fill with -inf.
    causal = torch.ones(cs, cs, dtype=cdt, device=dev).tril()
    M = torch.sub(dA_cs.unsqueeze(-1), dA_cs.unsqueeze(-2)).mul_(causal).exp_().mul_(causal)
    M.mul_((Cg @ Bg.transpose(-1, -2)).unsqueeze(3))  # [b, nc, G, R, cs, cs]
    y_diag = M @ (x_t * dt_t.unsqueeze(-1))  # [b, nc, G, R, cs, P]
    del M

    # 2. Each chunk's own contribution to the state at its end (from a zero state).
    w_end = torch.exp(dA_cs[..., -1:] - dA_cs).mul_(dt_t)  # [b, nc, G, R, cs]
    xw = (x_t * w_end.unsqueeze(-1)).transpose(-1, -2).reshape(b, nc, G, R * P, cs)
    chunk_states = (xw @ Bg).view(b, nc, G, R, P, N)

    # 3. Carry states across chunks (loop over chunks, not tokens).
    chunk_decay = torch.exp(dA_cs[..., -1]).view(b, nc, G, R, 1, 1)
    starts = torch.empty(b, nc + 1, G, R, P, N, dtype=cdt, device=dev)
    starts[:, 0] = state0.view(b, G, R, P, N)
    for c in range(nc):
        torch.addcmul(chunk_states[:, c], chunk_decay[:, c], starts[:, c], out=starts[:, c + 1])

    # 4. Output from the carried state: y_i += exp(cs_i) * C_i . h_start.
    s_in = starts[:, :nc].permute(0, 1, 2, 5, 3, 4).reshape(b, nc, G, N, R * P)
    y = (Cg @ s_in).view(b, nc, G, cs, R, P)
    y.mul_(torch.exp(dA_cs).transpose(-1, -2).unsqueeze(-1))
    y.add_(y_diag.transpose(3, 4))
    y = y.transpose(2, 3).reshape(b, nc * cs, H, P)[:, :L]
    if D is not None:
        y = y + D.to(cdt).view(H, 1) * xf[:, :L]

    final_state = starts[:, nc].reshape(b, H, P, N)
    emitted_t = state0.new_empty((len(positions), b, H, P, N))
    for e, p in enumerate(positions):  # each written in place: no stacking copy
        _state_at(p, cs, starts, dA_cs, dt_t, x_t, Bg, emitted_t[e].view(b, G, R, P, N))
    return y.to(x.dtype), final_state.clone(), emitted_t


def _state_at(
    p: int,
    cs: int,
    starts: torch.Tensor,
    dA_cs: torch.Tensor,
    dt_t: torch.Tensor,
    x_t: torch.Tensor,
    Bg: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Write into `out` [b, G, R, P, N] the state after the first p tokens: the
    chunk-start state rolled over the partial chunk (in the compute dtype).

    starts [b, nc+1, G, R, P, N]; dA_cs, dt_t [b, nc, G, R, cs]; x_t [b, nc, G, R, cs, P];
    Bg [b, nc, G, cs, N].
    """
    c, j = divmod(p, cs)
    if j == 0:
        out.copy_(starts[:, c])
        return
    b, _, G, R, P, N = starts.shape
    a = dA_cs[:, c, :, :, :j]  # [b, G, R, j]
    w = torch.exp(a[..., -1:] - a) * dt_t[:, c, :, :, :j]
    xw = (x_t[:, c, :, :, :j] * w.unsqueeze(-1)).transpose(-1, -2).reshape(b, G, R * P, j)
    contrib = (xw @ Bg[:, c, :, :j]).view(b, G, R, P, N)
    torch.addcmul(contrib, torch.exp(a[..., -1]).view(b, G, R, 1, 1), starts[:, c], out=out)


def ssd_naive_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, _INF),
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-by-token SSD recurrence; ground truth for tests (slow: loops over L).

    Same signature, shapes and dtypes as :func:`ssd_chunk_scan_ref` (``chunk_size`` is
    accepted and ignored): x [b, L, H, P], dt [b, L, H], A [H], B/C [b, L, G, N], D [H],
    initial_state [b, H, P, N]. Returns (y [b, L, H, P] in x.dtype, final_state
    [b, H, P, N] float32/float64, emitted [len(emit_at), b, H, P, N]).
    """
    del chunk_size
    b, L, H, P, G, N = _check_ssd_shapes(x, dt, A, B, C, D, initial_state)
    counts = Counter(check_emit_at(emit_at, L))
    cdt = compute_dtype(x, dt, A, B, C, initial_state)
    R = H // G
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, cdt)
    xf = x.to(cdt)
    Bh = B.to(cdt).repeat_interleave(R, dim=2)  # [b, L, H, N]
    Ch = C.to(cdt).repeat_interleave(R, dim=2)
    Af = A.to(cdt)
    if initial_state is None:
        h = torch.zeros(b, H, P, N, dtype=cdt, device=x.device)
    else:
        h = initial_state.to(cdt).clone()
    ys: list[torch.Tensor] = []
    emitted: list[torch.Tensor] = []
    for t in range(L):
        dt_cur = dtp[:, t]  # [b, H]
        decay = torch.exp(dt_cur * Af)[..., None, None]
        h = decay * h + (dt_cur[..., None] * xf[:, t])[..., None] * Bh[:, t, :, None, :]
        y_t = (h * Ch[:, t, :, None, :]).sum(-1)  # [b, H, P]
        if D is not None:
            y_t = y_t + D.to(cdt)[:, None] * xf[:, t]
        ys.append(y_t)
        emitted.extend(h.clone() for _ in range(counts.get(t + 1, 0)))
    y = torch.stack(ys, dim=1) if ys else xf.clone()
    emitted_t = torch.stack(emitted) if emitted else h.new_empty((0, b, H, P, N))
    return y.to(x.dtype), h, emitted_t


def check_ssd_varlen(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    initial_states: torch.Tensor | None,
    cu_seqlens: Sequence[int],
    emit_at: Sequence[Sequence[int]],
) -> tuple[int, int, int, int, list[int], list[list[int]]]:
    """Validate a varlen SSD scan's arguments (see `ssd_chunk_scan_varlen_ref`); returns
    (H, P, G, N, cu_seqlens, each sequence's emit positions)."""
    if x.dim() != 3:
        raise ValueError(f"x must be [T, H, P], got shape {tuple(x.shape)}")
    _, total, H, P, G, N = _check_ssd_shapes(x[None], dt[None], A, B[None], C[None], D, None)
    cu, emits = check_varlen(cu_seqlens, total, emit_at, initial_states, (H, P, N))
    return H, P, G, N, cu, emits


def ssd_chunk_scan_varlen_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, _INF),
    initial_states: torch.Tensor | None = None,
    emit_at: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`ssd_chunk_scan_ref` of S sequences packed one after another.

    Args:
        x: [T, H, P]; dt: [T, H]; B, C: [T, G, N]; sequence s at rows
            cu_seqlens[s]:cu_seqlens[s + 1] (S + 1 host ints rising from 0 to T). A,
            chunk_size, D, dt_bias, dt_softplus, dt_limit: as `ssd_chunk_scan_ref`.
        initial_states: [S, H, P, N] each sequence's state before it, or None (zeros).
        emit_at: S lists of sorted positions p, 1 <= p <= L_s (or none at all).

    Returns:
        y: [T, H, P] in x.dtype; final_states: [S, H, P, N]; emitted: [E, H, P, N],
        sequence by sequence in emit order. Each sequence is scanned alone from its state
        (the reference: a loop over the sequences).
    """
    *_, cu, emits = check_ssd_varlen(x, dt, A, B, C, D, initial_states, cu_seqlens, emit_at)

    def run(rows: slice, state: torch.Tensor | None, e: list[int]) -> Outputs:
        return ssd_chunk_scan_ref(
            x[None, rows], dt[None, rows], A, B[None, rows], C[None, rows],
            chunk_size=chunk_size, D=D, dt_bias=dt_bias, dt_softplus=dt_softplus,
            dt_limit=dt_limit, initial_state=state, emit_at=e,
        )  # fmt: skip

    return per_sequence(cu, emits, initial_states, run)
