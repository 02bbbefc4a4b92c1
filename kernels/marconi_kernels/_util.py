"""Small helpers shared by the reference kernels: dtype policy and dt/delta preprocessing."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F


def compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """The dtype the reference kernels compute in.

    float32 for half/bfloat16/float32 inputs; float64 when any input is float64 (tests use
    this to tighten tolerances). Never lower than float32.
    """
    dtype = torch.float32
    for t in tensors:
        if t is not None and t.dtype == torch.float64:
            dtype = torch.float64
    return dtype


def process_dt(
    dt: torch.Tensor,
    dt_bias: torch.Tensor | None,
    softplus: bool,
    limit: tuple[float, float] = (0.0, float("inf")),
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Return ``clamp(softplus(dt + dt_bias), *limit)`` in ``dtype``.

    dt: [..., H] any float dtype; dt_bias: [H] or None (broadcast over the last dim);
    softplus: apply ``F.softplus`` (threshold 20, like mamba-ssm); limit: (lo, hi) clamp,
    skipped when it is the default (0, inf). Returns a new tensor of dt's shape in ``dtype``.
    """
    out = dt.to(dtype)
    if dt_bias is not None:
        out = out + dt_bias.to(dtype)
    if softplus:
        out = F.softplus(out)
    lo, hi = limit
    if lo > 0.0 or hi != float("inf"):
        out = out.clamp(min=lo, max=hi)
    return out


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int, int]:
    """Validate a linear-attention prefill's q, k [b, L, H, K] and v [b, L, H, V] (ValueError
    naming the shapes); returns (b, L, H, K, V)."""
    if q.dim() != 4 or k.shape != q.shape:
        raise ValueError(
            f"q and k must both be [b, L, H, K], got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    b, L, H, K = q.shape
    if v.dim() != 4 or v.shape[:3] != (b, L, H):
        raise ValueError(f"v must be [b, L, H, V] with b, L, H = {(b, L, H)}, got {tuple(v.shape)}")
    return b, L, H, K, v.shape[3]


def check_shape(name: str, t: torch.Tensor | None, want: tuple[int, ...], layout: str = "") -> None:
    """ValueError "`name` must be [`layout` =] `want`, got ..." unless `t` is None or has
    shape `want`."""
    if t is not None and t.shape != want:
        shown = f"{layout} = {want}" if layout else f"{want}"
        raise ValueError(f"{name} must be {shown}, got {tuple(t.shape)}")


def check_emit_at(emit_at: Sequence[int], length: int) -> list[int]:
    """Validate emit positions: ints, sorted ascending, each in [1, length]. Returns a list."""
    positions = [int(p) for p in emit_at]
    for p in positions:
        if not 1 <= p <= length:
            raise ValueError(f"emit_at position {p} is outside [1, {length}]")
    if any(a > b for a, b in itertools.pairwise(positions)):
        raise ValueError(f"emit_at must be sorted ascending, got {positions}")
    return positions


def check_varlen(
    cu_seqlens: Sequence[int],
    total: int,
    emit_at: Sequence[Sequence[int]],
    initial_states: torch.Tensor | None = None,
    state_shape: tuple[int, ...] = (),
) -> tuple[list[int], list[list[int]]]:
    """Validate the packing of a varlen op: S + 1 host ints rising from 0 to `total` (a
    sequence may be empty), per sequence sorted emit positions in [1, its length]
    (`emit_at` empty: none anywhere), and `initial_states` (None, or [S, *state_shape]).
    Returns (cu_seqlens, emit positions per sequence); ValueError naming the first bad
    value."""
    cu = [int(c) for c in cu_seqlens]
    if (
        len(cu) < 2
        or cu[0] != 0
        or cu[-1] != total
        or any(a > b for a, b in itertools.pairwise(cu))
    ):
        raise ValueError(f"cu_seqlens must rise from 0 to T = {total}, got {cu}")
    n_seq = len(cu) - 1
    emits = emit_at or [()] * n_seq
    if len(emits) != n_seq:
        raise ValueError(f"emit_at needs one list per sequence ({n_seq}), got {len(emits)}")
    shape = (n_seq, *state_shape)
    if initial_states is not None and initial_states.shape != shape:
        raise ValueError(f"initial_states must be {shape}, got {tuple(initial_states.shape)}")
    return cu, [check_emit_at(e, cu[s + 1] - cu[s]) for s, e in enumerate(emits)]


Outputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""A scan's (y, final state, emitted states)."""

OneSequence = Callable[[slice, torch.Tensor | None, list[int]], Outputs]
"""A one-sequence reference on batch row 0 of rows `rows`, from `state` ([1, ...] or
None), emitting at `emit_at`: (y [1, ...], final [1, ...], emitted [E, 1, ...])."""


def per_sequence(
    cu: Sequence[int],
    emits: Sequence[list[int]],
    initial_states: torch.Tensor | None,
    run: OneSequence,
    dim: int = 0,
) -> Outputs:
    """The varlen references' loop: `run` each packed sequence alone; returns its outputs
    concatenated along `dim` in sequence order, the final states stacked [S, ...] and the
    emitted ones concatenated [E, ...]."""
    ys, finals, emitted = [], [], []
    for s, e in enumerate(emits):
        state = None if initial_states is None else initial_states[s : s + 1]
        y, final, out = run(slice(cu[s], cu[s + 1]), state, e)
        ys.append(y[0])
        finals.append(final[0])
        emitted.append(out[:, 0])
    return torch.cat(ys, dim=dim), torch.stack(finals), torch.cat(emitted)


def token_by_token(
    step: Callable[[torch.Tensor, int], torch.Tensor],
    state: torch.Tensor,
    length: int,
    emit_at: Sequence[int],
    empty_out: torch.Tensor,
) -> Outputs:
    """A recurrent op's ground truth, one token at a time: `step(state, t)` updates
    `state` in place with token t and returns its output [b, ...], for t in 0..length-1;
    the state is copied after each token that ends at a position of `emit_at` (checked
    positions). Returns (outputs stacked on dim 1, `empty_out` when `length` is 0; the
    final state; emitted [len(emit_at), *state.shape])."""
    wanted = set(emit_at)
    outs, emitted = [], []
    for t in range(length):
        outs.append(step(state, t))
        if t + 1 in wanted:
            emitted.append(state.clone())
    o = torch.stack(outs, dim=1) if outs else empty_out
    emitted_t = torch.stack(emitted) if emitted else state.new_empty((0, *state.shape))
    return o, state, emitted_t


def start_state(
    initial_state: torch.Tensor | None,
    shape: tuple[int, ...],
    dtype: torch.dtype,
    device: torch.device,
) -> torch.Tensor:
    """A scan's running state: a copy of `initial_state` in `dtype`, or zeros of `shape`."""
    if initial_state is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return initial_state.to(dtype).clone()
