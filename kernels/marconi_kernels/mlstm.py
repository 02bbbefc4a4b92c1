"""The mLSTM cell of xLSTM (NX-AI/xLSTM-7b) in pure torch, float32 compute.

Per sequence and head, token t, with q, k [K], v [V], the input-gate preactivation i_t
and the forget-gate preactivation f_t (both already soft-capped by the caller):

    lf  = logsigmoid(f_t)
    m_t = max(lf + m_{t-1}, i_t)                         stabiliser (scalar)
    a_f = exp(lf + m_{t-1} - m_t);  a_i = exp(i_t - m_t)
    C_t = a_f C_{t-1} + a_i k_t v_t^T                    matrix memory [K, V]
    n_t = a_f n_{t-1} + a_i k_t                          normaliser [K]
    h_t = (q'_t C_t) / (max(|q'_t . n_t|, exp(-m_t)) + eps),   q' = q K**-0.5

(transformers' `mlstm_recurrent_step_native`; the empty state is C = 0, n = 0, m = 0).
Since eps is added to the stabilised denominator, h depends on m itself: the states kept
here are exactly the recurrent ones (C, n scaled by exp(-m_t)), not a rescaled variant.

Chunked form. In a chunk with start state (C_0, n_0, m_0) and b_j the cumulative sum of
lf over the chunk's first j tokens, the state after local token p is

    m_p = max(b_p + m_0, max_{j<=p} (b_p - b_j + i_j))
    C_p = exp(b_p + m_0 - m_p) C_0 + sum_{j<=p} exp(b_p - b_j + i_j - m_p) k_j v_j^T

(n_p alike with k_j), which unrolls the recurrence exactly (every weight <= 1). Only the
chunk-start states are sequential; outputs inside a chunk are one masked matrix product,
and a state at any position (``emit_at``) is its chunk-start state advanced by the
chunk's first p tokens. Padded tokens get lf = 0 and i = -inf: they change nothing.

Packed state. One sequence's state per head is a flat float32 row of
P = K * V + K + 1 values: C row-major [K, V], then n [K], then m. `mlstm_state_size`,
`pack_mlstm_state` and `unpack_mlstm_state` convert (unpack returns views).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._util import (
    Outputs,
    check_qkv,
    check_shape,
    check_varlen,
    compute_dtype,
    per_sequence,
    start_state,
    token_by_token,
)
from .gated_delta import check_positions

MLSTM_EPS = 1e-6
"""transformers' `xLSTMConfig.eps` default: added to the output's denominator."""


def mlstm_state_size(K: int, V: int) -> int:
    """Values per head of a packed state: C [K, V], n [K] and m."""
    return K * V + K + 1


def unpack_mlstm_state(
    state: torch.Tensor, K: int, V: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """state [..., P] -> views C [..., K, V], n [..., K], m [...] (writes go to `state`)."""
    if state.shape[-1] != mlstm_state_size(K, V):
        raise ValueError(
            f"packed mLSTM state must end in {mlstm_state_size(K, V)} for K={K}, V={V}, "
            f"got {tuple(state.shape)}"
        )
    C = state[..., : K * V].unflatten(-1, (K, V))
    return C, state[..., K * V : K * V + K], state[..., -1]


def pack_mlstm_state(C: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """C [..., K, V], n [..., K], m [...] -> a new packed state [..., K * V + K + 1]."""
    return torch.cat([C.flatten(-2), n, m.unsqueeze(-1)], dim=-1)


def check_mlstm_shapes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    initial_state: torch.Tensor | None,
) -> tuple[int, int, int, int, int]:
    """Validate prefill shapes (q, k [b, L, H, K], v [b, L, H, V], igate, fgate [b, L, H],
    initial_state [b, H, P] or None); return (b, L, H, K, V)."""
    b, L, H, K, V = check_qkv(q, k, v)
    for name, g in (("igate", igate), ("fgate", fgate)):
        check_shape(name, g, (b, L, H), "[b, L, H]")
    check_shape("initial_state", initial_state, (b, H, mlstm_state_size(K, V)))
    return b, L, H, K, V


def _advance(
    C0: torch.Tensor,
    n0: torch.Tensor,
    m0: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lf: torch.Tensor,
    ig: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The state after a run of tokens from (C0 [.., K, V], n0 [.., K], m0 [..]):
    k [.., j, K], v [.., j, V], lf (log forget) and ig (input preactivation) [.., j]."""
    b = lf.cumsum(-1)
    g = b[..., -1]
    a = g.unsqueeze(-1) - b + ig  # each token's log weight at the run's end
    m = torch.maximum(g + m0, a.amax(-1))
    w = (a - m.unsqueeze(-1)).exp()
    kw = k * w.unsqueeze(-1)
    carry = (g + m0 - m).exp()
    C = carry[..., None, None] * C0 + kw.transpose(-1, -2) @ v
    n = carry.unsqueeze(-1) * n0 + kw.sum(-2)
    return C, n, m


def mlstm_chunk_ref(
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
) -> Outputs:
    """Chunked mLSTM over a prefill, resuming from a state and emitting states.

    Args:
        q, k: [b, L, H, K] queries and keys (any float dtype; q is scaled by K**-0.5 here).
        v: [b, L, H, V] values.
        igate, fgate: [b, L, H] input and forget gate preactivations.
        chunk_size: tokens per chunk (results do not depend on it beyond rounding).
        initial_state: [b, H, P] packed state before the first token, or None (zeros).
        emit_at: sorted, distinct positions p (1 <= p <= L): the state after p tokens.
        eps: added to the output's denominator.

    Returns:
        h: [b, L, H, V] in q.dtype.
        final_state: [b, H, P] float32 (float64 when an input is float64).
        emitted: [len(emit_at), b, H, P]; emitted[i] is the final state of a separate call
            over the first emit_at[i] tokens.

    Raises ValueError on bad shapes, chunk_size < 1 or bad emit positions.
    """
    b, L, H, K, V = check_mlstm_shapes(q, k, v, igate, fgate, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    positions = check_positions(emit_at, L)
    cdt = compute_dtype(q, k, v, igate, fgate, initial_state)
    dev = q.device
    P = mlstm_state_size(K, V)
    state0 = start_state(initial_state, (b, H, P), cdt, dev)
    if L == 0:
        return q.new_empty((b, 0, H, V)), state0, state0.new_empty((0, b, H, P))

    cs = min(chunk_size, L)
    nc = -(-L // cs)
    pad = nc * cs - L

    def chunks(t: torch.Tensor, value: float = 0.0) -> torch.Tensor:
        """[b, L, H, *D] -> [b, H, nc, cs, *D]; padded tokens hold `value`."""
        t = t.to(cdt).movedim(1, 2)
        t = F.pad(t, (0, 0, 0, pad) if t.dim() == 4 else (0, pad), value=value)
        return t.reshape(b, H, nc, cs, *t.shape[3:])

    qc = chunks(q) * K**-0.5
    kc, vc = chunks(k), chunks(v)
    lf = chunks(F.logsigmoid(fgate.to(cdt)))
    ig = chunks(igate, float("-inf"))

    C_s = torch.empty(b, H, nc + 1, K, V, dtype=cdt, device=dev)
    n_s = torch.empty(b, H, nc + 1, K, dtype=cdt, device=dev)
    m_s = torch.empty(b, H, nc + 1, dtype=cdt, device=dev)
    C_s[:, :, 0], n_s[:, :, 0], m_s[:, :, 0] = unpack_mlstm_state(state0, K, V)
    for c in range(nc):
        C_s[:, :, c + 1], n_s[:, :, c + 1], m_s[:, :, c + 1] = _advance(
            C_s[:, :, c], n_s[:, :, c], m_s[:, :, c],
            kc[:, :, c], vc[:, :, c], lf[:, :, c], ig[:, :, c],
        )  # fmt: skip

    bc = lf.cumsum(-1)  # [b, H, nc, cs]
    idx = torch.arange(cs, device=dev)
    causal = idx.view(-1, 1) >= idx.view(1, -1)
    log_d = (bc.unsqueeze(-1) - bc.unsqueeze(-2) + ig.unsqueeze(-2)).masked_fill(
        ~causal, float("-inf")
    )
    m_in = bc + m_s[:, :, :nc, None]  # the carried state's log weight
    m = torch.maximum(m_in, log_d.amax(-1))  # m_t of every token
    d = (log_d - m.unsqueeze(-1)).exp()
    carry = (m_in - m).exp().unsqueeze(-1)
    scores = (qc @ kc.transpose(-1, -2)) * d
    num = (qc * carry) @ C_s[:, :, :nc] + scores @ vc
    den = ((qc * carry) @ n_s[:, :, :nc].unsqueeze(-1)).squeeze(-1) + scores.sum(-1)
    h = num / (torch.maximum(den.abs(), (-m).exp()) + eps).unsqueeze(-1)
    h_out = h.reshape(b, H, nc * cs, V)[:, :, :L].transpose(1, 2).to(q.dtype)

    emitted = state0.new_empty((len(positions), b, H, P))
    for e, p in enumerate(positions):
        c, j = divmod(p, cs)
        if j == 0:
            got = (C_s[:, :, c], n_s[:, :, c], m_s[:, :, c])
        else:
            got = _advance(
                C_s[:, :, c], n_s[:, :, c], m_s[:, :, c],
                kc[:, :, c, :j], vc[:, :, c, :j], lf[:, :, c, :j], ig[:, :, c, :j],
            )  # fmt: skip
        emitted[e] = pack_mlstm_state(*got)
    final = pack_mlstm_state(C_s[:, :, nc], n_s[:, :, nc], m_s[:, :, nc])
    return h_out.contiguous(), final, emitted


def check_mlstm_step_shapes(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
) -> tuple[int, int, int, int]:
    """Validate decode shapes (state [b, H, P], q, k [b, H, K], v [b, H, V], igate,
    fgate [b, H]); return (b, H, K, V)."""
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[:2] != q.shape[:2]:
        raise ValueError(
            f"q, k must be [b, H, K] and v [b, H, V], got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    b, H, K = q.shape
    V = v.shape[2]
    check_shape("state", state, (b, H, mlstm_state_size(K, V)))
    check_shape("igate", igate, (b, H))
    check_shape("fgate", fgate, (b, H))
    return b, H, K, V


def mlstm_step_ref(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    eps: float = MLSTM_EPS,
) -> torch.Tensor:
    """One decode token of the mLSTM per sequence; ``state`` is updated in place.

    Args:
        state: [b, H, P] packed float32 states (any strides, e.g. rows of a cache).
        q, k: [b, H, K]; v: [b, H, V]; igate, fgate: [b, H] gate preactivations.
        eps: added to the output's denominator.

    Returns:
        h: [b, H, V] in q.dtype. Computed in float32 (float64 when an input is float64).
    """
    _, _, K, V = check_mlstm_step_shapes(state, q, k, v, igate, fgate)
    cdt = compute_dtype(state, q, k, v, igate, fgate)
    in_place = state.dtype == cdt and state.is_contiguous()
    s = state if in_place else state.to(cdt).contiguous()
    C, n, m = unpack_mlstm_state(s, K, V)
    lf = F.logsigmoid(fgate.to(cdt))
    ig = igate.to(cdt)
    m_new = torch.maximum(lf + m, ig)
    a_f = (lf + m - m_new).exp()
    a_i = (ig - m_new).exp()
    kf, vf = k.to(cdt), v.to(cdt)
    C.mul_(a_f[..., None, None]).add_((kf * a_i.unsqueeze(-1)).unsqueeze(-1) * vf.unsqueeze(-2))
    n.mul_(a_f.unsqueeze(-1)).add_(kf * a_i.unsqueeze(-1))
    m.copy_(m_new)
    qs = q.to(cdt) * K**-0.5
    num = (qs.unsqueeze(-2) @ C).squeeze(-2)
    den = (qs * n).sum(-1)
    h = num / (torch.maximum(den.abs(), (-m_new).exp()) + eps).unsqueeze(-1)
    if not in_place:
        state.copy_(s)
    return h.to(q.dtype)


def mlstm_recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
    eps: float = MLSTM_EPS,
) -> Outputs:
    """Token-by-token mLSTM; ground truth for tests (slow: loops over L). Same arguments,
    shapes and results as :func:`mlstm_chunk_ref` without ``chunk_size``."""
    b, L, H, K, V = check_mlstm_shapes(q, k, v, igate, fgate, initial_state)
    cdt = compute_dtype(q, k, v, igate, fgate, initial_state)
    state = start_state(initial_state, (b, H, mlstm_state_size(K, V)), cdt, q.device)

    def step(s: torch.Tensor, t: int) -> torch.Tensor:
        return mlstm_step_ref(s, q[:, t], k[:, t], v[:, t], igate[:, t], fgate[:, t], eps)

    return token_by_token(step, state, L, check_positions(emit_at, L), q.new_empty((b, 0, H, V)))


def check_mlstm_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    igate: torch.Tensor,
    fgate: torch.Tensor,
    initial_states: torch.Tensor | None,
    cu_seqlens: Sequence[int],
    emit_at: Sequence[Sequence[int]],
) -> tuple[int, int, int, list[int], list[list[int]]]:
    """Validate a varlen prefill's arguments (see `mlstm_chunk_varlen_ref`); returns
    (H, K, V, cu_seqlens, each sequence's distinct emit positions)."""
    _, T, H, K, V = check_mlstm_shapes(q[None], k[None], v[None], igate[None], fgate[None], None)
    cu, emits = check_varlen(cu_seqlens, T, emit_at, initial_states, (H, mlstm_state_size(K, V)))
    for s, e in enumerate(emits):
        check_positions(e, cu[s + 1] - cu[s])
    return H, K, V, cu, emits


def mlstm_chunk_varlen_ref(
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
) -> Outputs:
    """`mlstm_chunk_ref` of S sequences packed one after another.

    Args:
        q, k: [T, H, K]; v: [T, H, V]; igate, fgate: [T, H]; sequence s at rows
            cu_seqlens[s]:cu_seqlens[s + 1] (S + 1 host ints rising from 0 to T).
        chunk_size, eps: as `mlstm_chunk_ref`.
        initial_states: [S, H, P] each sequence's state before it, or None (zeros).
        emit_at: S lists of sorted, distinct positions p, 1 <= p <= L_s (or none at all).

    Returns:
        h: [T, H, V] in q.dtype; final_states: [S, H, P]; emitted: [E, H, P], sequence by
        sequence in emit order. Each sequence runs alone from its state (a loop).
    """
    _, _, _, cu, emits = check_mlstm_varlen(
        q, k, v, igate, fgate, initial_states, cu_seqlens, emit_at
    )

    def run(rows: slice, state: torch.Tensor | None, e: list[int]) -> Outputs:
        return mlstm_chunk_ref(
            q[None, rows], k[None, rows], v[None, rows], igate[None, rows], fgate[None, rows],
            chunk_size=chunk_size, initial_state=state, emit_at=e, eps=eps,
        )  # fmt: skip

    return per_sequence(cu, emits, initial_states, run)
