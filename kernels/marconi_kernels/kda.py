"""KDA (Kimi Delta Attention, Kimi Linear's linear attention) in pure torch: the gated delta
rule with a per-channel decay, one log-decay per key dimension instead of one per head.

Per sequence and head, with q, k L2-normalised over K (optional) and q scaled by K**-0.5:

    S_t = diag(exp(g_t)) S_{t-1}                            state [K, V], g_t in R^K, <= 0
    d_t = beta_t (v_t - S_t^T k_t)                          the delta-rule correction [V]
    S_t = S_t + k_t d_t^T
    o_t = S_t^T q_t                                         output [V]

Chunked (WY) form, as `gated_delta` with the decays elementwise over K. Inside a chunk with
start state S_0 and gamma_i = g_1 + ... + g_i in R^K (cumulated inside the chunk):

    S_m = diag(exp(gamma_m)) S_0 + sum_{j<=m} (exp(gamma_m - gamma_j) * k_j) u_j^T

where the corrections u solve (I + A) U = R, A_ij = beta_i sum_c k_ic k_jc
exp(gamma_ic - gamma_jc) (i > j), R_i = beta_i (v_i - S_0^T (exp(gamma_i) * k_i)). Solving
once for [beta v | beta exp(gamma) * k] gives U = U0 - W S_0. The pairwise decays are formed
as exp(gamma_i - gamma_j) over [C, C, K] (never exp(gamma_i) exp(-gamma_j), which overflows
under strong decay), one chunk at a time. States at any position (``emit_at``) come from
the formula for S_m, exact at any depth.
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
from .gated_delta import check_packed, check_positions, prepare_qk


def check_kda_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> tuple[int, int, int, int, int]:
    """Validate prefill shapes (q, k, g [b, L, H, K], v [b, L, H, V], beta [b, L, H],
    initial_state [b, H, K, V] or None); return (b, L, H, K, V)."""
    b, L, H, K, V = check_qkv(q, k, v)
    check_shape("g", g, (b, L, H, K), "[b, L, H, K]")
    check_shape("beta", beta, (b, L, H), "[b, L, H]")
    check_shape("initial_state", initial_state, (b, H, K, V))
    return b, L, H, K, V


def check_kda_step_shapes(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[int, int, int, int]:
    """Validate decode shapes (state [b, H, K, V], q, k, g [b, H, K], v [b, H, V], beta
    [b, H]); return (b, H, K, V)."""
    if state.dim() != 4:
        raise ValueError(f"state must be [b, H, K, V], got {tuple(state.shape)}")
    b, H, K, V = state.shape
    expected = {"q": (b, H, K), "k": (b, H, K), "v": (b, H, V), "g": (b, H, K), "beta": (b, H)}
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        if t.shape != expected[name]:
            raise ValueError(
                f"{name} must be {expected[name]} for state {tuple(state.shape)}, "
                f"got {tuple(t.shape)}"
            )
    return b, H, K, V


def kda_chunk_ref(
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
    """Chunked KDA over a prefill, resuming from a state and emitting states.

    Args:
        q, k: [b, L, H, K] queries and keys (any float dtype).
        v: [b, L, H, V] values.
        g: [b, L, H, K] log-decay per token and key channel (<= 0), any float dtype.
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
    b, L, H, K, V = check_kda_shapes(q, k, v, g, beta, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    positions = check_positions(emit_at, L)
    cdt = compute_dtype(q, k, v, g, beta, initial_state)
    dev = q.device
    state0 = (
        torch.zeros(b, H, K, V, dtype=cdt, device=dev)
        if initial_state is None
        else initial_state.to(cdt)
    )
    if L == 0:
        return q.new_empty((b, 0, H, V)), state0.clone(), state0.new_empty((0, b, H, K, V))

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
    gam = heads_first(g).cumsum(-2)  # [b, H, nc, cs, K]

    idx = torch.arange(cs, device=dev)
    incl = idx.view(-1, 1) >= idx.view(1, -1)
    strict = idx.view(-1, 1) > idx.view(1, -1)
    kb = kc * bc.unsqueeze(-1)
    A = torch.empty(b, H, nc, cs, cs, dtype=cdt, device=dev)
    qk = torch.empty_like(A)
    for c in range(nc):  # pairwise decays of one chunk: [b, H, cs, cs, K]
        gc = gam[:, :, c]
        decay = (gc.unsqueeze(-2) - gc.unsqueeze(-3)).masked_fill_(~incl[..., None], 0.0).exp_()
        decay.masked_fill_(~incl[..., None], 0.0)  # exp(gamma_i - gamma_j) for j <= i
        kd = kc[:, :, c].unsqueeze(-3) * decay  # [b, H, i, j, K]: decayed k_j for row i
        A[:, :, c] = (kb[:, :, c].unsqueeze(-2) * kd).sum(-1).masked_fill_(~strict, 0.0)
        qk[:, :, c] = (qc[:, :, c].unsqueeze(-2) * kd).sum(-1)

    # WY transform: [U0 | W] = (I + A)^-1 [beta v | beta exp(gamma) * k].
    rhs = torch.cat([vc * bc.unsqueeze(-1), kb * gam.exp()], dim=-1)
    solved = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    u0, w = solved[..., :V], solved[..., V:]

    # Carry the state across chunks: U = U0 - W S_0, S_end = exp(gamma_C) * S_0 + K_dec^T U.
    g_last = gam[..., -1:, :]  # [b, H, nc, 1, K]
    k_end = kc * (g_last - gam).exp()  # keys decayed to the chunk end
    starts = torch.empty(b, H, nc + 1, K, V, dtype=cdt, device=dev)
    starts[:, :, 0] = state0
    u = torch.empty_like(u0)
    for c in range(nc):
        s0 = starts[:, :, c]
        torch.sub(u0[:, :, c], w[:, :, c] @ s0, out=u[:, :, c])
        torch.addcmul(
            k_end[:, :, c].transpose(-1, -2) @ u[:, :, c],
            g_last[:, :, c, 0].exp().unsqueeze(-1),
            s0,
            out=starts[:, :, c + 1],
        )

    # Outputs: o_i = S_0^T (exp(gamma_i) * q_i) + sum_{j<=i} qk_ij u_j.
    o = (qc * gam.exp()) @ starts[:, :, :nc]
    o += qk @ u
    o_out = o.reshape(b, H, nc * cs, V)[:, :, :L].transpose(1, 2).to(q.dtype)

    emitted_t = state0.new_empty((len(positions), b, H, K, V))
    for e, p in enumerate(positions):
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
    """Write into `out` [b, H, K, V] the state after the first p tokens.

    starts [b, H, nc+1, K, V]; gam, kc [b, H, nc, cs, K]; u [b, H, nc, cs, V].
    """
    c, j = divmod(p, cs)
    if j == 0:
        out.copy_(starts[:, :, c])
        return
    a = gam[:, :, c, :j]  # [b, H, j, K]
    kd = kc[:, :, c, :j] * (a[..., -1:, :] - a).exp()
    contrib = kd.transpose(-1, -2) @ u[:, :, c, :j]
    torch.addcmul(contrib, a[..., -1, :].exp().unsqueeze(-1), starts[:, :, c], out=out)


def kda_step_ref(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    use_qk_l2norm: bool = True,
) -> torch.Tensor:
    """One decode token of KDA per sequence; ``state`` is updated in place.

    Args:
        state: [b, H, K, V] float32 (any strides, e.g. rows of a cache), updated in place.
        q, k, g: [b, H, K] (g the per-channel log-decay, <= 0); v: [b, H, V]; beta: [b, H].
        use_qk_l2norm: L2-normalise q and k over K (eps 1e-6) before use.

    Returns:
        o: [b, H, V] in q.dtype, read from the updated state. Computed in float32 (float64
        when an input is float64); the state keeps its own dtype.
    """
    check_kda_step_shapes(state, q, k, v, g, beta)
    cdt = compute_dtype(state, q, k, v, g, beta)
    qf, kf = prepare_qk(q, k, use_qk_l2norm, cdt)
    b, H, K, V = state.shape
    in_place = state.dtype == cdt and state.is_contiguous()
    s = state if in_place else state.to(cdt).contiguous()
    s.mul_(g.to(cdt).exp().unsqueeze(-1))
    kv_mem = (kf.unsqueeze(-2) @ s).squeeze(-2)  # [b, H, V]
    delta = (v.to(cdt) - kv_mem) * beta.to(cdt).unsqueeze(-1)
    s.view(b * H, K, V).baddbmm_(kf.reshape(b * H, K, 1), delta.reshape(b * H, 1, V))
    if not in_place:
        state.copy_(s)
    return (qf.unsqueeze(-2) @ s).squeeze(-2).to(q.dtype)


def kda_recurrent_ref(
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
    """Token-by-token KDA; ground truth for tests (slow: loops over L).

    Same arguments, shapes and results as :func:`kda_chunk_ref` without ``chunk_size``.
    """
    b, L, H, K, V = check_kda_shapes(q, k, v, g, beta, initial_state)
    cdt = compute_dtype(q, k, v, g, beta, initial_state)
    state = start_state(initial_state, (b, H, K, V), cdt, q.device)

    def step(s: torch.Tensor, t: int) -> torch.Tensor:
        return kda_step_ref(
            s, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], use_qk_l2norm=use_qk_l2norm
        )

    return token_by_token(step, state, L, check_positions(emit_at, L), q.new_empty((b, 0, H, V)))


def check_kda_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_states: torch.Tensor | None,
    cu_seqlens: Sequence[int],
    emit_at: Sequence[Sequence[int]],
) -> tuple[int, int, int, list[int], list[list[int]]]:
    """Validate a varlen prefill's arguments (see `kda_chunk_varlen_ref`); returns
    (H, K, V, cu_seqlens, each sequence's emit positions)."""
    return check_packed(
        q, k, lambda: check_kda_shapes(q[None], k[None], v[None], g[None], beta[None], None),
        initial_states, cu_seqlens, emit_at,
    )  # fmt: skip


def kda_chunk_varlen_ref(
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
    """`kda_chunk_ref` of S sequences packed one after another.

    Args:
        q, k, g: [T, H, K]; v: [T, H, V]; beta: [T, H]; sequence s at rows
            cu_seqlens[s]:cu_seqlens[s + 1] (S + 1 host ints rising from 0 to T).
        chunk_size, use_qk_l2norm: as `kda_chunk_ref`.
        initial_states: [S, H, K, V] each sequence's state before it, or None (zeros).
        emit_at: S lists of sorted, distinct positions p, 1 <= p <= L_s (or none at all).

    Returns:
        o: [T, H, V] in q.dtype; final_states: [S, H, K, V]; emitted: [E, H, K, V],
        sequence by sequence in emit order (a loop over the sequences).
    """
    _, _, _, cu, emits = check_kda_varlen(q, k, v, g, beta, initial_states, cu_seqlens, emit_at)

    def run(rows: slice, state: torch.Tensor | None, e: list[int]) -> Outputs:
        return kda_chunk_ref(
            q[None, rows], k[None, rows], v[None, rows], g[None, rows], beta[None, rows],
            chunk_size=chunk_size, initial_state=state, emit_at=e, use_qk_l2norm=use_qk_l2norm,
        )  # fmt: skip

    return per_sequence(cu, emits, initial_states, run)
