"""Gated DeltaNet (the gated delta rule of Qwen3-Next / Qwen3.5 linear attention) in pure torch.

Per sequence and head, with q, k L2-normalised over K (optional) and q scaled by K**-0.5:

    S_t = exp(g_t) S_{t-1}                                  state [K, V], g_t <= 0
    d_t = beta_t (v_t - S_t^T k_t)                          the delta-rule correction [V]
    S_t = S_t + k_t d_t^T
    o_t = S_t^T q_t                                         output [V]

Chunked (WY / UT-transform) form. Inside a chunk of C tokens with chunk-start state S_0 and
gamma_i = g_1 + ... + g_i (cumulated inside the chunk), the state after local token m is

    S_m = exp(gamma_m) S_0 + sum_{j<=m} exp(gamma_m - gamma_j) k_j u_j^T

where the corrections u_j solve the unit lower-triangular system (I + A) U = R with
A_ij = beta_i exp(gamma_i - gamma_j) k_i.k_j (i > j), R_i = beta_i (v_i - exp(gamma_i) S_0^T k_i).
Solving once for [beta v | beta exp(gamma) k] gives U = U0 - W S_0, so only the
(S_0-dependent) product W S_0 is sequential across chunks. States at arbitrary positions
(``emit_at``) come from the formula for S_m: the chunk-start state plus the partial sum over
the chunk's first m tokens, exact at any depth without splitting chunks.

The callers expand grouped key heads to value heads before calling (H = value heads).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from ._util import (
    Outputs,
    check_emit_at,
    check_qkv,
    check_shape,
    check_varlen,
    compute_dtype,
    per_sequence,
    start_state,
    token_by_token,
)

L2_EPS = 1e-6  # ``x * rsqrt(sum(x * x) + eps)``, like fla and transformers


def check_gated_delta_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> tuple[int, int, int, int, int]:
    """Validate prefill shapes (q, k [b, L, H, K], v [b, L, H, V], g, beta [b, L, H],
    initial_state [b, H, K, V] or None); return (b, L, H, K, V)."""
    b, L, H, K, V = check_qkv(q, k, v)
    for name, t in (("g", g), ("beta", beta)):
        check_shape(name, t, (b, L, H), "[b, L, H]")
    check_shape("initial_state", initial_state, (b, H, K, V))
    return b, L, H, K, V


def check_step_shapes(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[int, int, int, int]:
    """Validate decode shapes (state [b, H, K, V], q, k [b, H, K], v [b, H, V], g, beta
    [b, H]); return (b, H, K, V)."""
    if state.dim() != 4:
        raise ValueError(f"state must be [b, H, K, V], got {tuple(state.shape)}")
    b, H, K, V = state.shape
    expected = {"q": (b, H, K), "k": (b, H, K), "v": (b, H, V), "g": (b, H), "beta": (b, H)}
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.shape != expected[name]:
            raise ValueError(
                f"{name} must be {expected[name]} for state {tuple(state.shape)}, "
                f"got {tuple(t.shape)}"
            )
    return b, H, K, V


def check_positions(emit_at: Sequence[int], length: int) -> list[int]:
    """Emit positions: ints in [1, length], sorted and distinct; ValueError naming the bad one."""
    positions = check_emit_at(emit_at, length)
    for a, b in itertools.pairwise(positions):
        if a == b:
            raise ValueError(f"emit_at position {a} is repeated; positions must be distinct")
    return positions


def prepare_qk(
    q: torch.Tensor, k: torch.Tensor, use_qk_l2norm: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k in ``dtype``, L2-normalised over the last dim when asked; q also scaled by K**-0.5."""
    qf, kf = q.to(dtype), k.to(dtype)
    if use_qk_l2norm:
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + L2_EPS)
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + L2_EPS)
    return qf * q.shape[-1] ** -0.5, kf


def gated_delta_chunk_ref(
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
    """Chunked gated delta rule over a prefill, resuming from a state and emitting states.

    Args:
        q, k: [b, L, H, K] queries and keys (any float dtype), one per value head.
        v: [b, L, H, V] values.
        g: [b, L, H] log-decay per token (<= 0), any float dtype.
        beta: [b, L, H] write strength per token (usually in (0, 1)).
        chunk_size: tokens per chunk (L need not be a multiple; results do not depend on it
            beyond rounding).
        initial_state: [b, H, K, V] state before the first token (float32), or None (zeros).
        emit_at: sorted, distinct positions p (1 <= p <= L): return the state after the
            first p tokens.
        use_qk_l2norm: L2-normalise q and k over K (eps 1e-6) before use.

    Returns:
        o: [b, L, H, V] in q.dtype.
        final_state: [b, H, K, V] float32 (float64 when an input is float64).
        emitted: [len(emit_at), b, H, K, V], same dtype as final_state; emitted[i] is the
            final state of a separate call over the first emit_at[i] tokens.

    Raises ValueError on bad shapes, chunk_size < 1 or bad emit positions.
    """
    b, L, H, K, V = check_gated_delta_shapes(q, k, v, g, beta, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    positions = check_positions(emit_at, L)
    cdt = compute_dtype(q, k, v, g, beta, initial_state)
    dev = q.device
    if initial_state is None:
        state0 = torch.zeros(b, H, K, V, dtype=cdt, device=dev)
    else:
        state0 = initial_state.to(cdt)
    if L == 0:
        return q.new_empty((b, 0, H, V)), state0.clone(), state0.new_empty((0, b, H, K, V))

    # a sequence shorter than a chunk is one chunk of its own length (the same exact
    # algorithm without padding it: a verified speculative step is a few tokens)
    cs = min(chunk_size, L)
    nc = -(-L // cs)
    pad = nc * cs - L
    qf, kf = prepare_qk(q, k, use_qk_l2norm, cdt)

    def heads_first(t: torch.Tensor) -> torch.Tensor:
        """[b, L, H, ...] -> [b, H, nc, cs, ...]; padded tokens are zeros (decay 1, no write)."""
        t = t.to(cdt).transpose(1, 2)
        t = F.pad(t, (0, 0, 0, pad)) if t.dim() == 4 else F.pad(t, (0, pad))
        return t.reshape(b, H, nc, cs, *t.shape[3:])

    qc, kc, vc = heads_first(qf), heads_first(kf), heads_first(v)
    bc = heads_first(beta)
    gam = heads_first(g).cumsum(-1)  # [b, H, nc, cs]

    idx = torch.arange(cs, device=dev)
    incl = idx.view(-1, 1) >= idx.view(1, -1)
    strict = idx.view(-1, 1) > idx.view(1, -1)
    decay = (gam.unsqueeze(-1) - gam.unsqueeze(-2)).masked_fill(~incl, 0.0).exp_()
    decay.masked_fill_(~incl, 0.0)  # exp(gamma_i - gamma_j) for j <= i, else 0

    # WY transform: [U0 | W] = (I + A)^-1 [beta v | beta exp(gamma) k], A strictly lower.
    kb = kc * bc.unsqueeze(-1)
    A = (kb @ kc.transpose(-1, -2)).mul_(decay).masked_fill_(~strict, 0.0)
    rhs = torch.cat([vc * bc.unsqueeze(-1), kb * gam.exp().unsqueeze(-1)], dim=-1)
    solved = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    u0, w = solved[..., :V], solved[..., V:]

    # Carry the state across chunks: U = U0 - W S_0, S_end = exp(gamma_C) S_0 + K_dec^T U.
    g_last = gam[..., -1:]  # [b, H, nc, 1]
    k_end = kc * (g_last - gam).exp().unsqueeze(-1)  # keys decayed to the chunk end
    starts = torch.empty(b, H, nc + 1, K, V, dtype=cdt, device=dev)
    starts[:, :, 0] = state0
    u = torch.empty_like(u0)
    for c in range(nc):
        s0 = starts[:, :, c]
        torch.sub(u0[:, :, c], w[:, :, c] @ s0, out=u[:, :, c])
        torch.addcmul(
            k_end[:, :, c].transpose(-1, -2) @ u[:, :, c],
            g_last[:, :, c].exp().unsqueeze(-1),
            s0,
            out=starts[:, :, c + 1],
        )

    # Outputs: o_i = exp(gamma_i) q_i^T S_0 + sum_{j<=i} exp(gamma_i - gamma_j) (q_i.k_j) u_j.
    o = (qc * gam.exp().unsqueeze(-1)) @ starts[:, :, :nc]
    o += ((qc @ kc.transpose(-1, -2)) * decay) @ u
    o_out = o.reshape(b, H, nc * cs, V)[:, :, :L].transpose(1, 2).to(q.dtype)

    emitted_t = state0.new_empty((len(positions), b, H, K, V))
    for e, p in enumerate(positions):  # each written in place: no stacking copy
        _state_at(p, cs, starts, gam, kc, u, emitted_t[e])
    return o_out.contiguous(), starts[:, :, nc].clone(), emitted_t


def _state_at(
    p: int,
    cs: int,
    starts: torch.Tensor,
    gam: torch.Tensor,
    kc: torch.Tensor,
    u: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Write into `out` [b, H, K, V] the state after the first p tokens: the chunk-start
    state plus the chunk's first tokens (in the compute dtype).

    starts [b, H, nc+1, K, V]; gam [b, H, nc, cs]; kc [b, H, nc, cs, K]; u [b, H, nc, cs, V].
    """
    c, j = divmod(p, cs)
    if j == 0:
        out.copy_(starts[:, :, c])
        return
    a = gam[:, :, c, :j]  # [b, H, j]
    kd = kc[:, :, c, :j] * (a[..., -1:] - a).exp().unsqueeze(-1)
    contrib = kd.transpose(-1, -2) @ u[:, :, c, :j]
    torch.addcmul(contrib, a[..., -1:].exp().unsqueeze(-1), starts[:, :, c], out=out)


def gated_delta_step_ref(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """One decode token of the gated delta rule per sequence; ``state`` is updated in place.

    Args:
        state: [b, H, K, V] float32 (any strides, e.g. rows of a cache), updated in place.
        q, k: [b, H, K]; v: [b, H, V]; g, beta: [b, H] (log-decay <= 0, write strength).
        use_qk_l2norm: L2-normalise q and k over K (eps 1e-6) before use.

    Returns:
        o: [b, H, V] in q.dtype, read from the updated state. Computed in float32 (float64
        when an input is float64); the state keeps its own dtype.
    """
    check_step_shapes(state, q, k, v, g, beta)
    cdt = compute_dtype(state, q, k, v, g, beta)
    qf, kf = prepare_qk(q, k, use_qk_l2norm, cdt)
    b, H, K, V = state.shape
    in_place = state.dtype == cdt and state.is_contiguous()
    s = state if in_place else state.to(cdt).contiguous()  # in place: no [b, H, K, V] temporaries
    s.mul_(g.to(cdt).exp()[..., None, None])
    kv_mem = (kf.unsqueeze(-2) @ s).squeeze(-2)  # [b, H, V]
    delta = (v.to(cdt) - kv_mem) * beta.to(cdt).unsqueeze(-1)
    s.view(b * H, K, V).baddbmm_(kf.reshape(b * H, K, 1), delta.reshape(b * H, 1, V))
    if not in_place:
        state.copy_(s)
    return (qf.unsqueeze(-2) @ s).squeeze(-2).to(q.dtype)


def gated_delta_recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
    use_qk_l2norm: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule; ground truth for tests (slow: loops over L).

    Same arguments, shapes and results as :func:`gated_delta_chunk_ref` without
    ``chunk_size``: q, k [b, L, H, K], v [b, L, H, V], g, beta [b, L, H], initial_state
    [b, H, K, V]. Returns (o [b, L, H, V] in q.dtype, final_state [b, H, K, V] float32 or
    float64, emitted [len(emit_at), b, H, K, V]).
    """
    b, L, H, K, V = check_gated_delta_shapes(q, k, v, g, beta, initial_state)
    cdt = compute_dtype(q, k, v, g, beta, initial_state)
    state = start_state(initial_state, (b, H, K, V), cdt, q.device)

    def step(s: torch.Tensor, t: int) -> torch.Tensor:
        return gated_delta_step_ref(
            s, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], use_qk_l2norm=use_qk_l2norm
        )

    return token_by_token(step, state, L, check_positions(emit_at, L), q.new_empty((b, 0, H, V)))


def check_delta_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_states: torch.Tensor | None,
    cu_seqlens: Sequence[int],
    emit_at: Sequence[Sequence[int]],
) -> tuple[int, int, int, list[int], list[list[int]]]:
    """Validate a varlen prefill's arguments (see `gated_delta_chunk_varlen_ref`); returns
    (H, K, V, cu_seqlens, each sequence's emit positions)."""
    return check_packed(
        q, k, lambda: check_gated_delta_shapes(
            q[None], k[None], v[None], g[None], beta[None], None
        ), initial_states, cu_seqlens, emit_at,
    )  # fmt: skip


def check_packed(
    q: torch.Tensor,
    k: torch.Tensor,
    row_shapes: Callable[[], tuple[int, int, int, int, int]],
    initial_states: torch.Tensor | None,
    cu_seqlens: Sequence[int],
    emit_at: Sequence[Sequence[int]],
) -> tuple[int, int, int, list[int], list[list[int]]]:
    """The varlen checks a packed linear-attention prefill shares (gated delta rule, KDA,
    lightning attention): q and k both [T, H, K]; `row_shapes()` validates the op's
    tensors as one batch row of T tokens and returns its (1, T, H, K, V); then the
    packing (`check_varlen`) and each sequence's distinct emit positions. Returns
    (H, K, V, cu_seqlens, each sequence's emit positions); ValueError naming a bad one."""
    if q.dim() != 3 or k.shape != q.shape:
        raise ValueError(f"q and k must both be [T, H, K], got {tuple(q.shape)}, {tuple(k.shape)}")
    _, L, H, K, V = row_shapes()
    cu, emits = check_varlen(cu_seqlens, L, emit_at, initial_states, (H, K, V))
    for s, e in enumerate(emits):
        check_positions(e, cu[s + 1] - cu[s])  # distinct, too
    return H, K, V, cu, emits


def gated_delta_chunk_varlen_ref(
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
    """`gated_delta_chunk_ref` of S sequences packed one after another.

    Args:
        q, k: [T, H, K]; v: [T, H, V]; g, beta: [T, H]; sequence s at rows
            cu_seqlens[s]:cu_seqlens[s + 1] (S + 1 host ints rising from 0 to T).
        chunk_size, use_qk_l2norm: as `gated_delta_chunk_ref`.
        initial_states: [S, H, K, V] each sequence's state before it, or None (zeros).
        emit_at: S lists of sorted, distinct positions p, 1 <= p <= L_s (or none at all).

    Returns:
        o: [T, H, V] in q.dtype; final_states: [S, H, K, V]; emitted: [E, H, K, V],
        sequence by sequence in emit order. Each sequence runs alone from its state (the
        reference: a loop over the sequences).
    """
    _, _, _, cu, emits = check_delta_varlen(q, k, v, g, beta, initial_states, cu_seqlens, emit_at)

    def run(rows: slice, state: torch.Tensor | None, e: list[int]) -> Outputs:
        return gated_delta_chunk_ref(
            q[None, rows], k[None, rows], v[None, rows], g[None, rows], beta[None, rows],
            chunk_size=chunk_size, initial_state=state, emit_at=e, use_qk_l2norm=use_qk_l2norm,
        )  # fmt: skip

    return per_sequence(cu, emits, initial_states, run)
