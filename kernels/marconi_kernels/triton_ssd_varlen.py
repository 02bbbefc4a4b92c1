"""Mamba-2 SSD scan of several packed sequences as one Triton kernel, each sequence from
its own state, states emitted at any depth (see :func:`marconi_kernels.ssd.
ssd_chunk_scan_varlen_ref` for the contract and :mod:`marconi_kernels.ssd` for the math).

Why our own: mamba-ssm's chunked scan takes ``seq_idx`` for packed sequences but resets
every sequence to a zero state, and returns no state inside a sequence; a cache hit
resumes from a cached state and Marconi checkpoints at chosen depths.

Design: one program per (block of ``BP`` head channels, sequence x head) walks its
sequence's chunks in order (``ChunkTable``: no chunk spans two sequences) with its
[BP, N] state tile in registers. Per chunk of BT tokens, with a = cumsum(dt * A):
  y = ((C B^T) * exp(a_i - a_j) [j <= i]) (dt x) + exp(a) C S^T + D x
  S = exp(a_last) S + (dt x exp(a_last - a))^T B
and each emit at local token m stores exp(a_m) S + (dt x exp(a_m - a) [j <= m])^T B, the
exact state after it. dt arrives processed (bias, softplus, clamp) in float32; every
product is a float32 ``tl.dot`` at "ieee" precision, so states keep float32 rounding.
Tokens past a chunk's length load as zeros (dt = 0: decay 1, no input).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ._util import process_dt
from .chunk_table import ChunkTable
from .ssd import check_ssd_varlen
from .triton_runtime import device_guard

_INF = float("inf")
_MAX_CHUNK = 64  # [BT, BT] score tiles stay in registers
_MIN_BLOCK = 16  # tl.dot needs every dimension >= 16


@triton.jit  # type: ignore[untyped-decorator]
def _ssd_varlen_kernel(  # type: ignore[no-untyped-def]
    x_ptr, dt_ptr, a_ptr, b_ptr, c_ptr, d_ptr, h0_ptr, y_ptr, hT_ptr, emit_ptr,
    cstart_ptr, clen_ptr, crange_ptr, erange_ptr, epos_ptr,
    H, P, N, HPG,
    sxt, sxh, sxp, sdt, sdh, sbt, sbg, sbn, sct, scg, scn, syt, syh, syp,
    HAS_D: tl.constexpr, HAS_H0: tl.constexpr,
    BT: tl.constexpr, BP: tl.constexpr, NP: tl.constexpr,
):  # fmt: skip
    pid_p = tl.program_id(0)
    pid_sh = tl.program_id(1).to(tl.int64)
    i_s = pid_sh // H
    i_h = pid_sh % H
    i_g = i_h // HPG
    rows = tl.arange(0, BT)
    offs_p = pid_p * BP + tl.arange(0, BP)
    pmask = offs_p < P
    offs_n = tl.arange(0, NP)
    nmask = offs_n < N
    smask = pmask[:, None] & nmask[None, :]
    # [S, H, P, N] row-major offsets of this program's state tile
    s_offs = pid_sh * P * N + offs_p[:, None] * N + offs_n[None, :]
    if HAS_H0:
        S = tl.load(h0_ptr + s_offs, mask=smask, other=0.0)
    else:
        S = tl.zeros([BP, NP], dtype=tl.float32)
    A = tl.load(a_ptr + i_h).to(tl.float32)
    if HAS_D:
        Dh = tl.load(d_ptr + i_h).to(tl.float32)
    incl = rows[:, None] >= rows[None, :]
    c_lo = tl.load(crange_ptr + i_s)
    c_hi = tl.load(crange_ptr + i_s + 1)
    for c in range(c_lo, c_hi):
        tok0 = tl.load(cstart_ptr + c)
        tmask = rows < tl.load(clen_ptr + c)
        offs_t = tok0 + rows
        xmask = tmask[:, None] & pmask[None, :]
        x = tl.load(
            x_ptr + offs_t[:, None] * sxt + i_h * sxh + offs_p[None, :] * sxp, mask=xmask, other=0.0
        ).to(tl.float32)
        dt = tl.load(dt_ptr + offs_t * sdt + i_h * sdh, mask=tmask, other=0.0).to(tl.float32)
        bmask = tmask[:, None] & nmask[None, :]
        Bt = tl.load(
            b_ptr + offs_t[:, None] * sbt + i_g * sbg + offs_n[None, :] * sbn, mask=bmask, other=0.0
        ).to(tl.float32)
        Ct = tl.load(
            c_ptr + offs_t[:, None] * sct + i_g * scg + offs_n[None, :] * scn, mask=bmask, other=0.0
        ).to(tl.float32)
        acum = tl.cumsum(dt * A, 0)
        xdt = x * dt[:, None]
        decay = tl.where(incl, tl.exp(tl.where(incl, acum[:, None] - acum[None, :], 0.0)), 0.0)
        cb = tl.dot(Ct, tl.trans(Bt), input_precision="ieee") * decay
        y = tl.dot(cb, xdt, input_precision="ieee")
        y += tl.dot(Ct * tl.exp(acum)[:, None], tl.trans(S), input_precision="ieee")
        if HAS_D:
            y += Dh * x
        tl.store(
            y_ptr + offs_t[:, None] * syt + i_h * syh + offs_p[None, :] * syp,
            y.to(y_ptr.dtype.element_ty),
            mask=xmask,
        )
        for e in range(tl.load(erange_ptr + c), tl.load(erange_ptr + c + 1)):
            m = tl.load(epos_ptr + e) - 1  # local index of the emit's last token
            a_m = tl.sum(tl.where(rows == m, acum, 0.0))
            upto = rows <= m
            coef = tl.where(upto, tl.exp(tl.where(upto, a_m - acum, 0.0)), 0.0)
            S_m = tl.exp(a_m) * S + tl.dot(
                tl.trans(xdt * coef[:, None]), Bt, input_precision="ieee"
            )
            e_offs = e * H * P * N + i_h * P * N  # e is int64 (erange is)
            tl.store(emit_ptr + e_offs + offs_p[:, None] * N + offs_n[None, :], S_m, mask=smask)
        a_last = tl.sum(tl.where(rows == BT - 1, acum, 0.0))
        S = tl.exp(a_last) * S + tl.dot(
            tl.trans(xdt * tl.exp(a_last - acum)[:, None]), Bt, input_precision="ieee"
        )
    tl.store(hT_ptr + s_offs, S, mask=smask)


def ssd_chunk_scan_varlen_triton(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    cu_seqlens: Sequence[int],
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, _INF),
    initial_states: torch.Tensor | None = None,
    emit_at: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`ssd_chunk_scan_varlen_ref`, in one launch. The kernel's
    chunk is ``chunk_size`` rounded to a power of two in [16, 64] (the chunk length is
    the algorithm's, not the model's: results agree to rounding)."""
    H, P, G, N, cu, emits = check_ssd_varlen(x, dt, A, B, C, D, initial_states, cu_seqlens, emit_at)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    n_seq, total = len(cu) - 1, x.shape[0]
    dev = x.device
    BT = min(_MAX_CHUNK, max(_MIN_BLOCK, int(triton.next_power_of_2(chunk_size))))
    table = ChunkTable.of(cu, emits, BT)
    h0 = None if initial_states is None else initial_states.to(torch.float32).contiguous()
    y = torch.empty(total, H, P, dtype=x.dtype, device=dev)
    final = torch.empty(n_seq, H, P, N, dtype=torch.float32, device=dev)
    emitted = torch.empty(len(table.epos), H, P, N, dtype=torch.float32, device=dev)
    if n_seq == 0 or H * P * N == 0:
        return y, torch.zeros_like(final) if h0 is None else h0.clone(), emitted.zero_()
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, torch.float32)
    cstart, clen, crange, erange, epos = table.tensors(dev)
    BP = min(32, max(_MIN_BLOCK, int(triton.next_power_of_2(P))))
    grid = (triton.cdiv(P, BP), n_seq * H)
    with device_guard(x):
        _ssd_varlen_kernel[grid](
            x, dtp, A.float().contiguous(), B, C,
            x if D is None else D.float().contiguous(),
            final if h0 is None else h0, y, final, emitted,
            cstart, clen, crange, erange, epos,
            H, P, N, H // G,
            *x.stride(), *dtp.stride(), *B.stride(), *C.stride(), *y.stride(),
            HAS_D=D is not None, HAS_H0=h0 is not None,
            BT=BT, BP=BP, NP=max(_MIN_BLOCK, int(triton.next_power_of_2(N))),
            num_warps=4,
        )  # fmt: skip
    return y, final, emitted
