"""Triton kernels for the depthwise causal conv1d with a carried state.

Same contracts as the pure-torch twins in :mod:`marconi_kernels.conv`
(:func:`causal_conv1d_ref`, :func:`causal_conv1d_update_ref`); they differ only in computing
in float32 for every input dtype (the references use float64 for float64 inputs).

Design:

* Prefill (``_conv_fwd_kernel``): one program per (batch row, channel block, token block)
  computes a [BLOCK_C, BLOCK_L] tile of outputs. For each of the K taps (an unrolled constexpr
  loop) it loads the tile of inputs shifted back by ``K - 1 - k`` tokens; a source position
  before the first token reads the carried state instead (column ``K + pos``, so only the
  newest K - 1 state columns are touched), with masked loads. The history is never
  concatenated: x, the state and y keep their own strides.
* States (the final one and any emitted ones) are copies of inputs, so they are sliced in
  torch from at most K columns each: the last K columns of concat(initial_state, x[..., :p]).
* Decode (``_conv_update_kernel``): one program per (batch row, channel block) walks the K
  state columns oldest first, loading column k + 1 (or the new token for the newest slot),
  storing it into column k and accumulating it times the tap. Each column is read before it
  is overwritten, by the lanes that own its channels (stores of replicated lanes are
  deduplicated; num_warps shrinks with the block so few lanes are replicas), so the in-place
  shift needs no extra buffer and honours any state strides (e.g. a row slice of a cache).

Offsets that involve the batch index are computed in int64; per-row offsets are int32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from ._util import check_emit_at
from .conv import check_conv_varlen, varlen_states
from .triton_runtime import device_guard

_TILE = 2048  # target outputs per prefill program (BLOCK_C * BLOCK_L)
_MAX_BLOCK_L = 128
_UPDATE_BLOCK_C = 128


def _silu_flag(activation: str | None) -> bool:
    """True for "silu"/"swish", False for None; ValueError naming anything else."""
    if activation is None:
        return False
    if activation in ("silu", "swish"):
        return True
    raise ValueError(f"unsupported activation {activation!r}; use 'silu' or None")


@triton.jit  # type: ignore[untyped-decorator]
def _bias_act(acc, bias_ptr, offs_c, mask_c, HAS_BIAS: tl.constexpr, SILU: tl.constexpr):  # type: ignore[no-untyped-def]
    """A [BLOCK_C, BLOCK_L] tile of conv sums plus the channels' bias, through the silu."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)[:, None]
    if SILU:
        acc = acc * tl.sigmoid(acc)
    return acc


@triton.jit  # type: ignore[untyped-decorator]
def _conv_fwd_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, bias_ptr, state_ptr, y_ptr,
    C, L,
    sxb, sxc, sxl, swc, swk, ssb, ssc, ssk, syb, syc, syl,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, SILU: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    pid_b = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_l = tl.program_id(2) * BLOCK_L + tl.arange(0, BLOCK_L)
    mask_c = offs_c < C
    mask_l = offs_l < L
    x_rows = x_ptr + pid_b * sxb + offs_c[:, None] * sxc
    s_rows = state_ptr + pid_b * ssb + offs_c[:, None] * ssc
    acc = tl.zeros((BLOCK_C, BLOCK_L), dtype=tl.float32)
    for k in tl.static_range(K):
        src = offs_l - (K - 1 - k)  # source token of tap k; negative: from the state
        in_x = mask_l & (src >= 0)
        vals = tl.load(
            x_rows + tl.where(in_x, src, 0)[None, :] * sxl,
            mask=mask_c[:, None] & in_x[None, :],
            other=0.0,
        ).to(tl.float32)
        if HAS_STATE:
            in_s = mask_l & (src < 0)
            vals += tl.load(
                s_rows + tl.where(in_s, src + K, 0)[None, :] * ssk,
                mask=mask_c[:, None] & in_s[None, :],
                other=0.0,
            ).to(tl.float32)
        w = tl.load(w_ptr + offs_c * swc + k * swk, mask=mask_c, other=0.0).to(tl.float32)
        acc += vals * w[:, None]
    acc = _bias_act(acc, bias_ptr, offs_c, mask_c, HAS_BIAS, SILU)
    y_ptrs = y_ptr + pid_b * syb + offs_c[:, None] * syc + offs_l[None, :] * syl
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_c[:, None] & mask_l[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _conv_varlen_kernel(  # type: ignore[no-untyped-def]
    x_ptr, w_ptr, bias_ptr, state_ptr, seq_ptr, start_ptr, y_ptr,
    C, T,
    sxc, sxt, swc, swk, sss, ssc, ssk, syc, syt,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, SILU: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    offs_c = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    offs_t = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    mask_c = offs_c < C
    mask_t = offs_t < T
    seq = tl.load(seq_ptr + offs_t, mask=mask_t, other=0).to(tl.int64)
    start = tl.load(start_ptr + offs_t, mask=mask_t, other=0)
    acc = tl.zeros((BLOCK_C, BLOCK_L), dtype=tl.float32)
    for k in tl.static_range(K):
        src = offs_t - (K - 1 - k)  # source token of tap k; before its sequence: the state
        in_x = mask_t & (src >= start)
        vals = tl.load(
            x_ptr + offs_c[:, None] * sxc + tl.where(in_x, src, 0)[None, :] * sxt,
            mask=mask_c[:, None] & in_x[None, :],
            other=0.0,
        ).to(tl.float32)
        if HAS_STATE:
            in_s = mask_t & (src < start)
            col = tl.where(in_s, src - start + K, 0)
            vals += tl.load(
                state_ptr + seq[None, :] * sss + offs_c[:, None] * ssc + col[None, :] * ssk,
                mask=mask_c[:, None] & in_s[None, :],
                other=0.0,
            ).to(tl.float32)
        w = tl.load(w_ptr + offs_c * swc + k * swk, mask=mask_c, other=0.0).to(tl.float32)
        acc += vals * w[:, None]
    acc = _bias_act(acc, bias_ptr, offs_c, mask_c, HAS_BIAS, SILU)
    y_ptrs = y_ptr + offs_c[:, None] * syc + offs_t[None, :] * syt
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask_c[:, None] & mask_t[None, :])


@triton.jit  # type: ignore[untyped-decorator]
def _conv_update_kernel(  # type: ignore[no-untyped-def]
    x_ptr, state_ptr, w_ptr, bias_ptr, y_ptr,
    C,
    sxb, sxc, ssb, ssc, ssk, swc, swk, syb, syc,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, SILU: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    pid_b = tl.program_id(0).to(tl.int64)
    offs_c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    s_row = state_ptr + pid_b * ssb + offs_c * ssc
    acc = tl.zeros((BLOCK_C,), dtype=tl.float32)
    for k in tl.static_range(K):
        if k < K - 1:  # new column k = old column k + 1, read before column k + 1 is written
            col = tl.load(s_row + (k + 1) * ssk, mask=mask_c, other=0.0)
        else:
            col = tl.load(x_ptr + pid_b * sxb + offs_c * sxc, mask=mask_c, other=0.0)
            col = col.to(state_ptr.dtype.element_ty)
        tl.store(s_row + k * ssk, col, mask=mask_c)
        w = tl.load(w_ptr + offs_c * swc + k * swk, mask=mask_c, other=0.0).to(tl.float32)
        acc += col.to(tl.float32) * w
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_c, mask=mask_c, other=0.0).to(tl.float32)
    if SILU:
        acc = acc * tl.sigmoid(acc)
    tl.store(y_ptr + pid_b * syb + offs_c * syc, acc.to(y_ptr.dtype.element_ty), mask=mask_c)


def _check_bias(bias: torch.Tensor | None, ch: int) -> torch.Tensor | None:
    if bias is not None and bias.shape != (ch,):
        raise ValueError(f"bias must be [{ch}], got {tuple(bias.shape)}")
    return None if bias is None else bias.contiguous()


def _state_after(x: torch.Tensor, init: torch.Tensor | None, p: int, K: int) -> torch.Tensor:
    """Last K columns of concat(init, x[..., :p]) (init None: zeros), built from K columns."""
    if p >= K:
        return x[:, :, p - K : p]
    b, ch, _ = x.shape
    head = x.new_zeros(b, ch, K - p) if init is None else init[:, :, p:]
    return torch.cat([head, x[:, :, :p]], dim=-1)


def causal_conv1d_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    activation: str | None = "silu",
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Depthwise causal conv1d over a sequence, resuming from a state (Triton prefill).

    Args:
        x: [b, C, L] inputs (any float dtype, any strides; L may be 0).
        weight: [C, K] per-channel taps (any K >= 1); weight[:, -1] multiplies the current token.
        bias: [C] or None.
        initial_state: [b, C, K] last K inputs before x (newest last), or None (zeros). Only
            its newest K - 1 columns affect y.
        activation: "silu" (alias "swish") or None; anything else raises ValueError.
        emit_at: sorted positions p (1 <= p <= L): return the state after the first p tokens.

    Returns:
        y: [b, C, L] in x.dtype (accumulated in float32).
        final_state: [b, C, K] in x.dtype, the last K columns of concat(initial_state, x).
        emitted: [len(emit_at), b, C, K] in x.dtype.
    """
    if x.dim() != 3:
        raise ValueError(f"x must be [b, C, L], got shape {tuple(x.shape)}")
    b, ch, L = x.shape
    if weight.dim() != 2 or weight.shape[0] != ch or weight.shape[1] < 1:
        raise ValueError(f"weight must be [C, K] with C = {ch}, got {tuple(weight.shape)}")
    K = weight.shape[1]
    if initial_state is not None and initial_state.shape != (b, ch, K):
        raise ValueError(f"initial_state must be {(b, ch, K)}, got {tuple(initial_state.shape)}")
    positions = check_emit_at(emit_at, L)
    silu = _silu_flag(activation)
    bias_c = _check_bias(bias, ch)
    init = None if initial_state is None else initial_state.to(x.dtype)

    y = torch.empty((b, ch, L), dtype=x.dtype, device=x.device)
    if b > 0 and ch > 0 and L > 0:
        block_l = min(_MAX_BLOCK_L, max(16, triton.next_power_of_2(L)))
        block_c = min(_TILE // block_l, max(2, triton.next_power_of_2(ch)))
        grid = (b, triton.cdiv(ch, block_c), triton.cdiv(L, block_l))
        state_arg = x if init is None else init
        with device_guard(x):
            _conv_fwd_kernel[grid](
                x, weight, x if bias_c is None else bias_c, state_arg, y,
                ch, L,
                *x.stride(), *weight.stride(), *state_arg.stride(), *y.stride(),
                K=K, HAS_BIAS=bias_c is not None, HAS_STATE=init is not None, SILU=silu,
                BLOCK_C=block_c, BLOCK_L=block_l,
            )  # fmt: skip

    final_state = _state_after(x, init, L, K).clone(memory_format=torch.contiguous_format)
    if positions:
        emitted = torch.stack([_state_after(x, init, p, K) for p in positions])
    else:
        emitted = x.new_empty((0, b, ch, K))
    return y, final_state, emitted


def causal_conv1d_varlen_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    cu_seqlens: Sequence[int],
    initial_states: torch.Tensor | None = None,
    activation: str | None = "silu",
    emit_at: Sequence[Sequence[int]] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as :func:`causal_conv1d_varlen_ref`: S sequences packed in x [C, T]
    in one launch. Each token reads its K - 1 predecessors, or, before its sequence's
    first token, its sequence's state (the token's sequence and start are two [T]
    tensors built on the device); the states are gathered as the reference gathers them."""
    cu, emits = check_conv_varlen(x, weight, cu_seqlens, initial_states, emit_at)
    n_seq = len(cu) - 1
    ch, total = x.shape
    K = weight.shape[1]
    silu = _silu_flag(activation)
    bias_c = _check_bias(bias, ch)
    init = None if initial_states is None else initial_states.to(x.dtype)
    lengths = [cu[s + 1] - cu[s] for s in range(n_seq)]
    y = torch.empty((ch, total), dtype=x.dtype, device=x.device)
    if ch > 0 and total > 0:
        dev = x.device
        seqs = torch.arange(n_seq, device=dev)
        seq = torch.repeat_interleave(seqs, torch.tensor(lengths, device=dev), output_size=total)
        start = torch.tensor(cu[:-1], device=dev)[seq]
        block_l = min(_MAX_BLOCK_L, max(16, triton.next_power_of_2(total)))
        block_c = min(_TILE // block_l, max(2, triton.next_power_of_2(ch)))
        grid = (triton.cdiv(ch, block_c), triton.cdiv(total, block_l))
        state_arg = x.new_empty(1, 1, 1) if init is None else init
        with device_guard(x):
            _conv_varlen_kernel[grid](
                x, weight, x if bias_c is None else bias_c, state_arg, seq, start, y,
                ch, total,
                *x.stride(), *weight.stride(), *state_arg.stride(), *y.stride(),
                K=K, HAS_BIAS=bias_c is not None, HAS_STATE=init is not None, SILU=silu,
                BLOCK_C=block_c, BLOCK_L=block_l,
            )  # fmt: skip
    final, emitted = varlen_states(x, init, cu, K, emits)
    return y, final, emitted


def causal_conv1d_update_triton(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
) -> torch.Tensor:
    """One decode step of the causal conv (Triton); ``state`` is updated in place.

    Args:
        x: [b, C] the new token's inputs (any strides).
        state: [b, C, K] last K inputs (newest last), any strides (a view into a larger cache
            is fine); shifted left by one with x (cast to state.dtype) appended, in place.
        weight: [C, K]; bias: [C] or None; activation: "silu" (alias "swish") or None.

    Returns:
        y: [b, C] in x.dtype, ``act(sum_k state_new[..., k] * weight[:, k] + bias)`` computed
        in float32.
    """
    if x.dim() != 2 or state.dim() != 3 or state.shape[:2] != x.shape:
        raise ValueError(
            f"x must be [b, C] and state [b, C, K]; got {tuple(x.shape)}, {tuple(state.shape)}"
        )
    if weight.shape != (state.shape[1], state.shape[2]) or state.shape[2] < 1:
        raise ValueError(f"weight must be {tuple(state.shape[1:])}, got {tuple(weight.shape)}")
    b, ch, K = state.shape
    silu = _silu_flag(activation)
    bias_c = _check_bias(bias, ch)
    y = torch.empty((b, ch), dtype=x.dtype, device=x.device)
    if b == 0 or ch == 0:
        return y
    block_c = min(_UPDATE_BLOCK_C, max(2, triton.next_power_of_2(ch)))
    grid = (b, triton.cdiv(ch, block_c))
    with device_guard(x):
        _conv_update_kernel[grid](
            x, state, weight, x if bias_c is None else bias_c, y,
            ch,
            *x.stride(), *state.stride(), *weight.stride(), *y.stride(),
            K=K, HAS_BIAS=bias_c is not None, SILU=silu, BLOCK_C=block_c,
            num_warps=max(1, min(4, block_c // 32)),  # few lanes hold replicated channels
        )  # fmt: skip
    return y
