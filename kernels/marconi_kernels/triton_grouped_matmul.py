"""Triton grouped matmul (see :mod:`marconi_kernels.grouped_matmul` for the contract;
:func:`grouped_matmul_ref` is its pure-torch twin), with no host sync.

Design: the rows are laid out on the device by expert, each expert's run padded to a
multiple of ``BLOCK_M`` (`align_by_expert`: a stable sort, per-expert counts, cumulative
sums and a searchsorted; no value is read to the host, and every shape depends only on M
and E: at most cdiv(M + E * (BLOCK_M - 1), BLOCK_M) blocks). One program computes a
``BLOCK_M`` x ``BLOCK_N`` tile of one block: it reads the block's expert, gathers its rows
of x through the layout, walks K ``BLOCK_K`` at a time with `tl.dot` on float32 tiles
(IEEE products for float32 inputs, TF32 on a GPU for bf16 / fp16 ones; float32
accumulation) against that expert's weight, and
writes each row back to its original position (so no atomics). Blocks past the last
expert's run exit at once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grouped_matmul import check_grouped_shapes
from .triton_runtime import device_guard

BLOCK_M = 16
BLOCK_N = 32
BLOCK_K = 32


def align_by_expert(
    experts: torch.Tensor, n_experts: int, block: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The device layout: (rows [n_blocks * block]: each slot's original row, M for a
    padding slot; block_expert [n_blocks]: each block's expert, -1 past the last run),
    n_blocks = cdiv(M + n_experts * (block - 1), block). Pure device ops, no host read."""
    m = experts.shape[0]
    n_blocks = -(-(m + n_experts * (block - 1)) // block)
    counts = torch.bincount(experts, minlength=n_experts)
    padded = (counts + block - 1) // block * block
    padded_end = torch.cumsum(padded, 0)
    order = torch.argsort(experts, stable=True)
    sorted_e = experts[order]
    first = torch.cumsum(counts, 0) - counts  # each expert's first row in sorted order
    rank = torch.arange(m, device=experts.device) - first[sorted_e]
    dest = (padded_end - padded)[sorted_e] + rank
    rows = torch.full((n_blocks * block,), m, dtype=torch.long, device=experts.device)
    rows[dest] = order
    starts = torch.arange(n_blocks, device=experts.device) * block
    block_expert = torch.searchsorted(padded_end, starts, right=True)
    block_expert = torch.where(block_expert < n_experts, block_expert, -1)
    return rows, block_expert


@triton.jit  # type: ignore[untyped-decorator]
def _grouped_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, out_ptr, rows_ptr, block_expert_ptr,
    M, N, K, sxm, swe, swn, swk, som,
    IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    if e < 0:
        return
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = tl.load(rows_ptr + slots)
    rmask = rows < M
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        kmask = kk < K
        a = tl.load(
            x_ptr + rows[:, None] * sxm + kk[None, :], mask=rmask[:, None] & kmask[None, :],
            other=0.0,
        )  # fmt: skip
        b = tl.load(
            w_ptr + e * swe + n[None, :] * swn + kk[:, None] * swk,
            mask=kmask[:, None] & nmask[None, :], other=0.0,
        )  # fmt: skip
        a, b = a.to(tl.float32), b.to(tl.float32)
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    tl.store(
        out_ptr + rows[:, None] * som + n[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=rmask[:, None] & nmask[None, :],
    )


def grouped_matmul_triton(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Same contract as :func:`grouped_matmul_ref`; x must be contiguous in its last dim
    (it is made so), w may have any strides."""
    check_grouped_shapes(x, w, experts)
    m, k = x.shape
    n_experts, n, _ = w.shape
    x = x.contiguous()
    out = x.new_empty((m, n))
    if m == 0:
        return out
    rows, block_expert = align_by_expert(experts, n_experts, BLOCK_M)
    grid = (block_expert.shape[0], triton.cdiv(n, BLOCK_N))
    with device_guard(x):
        _grouped_kernel[grid](
            x, w, out, rows, block_expert,
            m, n, k, x.stride(0), w.stride(0), w.stride(1), w.stride(2), out.stride(0),
            IEEE=x.dtype == torch.float32,
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        )  # fmt: skip
    return out
