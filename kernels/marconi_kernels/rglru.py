"""The RG-LRU's diagonal linear recurrence (RecurrentGemma / Griffin) with an initial state
and state emission: the pure-torch reference.

Per sequence and channel d:

    h_t = a_t * h_{t-1} + b_t * x_t          y_t = h_t

a_t (the decay, in [0, 1]) and b_t (the input normalisation) are computed by the mixer
from its gates (see `engine/model/layers/rglru.py`); a sequence's first token
(absolute position 0) has a_0 = 0 and b_0 = 1 there, so the kernel itself never needs
the position. States are float32 (float64 for float64 inputs); y is in x's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._util import Outputs, check_emit_at, check_varlen, compute_dtype, per_sequence


def check_rglru_shapes(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dims: int) -> None:
    """ValueError unless x, a and b are one shape of `dims` dimensions."""
    if x.dim() != dims or a.shape != x.shape or b.shape != x.shape:
        raise ValueError(
            f"x, a and b must be one {dims}-d shape, got "
            f"{tuple(x.shape)}, {tuple(a.shape)}, {tuple(b.shape)}"
        )


def rglru_scan_ref(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The recurrence over a batch of sequences, resuming from ``initial_state``.

    Args:
        x, a, b: [B, D, L] inputs, decays and input multipliers (any float dtype).
        initial_state: [B, D] state before the first token, or None (zeros).
        emit_at: sorted positions p (1 <= p <= L), duplicates allowed: return the state
            after the first p tokens.

    Returns:
        y: [B, D, L] in x.dtype (y_t = h_t).
        final_state: [B, D] float32 (float64 for float64 inputs).
        emitted: [len(emit_at), B, D], captured during the single pass.
    """
    check_rglru_shapes(x, a, b, 3)
    n_b, d, L = x.shape
    if initial_state is not None and initial_state.shape != (n_b, d):
        raise ValueError(f"initial_state must be {(n_b, d)}, got {tuple(initial_state.shape)}")
    positions = check_emit_at(emit_at, L)
    cdt = compute_dtype(x, a, b, initial_state)
    if initial_state is None:
        h = torch.zeros(n_b, d, dtype=cdt, device=x.device)
    else:
        h = initial_state.to(cdt).clone()
    inp = (b.to(cdt) * x.to(cdt)).permute(2, 0, 1).contiguous()  # [L, B, D], becomes h_t
    decay = a.to(cdt).permute(2, 0, 1)
    emitted: list[torch.Tensor] = []
    next_emit = 0
    for t in range(L):
        h = inp[t].addcmul_(decay[t], h)
        while next_emit < len(positions) and positions[next_emit] == t + 1:
            emitted.append(h.clone())
            next_emit += 1
    y = inp.permute(1, 2, 0).to(x.dtype)
    emitted_t = torch.stack(emitted) if emitted else h.new_empty((0, n_b, d))
    return y, h.clone(), emitted_t


def rglru_step_ref(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, state: torch.Tensor
) -> torch.Tensor:
    """One decode step; ``state`` [B, D] (float32) becomes ``a * state + b * x`` in place.

    x, a, b: [B, D]. Returns y [B, D] in x.dtype (the new state)."""
    check_rglru_shapes(x, a, b, 2)
    if state.shape != x.shape:
        raise ValueError(f"state must be {tuple(x.shape)}, got {tuple(state.shape)}")
    cdt = compute_dtype(x, a, b, state)
    new = a.to(cdt) * state.to(cdt) + b.to(cdt) * x.to(cdt)
    state.copy_(new)
    return new.to(x.dtype)


def check_rglru_varlen(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    cu_seqlens: Sequence[int],
    initial_states: torch.Tensor | None,
    emit_at: Sequence[Sequence[int]],
) -> tuple[list[int], list[list[int]]]:
    """Validate a varlen scan's arguments (see `rglru_scan_varlen_ref`); returns
    (cu_seqlens, each sequence's emit positions)."""
    check_rglru_shapes(x, a, b, 2)
    return check_varlen(cu_seqlens, x.shape[1], emit_at, initial_states, (x.shape[0],))


def rglru_scan_varlen_ref(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    initial_states: torch.Tensor | None = None,
    emit_at: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`rglru_scan_ref` of S sequences packed one after another.

    Args:
        x, a, b: [D, T]; sequence s at columns cu_seqlens[s]:cu_seqlens[s + 1] (S + 1
            host ints rising from 0 to T; a sequence may be empty).
        initial_states: [S, D] each sequence's state before it, or None (zeros).
        emit_at: S lists of sorted positions p, 1 <= p <= L_s (or none at all).

    Returns:
        y: [D, T] in x.dtype; final_states: [S, D]; emitted: [E, D], sequence by sequence
        in emit order (the reference: a loop over the sequences).
    """
    cu, emits = check_rglru_varlen(x, a, b, cu_seqlens, initial_states, emit_at)

    def run(cols: slice, state: torch.Tensor | None, e: list[int]) -> Outputs:
        return rglru_scan_ref(
            x[None, :, cols], a[None, :, cols], b[None, :, cols], initial_state=state, emit_at=e
        )

    return per_sequence(cu, emits, initial_states, run, dim=-1)
