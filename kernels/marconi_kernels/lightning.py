"""Lightning attention (MiniMax-Text-01 / MiniMax-M1 linear attention) in pure torch.

Per sequence and head h, with a constant per-head decay rate s_h >= 0 and no delta term,
no normalisation and no scaling of q and k (the callers apply MiniMax's activation):

    S_t = exp(-s_h) S_{t-1} + k_t v_t^T                     state [K, V]
    o_t = S_t^T q_t                                         output [V]

Chunked form. Inside a chunk of C tokens with chunk-start state S_0 and local indices
i, j = 1..C, the state after local token m and the outputs are

    S_m = exp(-s m) S_0 + sum_{j<=m} exp(-s (m - j)) k_j v_j^T
    o_i = exp(-s i) S_0^T q_i + sum_{j<=i} exp(-s (i - j)) (q_i . k_j) v_j

so only the chunk-start states are sequential (one [K, V] update per chunk); a state at
any position (``emit_at``) is its chunk-start state plus the partial sum over the chunk's
first m tokens, exact at any depth without splitting chunks. Padded tokens past L are
given a log-decay of 0 (decay 1) and zero keys and values: they change nothing.

``slope`` [H] holds the rates s_h; the state decays by exp(-slope[h]) per token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._util import (
    Outputs,
    check_qkv,
    check_shape,
    compute_dtype,
    per_sequence,
    start_state,
    token_by_token,
)
from .gated_delta import check_packed, check_positions


def check_lightning_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> tuple[int, int, int, int, int]:
    """Validate prefill shapes (q, k [b, L, H, K], v [b, L, H, V], slope [H], initial_state
    [b, H, K, V] or None); return (b, L, H, K, V)."""
    b, L, H, K, V = check_qkv(q, k, v)
    check_shape("slope", slope, (H,), "[H]")
    check_shape("initial_state", initial_state, (b, H, K, V))
    return b, L, H, K, V


def check_lightning_step_shapes(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor
) -> tuple[int, int, int, int]:
    """Validate decode shapes (state [b, H, K, V], q, k [b, H, K], v [b, H, V], slope [H]);
    return (b, H, K, V)."""
    if state.dim() != 4:
        raise ValueError(f"state must be [b, H, K, V], got {tuple(state.shape)}")
    b, H, K, V = state.shape
    expected = {"q": (b, H, K), "k": (b, H, K), "v": (b, H, V), "slope": (H,)}
    for name, t in (("q", q), ("k", k), ("v", v), ("slope", slope)):
        if t.shape != expected[name]:
            raise ValueError(
                f"{name} must be {expected[name]} for state {tuple(state.shape)}, "
                f"got {tuple(t.shape)}"
            )
    return b, H, K, V


def lightning_chunk_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    *,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Chunked lightning attention over a prefill, resuming from a state and emitting states.

    Args:
        q, k: [b, L, H, K] queries and keys (any float dtype).
        v: [b, L, H, V] values.
        slope: [H] per-head decay rates s_h >= 0 (the state decays by exp(-s_h) a token).
        chunk_size: tokens per chunk (results do not depend on it beyond rounding).
        initial_state: [b, H, K, V] state before the first token (float32), or None (zeros).
        emit_at: sorted, distinct positions p (1 <= p <= L): return the state after the
            first p tokens.

    Returns:
        o: [b, L, H, V] in q.dtype.
        final_state: [b, H, K, V] float32 (float64 when an input is float64).
        emitted: [len(emit_at), b, H, K, V], same dtype as final_state; emitted[i] is the
            final state of a separate call over the first emit_at[i] tokens.

    Raises ValueError on bad shapes, chunk_size < 1 or bad emit positions.
    """
    b, L, H, K, V = check_lightning_shapes(q, k, v, slope, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    positions = check_positions(emit_at, L)
    cdt = compute_dtype(q, k, v, slope, initial_state)
    dev = q.device
    if initial_state is None:
        state0 = torch.zeros(b, H, K, V, dtype=cdt, device=dev)
    else:
        state0 = initial_state.to(cdt)
    if L == 0:
        return q.new_empty((b, 0, H, V)), state0.clone(), state0.new_empty((0, b, H, K, V))

    cs = min(chunk_size, L)
    nc = -(-L // cs)
    pad = nc * cs - L

    def heads_first(t: torch.Tensor) -> torch.Tensor:
        """[b, L, H, D] -> [b, H, nc, cs, D]; padded tokens are zeros."""
        t = F.pad(t.to(cdt).transpose(1, 2), (0, 0, 0, pad))
        return t.reshape(b, H, nc, cs, t.shape[-1])

    qc, kc, vc = heads_first(q), heads_first(k), heads_first(v)
    # per-token log-decay -s_h, 0 on padded tokens; gam: its cumulative sum in a chunk
    g = (-slope.to(cdt)).view(H, 1).expand(H, L)
    gam = F.pad(g, (0, pad)).reshape(H, nc, cs).cumsum(-1).expand(b, H, nc, cs)

    idx = torch.arange(cs, device=dev)
    incl = idx.view(-1, 1) >= idx.view(1, -1)
    decay = (gam.unsqueeze(-1) - gam.unsqueeze(-2)).masked_fill(~incl, 0.0).exp_()
    decay.masked_fill_(~incl, 0.0)  # exp(gamma_i - gamma_j) for j <= i, else 0

    g_last = gam[..., -1:]  # [b, H, nc, 1]
    k_end = kc * (g_last - gam).exp().unsqueeze(-1)  # keys decayed to the chunk end
    writes = k_end.transpose(-1, -2) @ vc  # [b, H, nc, K, V]: each chunk's own sum
    starts = torch.empty(b, H, nc + 1, K, V, dtype=cdt, device=dev)
    starts[:, :, 0] = state0
    for c in range(nc):
        torch.addcmul(
            writes[:, :, c], g_last[:, :, c].exp().unsqueeze(-1), starts[:, :, c],
            out=starts[:, :, c + 1],
        )  # fmt: skip

    o = (qc * gam.exp().unsqueeze(-1)) @ starts[:, :, :nc]
    o += ((qc @ kc.transpose(-1, -2)) * decay) @ vc
    o_out = o.reshape(b, H, nc * cs, V)[:, :, :L].transpose(1, 2).to(q.dtype)

    emitted_t = state0.new_empty((len(positions), b, H, K, V))
    for e, p in enumerate(positions):
        c, j = divmod(p, cs)
        if j == 0:
            emitted_t[e].copy_(starts[:, :, c])
            continue
        a = gam[:, :, c, :j]
        kd = kc[:, :, c, :j] * (a[..., -1:] - a).exp().unsqueeze(-1)
        torch.addcmul(
            kd.transpose(-1, -2) @ vc[:, :, c, :j], a[..., -1:].exp().unsqueeze(-1),
            starts[:, :, c], out=emitted_t[e],
        )  # fmt: skip
    return o_out.contiguous(), starts[:, :, nc].clone(), emitted_t


def lightning_step_ref(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slope: torch.Tensor
) -> torch.Tensor:
    """One decode token of lightning attention per sequence; ``state`` is updated in place.

    Args:
        state: [b, H, K, V] float32 (any strides, e.g. rows of a cache), updated in place.
        q, k: [b, H, K]; v: [b, H, V]; slope: [H] decay rates.

    Returns:
        o: [b, H, V] in q.dtype, read from the updated state. Computed in float32 (float64
        when an input is float64); the state keeps its own dtype.
    """
    b, H, K, V = check_lightning_step_shapes(state, q, k, v, slope)
    cdt = compute_dtype(state, q, k, v, slope)
    in_place = state.dtype == cdt and state.is_contiguous()
    s = state if in_place else state.to(cdt).contiguous()
    s.mul_((-slope.to(cdt)).exp().view(1, H, 1, 1))
    kf, vf = k.to(cdt), v.to(cdt)
    s.view(b * H, K, V).baddbmm_(kf.reshape(b * H, K, 1), vf.reshape(b * H, 1, V))
    if not in_place:
        state.copy_(s)
    return (q.to(cdt).unsqueeze(-2) @ s).squeeze(-2).to(q.dtype)


def lightning_recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-by-token lightning attention; ground truth for tests (slow: loops over L).

    Same arguments, shapes and results as :func:`lightning_chunk_ref` without
    ``chunk_size``."""
    b, L, H, K, V = check_lightning_shapes(q, k, v, slope, initial_state)
    cdt = compute_dtype(q, k, v, slope, initial_state)
    state = start_state(initial_state, (b, H, K, V), cdt, q.device)

    def step(s: torch.Tensor, t: int) -> torch.Tensor:
        return lightning_step_ref(s, q[:, t], k[:, t], v[:, t], slope)

    return token_by_token(step, state, L, check_positions(emit_at, L), q.new_empty((b, 0, H, V)))


def check_lightning_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor,
    initial_states: torch.Tensor | None,
    cu_seqlens: Sequence[int],
    emit_at: Sequence[Sequence[int]],
) -> tuple[int, int, int, list[int], list[list[int]]]:
    """Validate a varlen prefill's arguments (see `lightning_chunk_varlen_ref`); returns
    (H, K, V, cu_seqlens, each sequence's emit positions)."""
    return check_packed(
        q, k, lambda: check_lightning_shapes(q[None], k[None], v[None], slope, None),
        initial_states, cu_seqlens, emit_at,
    )  # fmt: skip


def lightning_chunk_varlen_ref(
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
    """`lightning_chunk_ref` of S sequences packed one after another.

    Args:
        q, k: [T, H, K]; v: [T, H, V]; slope: [H]; sequence s at rows
            cu_seqlens[s]:cu_seqlens[s + 1] (S + 1 host ints rising from 0 to T).
        chunk_size: as `lightning_chunk_ref`.
        initial_states: [S, H, K, V] each sequence's state before it, or None (zeros).
        emit_at: S lists of sorted, distinct positions p, 1 <= p <= L_s (or none at all).

    Returns:
        o: [T, H, V] in q.dtype; final_states: [S, H, K, V]; emitted: [E, H, K, V],
        sequence by sequence in emit order. Each sequence runs alone from its state (the
        reference: a loop over the sequences).
    """
    _, _, _, cu, emits = check_lightning_varlen(q, k, v, slope, initial_states, cu_seqlens, emit_at)

    def run(rows: slice, state: torch.Tensor | None, e: list[int]) -> Outputs:
        return lightning_chunk_ref(
            q[None, rows], k[None, rows], v[None, rows], slope,
            chunk_size=chunk_size, initial_state=state, emit_at=e,
        )  # fmt: skip

    return per_sequence(cu, emits, initial_states, run)
