"""Depthwise causal conv1d with a carried state (the short conv in front of every SSM layer).

State convention (same as mamba-ssm's inference cache): the state holds the last K input
columns (K = kernel width), newest last, zeros where there is no history. Only the newest
K - 1 columns influence future outputs; the oldest is kept so the layout matches caches
built by mamba-ssm / transformers. States hold raw inputs, so they keep the input dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from ._util import check_emit_at, check_varlen, compute_dtype


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    """Apply the conv activation: "silu" (alias "swish") or None (identity)."""
    if activation is None:
        return y
    if activation in ("silu", "swish"):
        return F.silu(y)
    raise ValueError(f"unsupported activation {activation!r}; use 'silu' or None")


def causal_conv1d_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    activation: str | None = "silu",
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Depthwise causal conv1d over a sequence, resuming from a state.

    Args:
        x: [b, C, L] inputs (any float dtype).
        weight: [C, K] per-channel taps; weight[:, -1] multiplies the current token.
        bias: [C] or None.
        initial_state: [b, C, K] last K inputs before x (newest last), or None (zeros).
        activation: "silu" or None.
        emit_at: sorted positions p (1 <= p <= L): return the state after the first p tokens.

    Returns:
        y: [b, C, L] in x.dtype (computed in float32, float64 for float64 inputs).
        final_state: [b, C, K] in x.dtype, the last K columns of concat(initial_state, x).
        emitted: [len(emit_at), b, C, K] in x.dtype.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [b, C, L], got shape {tuple(x.shape)}")
    b, ch, L = x.shape
    if weight.dim() != 2 or weight.shape[0] != ch:
        raise ValueError(f"weight must be [C, K] with C = {ch}, got {tuple(weight.shape)}")
    K = weight.shape[1]
    if initial_state is not None and initial_state.shape != (b, ch, K):
        raise ValueError(f"initial_state must be {(b, ch, K)}, got {tuple(initial_state.shape)}")
    positions = check_emit_at(emit_at, L)
    if initial_state is None:
        initial_state = x.new_zeros(b, ch, K)
    history = torch.cat([initial_state.to(x.dtype), x], dim=-1)  # [b, C, K + L]
    cdt = compute_dtype(x, weight)
    y = F.conv1d(
        history[:, :, 1:].to(cdt),
        weight.to(cdt).unsqueeze(1),
        None if bias is None else bias.to(cdt),
        groups=ch,
    )  # [b, C, L]
    y = _activate(y, activation)
    final_state = history[:, :, L:].clone()
    if positions:
        emitted = torch.stack([history[:, :, p : p + K] for p in positions])
    else:
        emitted = x.new_empty((0, b, ch, K))
    return y.to(x.dtype), final_state, emitted


def causal_conv1d_update_ref(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One decode step of the causal conv; ``state`` is updated in place.

    Args:
        x: [b, C] the new token's inputs.
        state: [b, C, K] last K inputs (newest last); shifted left by one and x appended,
            in place (keeps its own dtype).
        weight: [C, K]; bias: [C] or None; activation: "silu" or None.

    Returns:
        y: [b, C] in x.dtype, ``act(sum_k state_new[..., k] * weight[:, k] + bias)``.
    """
    if x.dim() != 2 or state.dim() != 3 or state.shape[:2] != x.shape:
        raise ValueError(
            f"x must be [b, C] and state [b, C, K]; got {tuple(x.shape)}, {tuple(state.shape)}"
        )
    if weight.shape != (state.shape[1], state.shape[2]):
        raise ValueError(f"weight must be {tuple(state.shape[1:])}, got {tuple(weight.shape)}")
    state.copy_(torch.cat([state[:, :, 1:], x.unsqueeze(-1).to(state.dtype)], dim=-1))
    cdt = compute_dtype(x, weight, state)
    y = (state.to(cdt) * weight.to(cdt)).sum(-1)
    if bias is not None:
        y = y + bias.to(cdt)
    return _activate(y, activation).to(x.dtype)


def check_conv_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    cu_seqlens: Sequence[int],
    initial_states: torch.Tensor | None,
    emit_at: Sequence[Sequence[int]],
) -> tuple[list[int], list[list[int]]]:
    """Validate a varlen conv's arguments (see `causal_conv1d_varlen_ref`); ValueError
    naming the first bad one. Returns (cu_seqlens, each sequence's emit positions)."""
    if x.dim() != 2:
        raise ValueError(f"x must be [C, T], got shape {tuple(x.shape)}")
    ch, total = x.shape
    if weight.dim() != 2 or weight.shape[0] != ch or weight.shape[1] < 1:
        raise ValueError(f"weight must be [C, K] with C = {ch}, got {tuple(weight.shape)}")
    return check_varlen(cu_seqlens, total, emit_at, initial_states, (ch, weight.shape[1]))


def varlen_states(
    x: torch.Tensor,
    initial_states: torch.Tensor | None,
    cu_seqlens: Sequence[int],
    K: int,
    emits: Sequence[Sequence[int]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The conv states of packed sequences: sequence s's state after r of its tokens is
    the last K columns of concat(initial_states[s], x[:, cu[s] : cu[s] + r]) (zeros
    without initial states). x [C, T]; returns (the final states [S, C, K], the states at
    `emits[s]`, sequence by sequence [E, C, K]) in x's dtype: columns gathered from x and
    from the states by indices built on the host from host ints (no sync, x not copied)."""
    ch, total = x.shape
    n_seq = len(cu_seqlens) - 1
    depths = [(s, cu_seqlens[s + 1] - cu_seqlens[s]) for s in range(n_seq)]
    depths += [(s, r) for s in range(n_seq) for r in emits[s]]
    cols = [(s, r - K + j) for s, r in depths for j in range(K)]  # j: the state's column
    dev = x.device
    init = x.new_zeros(n_seq, ch, K) if initial_states is None else initial_states.to(x.dtype)
    from_init = torch.tensor([s * K + K + c if c < 0 else 0 for s, c in cols], device=dev)
    picked = init.permute(1, 0, 2).reshape(ch, n_seq * K)[:, from_init]
    if total:
        in_x = [c >= 0 for _, c in cols]
        from_x = torch.tensor([cu_seqlens[s] + c if c >= 0 else 0 for s, c in cols], device=dev)
        picked = torch.where(torch.tensor(in_x, device=dev), x[:, from_x], picked)
    states = picked.reshape(ch, len(depths), K).permute(1, 0, 2).contiguous()
    return states[:n_seq], states[n_seq:]


def causal_conv1d_varlen_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    cu_seqlens: Sequence[int],
    initial_states: torch.Tensor | None = None,
    activation: str | None = "silu",
    emit_at: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`causal_conv1d_ref` of S sequences packed one after another, in one call.

    Args:
        x: [C, T] the sequences' inputs, sequence s at columns cu_seqlens[s]:cu_seqlens[s+1].
        weight: [C, K]; bias: [C] or None; activation: "silu" or None.
        cu_seqlens: S + 1 host ints rising from 0 to T (a sequence may be empty).
        initial_states: [S, C, K] each sequence's last K inputs before it, or None (zeros).
        emit_at: S lists (or none at all: nothing emitted) of sorted positions p,
            1 <= p <= L_s: the state after the first p tokens of sequence s.

    Returns:
        y: [C, T] in x.dtype; final_states: [S, C, K]; emitted: [E, C, K], sequence by
        sequence in emit order, in x.dtype. A sequence's outputs never see another's
        inputs: each starts from its own state.

    Builds each sequence's history concat(state, inputs) into one packed row and runs one
    depthwise conv1d over it, keeping the outputs at the sequences' tokens.
    """
    cu, emits = check_conv_varlen(x, weight, cu_seqlens, initial_states, emit_at)
    n_seq = len(cu) - 1
    ch, total = x.shape
    K = weight.shape[1]
    lengths = [cu[s + 1] - cu[s] for s in range(n_seq)]
    final, emitted = varlen_states(x, initial_states, cu, K, emits)
    if total == 0:  # no tokens (so no emits): the states pass through
        return x.clone(), final, emitted
    dev = x.device
    seqs = torch.arange(n_seq, device=dev)
    seq_of = torch.repeat_interleave(seqs, torch.tensor(lengths, device=dev), output_size=total)
    token_idx = torch.arange(total, device=dev) + K * (seq_of + 1)
    starts = torch.tensor(cu[:-1], device=dev) + K * seqs
    state_idx = (starts[:, None] + torch.arange(K, device=dev)).reshape(-1)
    init = x.new_zeros(n_seq, ch, K) if initial_states is None else initial_states.to(x.dtype)
    history = x.new_empty(ch, total + n_seq * K)
    history[:, token_idx] = x
    history[:, state_idx] = init.permute(1, 0, 2).reshape(ch, n_seq * K)
    cdt = compute_dtype(x, weight)
    y = F.conv1d(
        history[None, :, 1:].to(cdt),
        weight.to(cdt).unsqueeze(1),
        None if bias is None else bias.to(cdt),
        groups=ch,
    )[0]
    y = _activate(y[:, token_idx - K], activation).to(x.dtype)
    return y, final, emitted
