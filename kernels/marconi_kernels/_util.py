"""Small helpers shared by the reference kernels: dtype policy and dt/delta preprocessing."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

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
    cu_seqlens: Sequence[int], total: int, emit_at: Sequence[Sequence[int]]
) -> tuple[list[int], list[list[int]]]:
    """Validate the packing of a varlen op: S + 1 host ints rising from 0 to `total` (a
    sequence may be empty) and, per sequence, sorted emit positions in [1, its length]
    (`emit_at` empty: none anywhere). Returns (cu_seqlens, emit positions per sequence);
    ValueError naming the first bad value."""
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
    return cu, [check_emit_at(e, cu[s + 1] - cu[s]) for s, e in enumerate(emits)]
