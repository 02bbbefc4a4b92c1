"""Grouped matmul: each row times its own expert's weight (mixture-of-experts dispatch).

Contract (:func:`grouped_matmul_ref`; the Triton twin is
:mod:`marconi_kernels.triton_grouped_matmul`): x [M, K] (one row per (token, expert)
pair), w [E, N, K] (each expert's weight as `F.linear` takes it), experts [M] long in
[0, E); returns out [M, N] in x's dtype with out[i] = x[i] @ w[experts[i]].T. Rows keep
their order; an expert with no rows costs nothing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_grouped_shapes(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor) -> None:
    """ValueError naming the first shape or dtype that breaks the contract."""
    if x.dim() != 2 or w.dim() != 3 or experts.dim() != 1:
        raise ValueError(
            f"need x [M, K], w [E, N, K], experts [M]; got {tuple(x.shape)}, "
            f"{tuple(w.shape)}, {tuple(experts.shape)}"
        )
    if x.shape[1] != w.shape[2] or experts.shape[0] != x.shape[0]:
        raise ValueError(
            f"x {tuple(x.shape)}, w {tuple(w.shape)} and experts {tuple(experts.shape)} "
            "disagree on K or M"
        )
    if experts.dtype != torch.long:
        raise ValueError(f"experts must be int64, got {experts.dtype}")


def grouped_matmul_ref(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """See the module docstring. Rows are grouped by a stable sort on their expert; one
    `F.linear` per expert that has rows (the per-expert counts are read to the host:
    free on CPU, a sync on a GPU, where the Triton twin reads nothing)."""
    check_grouped_shapes(x, w, experts)
    out = x.new_empty((x.shape[0], w.shape[1]))
    if x.shape[0] == 0:
        return out
    order = torch.argsort(experts, stable=True)
    counts = torch.bincount(experts, minlength=w.shape[0]).tolist()
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        rows = order[start : start + n]
        start += n
        out[rows] = F.linear(x.index_select(0, rows), w[e])
    return out
