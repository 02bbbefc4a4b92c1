"""The RG-LRU recurrence as Triton kernels: scan (one sequence per batch row, or packed
varlen sequences) with an initial state and emitted states, and the in-place decode step.

Same contracts as :mod:`marconi_kernels.rglru`: per channel ``h_t = a_t * h_{t-1} +
b_t * x_t``, ``y_t = h_t``. The scan's grid is (channel blocks of ``_BLOCK_D``, batch row
or sequence); each program keeps its [_BLOCK_D] state in registers and walks the tokens
in order, one strided column load of x, a and b per token (the recurrence is one fused
multiply-add; the mixer's projections dominate). Emission: the host maps each token to
the slot of the (deduplicated) emit position it ends, or -1; after token t the program
stores its state into ``emitted[slot[t]]``. All math is float32; y is cast to x.dtype on
store and states are float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ._util import check_emit_at
from .rglru import check_rglru_shapes, check_rglru_varlen
from .triton_runtime import device_guard

_BLOCK_D = 32  # channels per program


@triton.jit  # type: ignore[untyped-decorator]
def _scan_kernel(  # type: ignore[no-untyped-def]  # Triton reads annotations
    x_ptr,
    a_ptr,
    b_ptr,  # [B, D, L] (any strides; varlen: [D, T] with a zero batch stride)
    h0_ptr,
    y_ptr,
    hT_ptr,
    emit_ptr,  # [B, D] float32, [B, D, L] / [D, T], [B, D], [E, B, D] / [E, D]
    slot_ptr,  # [tokens] int32: the emit slot a token ends, or -1
    start_ptr,
    len_ptr,  # varlen: each sequence's first token and length [S] (int64)
    D,
    L,
    s_xb,
    s_xd,
    s_xt,
    s_ab,
    s_ad,
    s_at,
    s_bb,
    s_bd,
    s_bt,
    s_yb,
    s_yd,
    s_yt,
    s_emit,  # elements between consecutive emitted states
    s_emit_b,  # elements between batch rows of one emitted state (varlen: 0)
    VARLEN: tl.constexpr,
    HAS_H0: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    offs_d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    d64 = offs_d.to(tl.int64)
    if VARLEN:  # pid_b is a sequence of the packed tokens: its own start and length
        tok0 = tl.load(start_ptr + pid_b)
        L = tl.load(len_ptr + pid_b)
    else:
        tok0 = 0
    h_offs = pid_b * D + d64
    if HAS_H0:
        h = tl.load(h0_ptr + h_offs, mask=dmask, other=0.0).to(tl.float32)
    else:
        h = tl.zeros([BLOCK_D], dtype=tl.float32)
    x_rows = x_ptr + pid_b * s_xb + d64 * s_xd
    a_rows = a_ptr + pid_b * s_ab + d64 * s_ad
    b_rows = b_ptr + pid_b * s_bb + d64 * s_bd
    y_rows = y_ptr + pid_b * s_yb + d64 * s_yd
    for i in range(0, L):
        t = tok0 + i
        x = tl.load(x_rows + t * s_xt, mask=dmask, other=0.0).to(tl.float32)
        a = tl.load(a_rows + t * s_at, mask=dmask, other=0.0).to(tl.float32)
        b = tl.load(b_rows + t * s_bt, mask=dmask, other=0.0).to(tl.float32)
        h = a * h + b * x
        tl.store(y_rows + t * s_yt, h.to(y_ptr.dtype.element_ty), mask=dmask)
        slot = tl.load(slot_ptr + t)
        if slot >= 0:
            e_offs = slot.to(tl.int64) * s_emit + pid_b * s_emit_b + d64
            tl.store(emit_ptr + e_offs, h, mask=dmask)
    tl.store(hT_ptr + h_offs, h, mask=dmask)


@triton.jit  # type: ignore[untyped-decorator]
def _step_kernel(  # type: ignore[no-untyped-def]
    x_ptr,
    a_ptr,
    b_ptr,
    h_ptr,
    y_ptr,  # [B, D] each (any strides for x, a, b, h; y contiguous)
    D,
    s_xb,
    s_xd,
    s_ab,
    s_ad,
    s_bb,
    s_bd,
    s_hb,
    s_hd,
    BLOCK_D: tl.constexpr,
):
    pid_d = tl.program_id(0)
    pid_b = tl.program_id(1).to(tl.int64)
    offs_d = (pid_d * BLOCK_D + tl.arange(0, BLOCK_D)).to(tl.int64)
    dmask = offs_d < D
    x = tl.load(x_ptr + pid_b * s_xb + offs_d * s_xd, mask=dmask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + pid_b * s_ab + offs_d * s_ad, mask=dmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + pid_b * s_bb + offs_d * s_bd, mask=dmask, other=0.0).to(tl.float32)
    h_at = h_ptr + pid_b * s_hb + offs_d * s_hd
    h = tl.load(h_at, mask=dmask, other=0.0).to(tl.float32)
    h = a * h + b * x
    tl.store(h_at, h.to(h_ptr.dtype.element_ty), mask=dmask)
    tl.store(y_ptr + pid_b * D + offs_d, h.to(y_ptr.dtype.element_ty), mask=dmask)


def _slots(tokens: int, flat: list[int], device: torch.device) -> torch.Tensor:
    """int32 [tokens]: slot k at token flat[k] (0-based), -1 elsewhere."""
    slot = torch.full((max(tokens, 1),), -1, dtype=torch.int32)
    if flat:
        slot[torch.tensor(flat)] = torch.arange(len(flat), dtype=torch.int32)
    return slot.to(device)


def rglru_scan_triton(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`marconi_kernels.rglru.rglru_scan_ref`, in one launch:
    x, a, b [B, D, L] (any strides) -> y [B, D, L] (x.dtype), final [B, D] float32,
    emitted [len(emit_at), B, D] float32."""
    check_rglru_shapes(x, a, b, 3)
    n_b, d, L = x.shape
    if initial_state is not None and initial_state.shape != (n_b, d):
        raise ValueError(f"initial_state must be {(n_b, d)}, got {tuple(initial_state.shape)}")
    positions = check_emit_at(emit_at, L)
    dev = x.device
    h0 = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    uniq = sorted(set(positions))
    slot = _slots(L, [p - 1 for p in uniq], dev)
    y = torch.empty(n_b, d, L, dtype=x.dtype, device=dev)
    final = torch.zeros(n_b, d, dtype=torch.float32, device=dev) if h0 is None else h0.clone()
    emitted = torch.empty(len(uniq), n_b, d, dtype=torch.float32, device=dev)
    if L > 0 and n_b > 0 and d > 0:
        grid = (triton.cdiv(d, _BLOCK_D), n_b)
        with device_guard(x):
            _scan_kernel[grid](
                x, a, b, final if h0 is None else h0, y, final, emitted, slot, slot, slot,
                d, L, *x.stride(), *a.stride(), *b.stride(), *y.stride(), n_b * d, d,
                VARLEN=False, HAS_H0=h0 is not None, BLOCK_D=_BLOCK_D,
            )  # fmt: skip
    if len(uniq) != len(positions):  # expand duplicated positions
        index = torch.tensor([uniq.index(p) for p in positions], device=dev)
        emitted = emitted.index_select(0, index)
    return y, final, emitted


def rglru_scan_varlen_triton(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    initial_states: torch.Tensor | None = None,
    emit_at: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`marconi_kernels.rglru.rglru_scan_varlen_ref`, in one
    launch: the grid's second axis is the sequence, each program reading its first token
    and length and starting from its own state."""
    cu, emits = check_rglru_varlen(x, a, b, cu_seqlens, initial_states, emit_at)
    d, total = x.shape
    n_seq = len(cu) - 1
    dev = x.device
    h0 = None if initial_states is None else initial_states.to(torch.float32).contiguous()
    uniq = [sorted(set(e)) for e in emits]
    flat = [(s, p) for s in range(n_seq) for p in uniq[s]]
    slot = _slots(total, [cu[s] + p - 1 for s, p in flat], dev)
    y = torch.empty(d, total, dtype=x.dtype, device=dev)
    final = torch.zeros(n_seq, d, dtype=torch.float32, device=dev) if h0 is None else h0.clone()
    emitted = torch.empty(len(flat), d, dtype=torch.float32, device=dev)
    starts = torch.tensor(cu[:-1], dtype=torch.int64, device=dev)
    lengths = torch.tensor([cu[s + 1] - cu[s] for s in range(n_seq)], dtype=torch.int64)
    if d > 0 and n_seq > 0 and total > 0:
        grid = (triton.cdiv(d, _BLOCK_D), n_seq)
        with device_guard(x):
            _scan_kernel[grid](
                x, a, b, final if h0 is None else h0, y, final, emitted, slot, starts,
                lengths.to(dev), d, total, 0, *x.stride(), 0, *a.stride(), 0, *b.stride(),
                0, *y.stride(), d, 0,
                VARLEN=True, HAS_H0=h0 is not None, BLOCK_D=_BLOCK_D,
            )  # fmt: skip
    index = [flat.index((s, p)) for s in range(n_seq) for p in emits[s]]
    if index != list(range(len(flat))):  # duplicated positions
        emitted = emitted.index_select(0, torch.tensor(index, dtype=torch.long, device=dev))
    return y, final, emitted


def rglru_step_triton(
    x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, state: torch.Tensor
) -> torch.Tensor:
    """Same contract as :func:`marconi_kernels.rglru.rglru_step_ref`: ``state`` [B, D]
    becomes ``a * state + b * x`` in place (any strides); returns y [B, D] in x.dtype."""
    check_rglru_shapes(x, a, b, 2)
    if state.shape != x.shape:
        raise ValueError(f"state must be {tuple(x.shape)}, got {tuple(state.shape)}")
    n_b, d = x.shape
    y = torch.empty(n_b, d, dtype=x.dtype, device=x.device)
    if n_b > 0 and d > 0:
        grid = (triton.cdiv(d, _BLOCK_D), n_b)
        with device_guard(x):
            _step_kernel[grid](
                x, a, b, state, y, d, *x.stride(), *a.stride(), *b.stride(), *state.stride(),
                BLOCK_D=_BLOCK_D,
            )  # fmt: skip
    return y
