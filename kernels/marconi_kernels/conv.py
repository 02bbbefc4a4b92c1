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

from ._util import check_emit_at, compute_dtype


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
