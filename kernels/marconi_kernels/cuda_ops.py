"""GPU kernels from mamba-ssm (>= 2.x) and causal-conv1d (>= 1.4), adapted to our signatures.

Importing this module imports mamba_ssm and causal_conv1d: only ``dispatch`` imports it,
lazily, after checking that CUDA is there. Every wrapper has the exact signature and
conventions of its ``_ref`` twin (dt preprocessing, state layouts, emitted states), so the
engine can swap them. dt/delta bias, softplus and clamp are applied here in float32 and the
processed values are passed with the kernels' own dt handling switched off, so both
implementations agree on the dt semantics (mamba-ssm's state update has no dt_limit).

The Mamba-1 full-sequence scan has no GPU twin: mamba-ssm's ``selective_scan_fn`` accepts no
initial state, so ``selective_scan`` stays on :func:`selective_scan_ref` (which runs on GPU
tensors too, just slower).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import torch
from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
from mamba_ssm.ops.triton.selective_state_update import selective_state_update
from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

from ._util import check_emit_at, process_dt
from .conv import causal_conv1d_ref, causal_conv1d_update_ref

_INF = float("inf")
_CONV_WIDTHS = (2, 3, 4)  # widths causal-conv1d's CUDA kernels are compiled for


def ssd_chunk_scan_cuda(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, _INF),
    initial_state: torch.Tensor | None = None,
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``mamba_chunk_scan_combined`` with the signature of ``ssd_chunk_scan_ref``.

    x [b, L, H, P]; dt [b, L, H] raw; A [H]; B, C [b, L, G, N]; D [H] or None;
    initial_state [b, H, P, N] float32 or None. Emitted states come from calling the kernel
    once per segment between emit positions, chaining final -> initial states. Returns
    (y [b, L, H, P] in x.dtype, final_state [b, H, P, N] float32,
    emitted [len(emit_at), b, H, P, N] float32).
    """
    b, L, H, P = x.shape
    N = B.shape[-1]
    positions = check_emit_at(emit_at, L)
    state = None if initial_state is None else initial_state.float().contiguous()
    if L == 0:
        final = state if state is not None else x.new_zeros(b, H, P, N, dtype=torch.float32)
        return x.clone(), final, final.new_empty((0, b, H, P, N))
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, torch.float32)
    Af = A.float().contiguous()
    Df = None if D is None else D.float().contiguous()
    counts = Counter(positions)
    bounds = sorted({0, L, *positions})
    ys: list[torch.Tensor] = []
    emitted: list[torch.Tensor] = []
    for s, e in itertools.pairwise(bounds):
        y_seg, state = mamba_chunk_scan_combined(
            x[:, s:e].contiguous(),
            dtp[:, s:e].contiguous(),
            Af,
            B[:, s:e].contiguous(),
            C[:, s:e].contiguous(),
            chunk_size,
            D=Df,
            initial_states=state,
            dt_softplus=False,
            return_final_states=True,
        )
        state = state.float()
        ys.append(y_seg)
        emitted.extend(state.clone() for _ in range(counts.get(e, 0)))
    assert state is not None
    y = torch.cat(ys, dim=1).to(x.dtype)
    emitted_t = torch.stack(emitted) if emitted else state.new_empty((0, b, H, P, N))
    return y, state, emitted_t


def mamba2_state_update_cuda(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = True,
    dt_limit: tuple[float, float] = (0.0, _INF),
) -> torch.Tensor:
    """Triton ``selective_state_update`` in its multi-head layout (per-head params expanded).

    state [b, H, P, N] float32 (in place); x [b, H, P]; dt [b, H] raw; A [H]; B, C
    [b, G, N]; D [H] or None. Returns y [b, H, P] in x.dtype.
    """
    b, H, P, N = state.shape
    dtp = process_dt(dt, dt_bias, dt_softplus, dt_limit, torch.float32)
    y: torch.Tensor = selective_state_update(
        state,
        x,
        dtp.unsqueeze(-1).expand(b, H, P),
        A.float()[:, None, None].expand(H, P, N),
        B,
        C,
        D=None if D is None else D.float()[:, None].expand(H, P),
        z=None,
        dt_bias=None,
        dt_softplus=False,
    )
    return y.to(x.dtype)


def mamba1_state_update_cuda(
    state: torch.Tensor,
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    *,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = True,
) -> torch.Tensor:
    """Triton ``selective_state_update`` in its single-head (Mamba-1) layout.

    state [b, Dm, N] float32 (in place); u, delta [b, Dm] (delta raw); A [Dm, N];
    B, C [b, N]; D [Dm]; z [b, Dm]; delta_bias [Dm]. Returns y [b, Dm] in u.dtype.
    """
    d = process_dt(delta, delta_bias, delta_softplus, dtype=torch.float32)
    y: torch.Tensor = selective_state_update(
        state,
        u,
        d,
        A.float(),
        B,
        C,
        D=None if D is None else D.float(),
        z=z,
        dt_bias=None,
        dt_softplus=False,
    )
    return y.to(u.dtype)


def _channel_last(t: torch.Tensor) -> torch.Tensor:
    """[b, C, L] tensor with the same values laid out channel-last (stride(1) == 1)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def causal_conv1d_cuda(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    initial_state: torch.Tensor | None = None,
    activation: str | None = "silu",
    emit_at: Sequence[int] = (),
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``causal_conv1d_fn`` with the signature and state convention of ``causal_conv1d_ref``.

    x [b, C, L]; weight [C, K]; bias [C]; initial_state [b, C, K] (last K inputs; the kernel
    gets the newest K - 1). Widths outside 2..4 fall back to the reference. States are
    slices of concat(initial_state, x), in x.dtype. Returns (y [b, C, L] in x.dtype,
    final_state [b, C, K], emitted [len(emit_at), b, C, K]).
    """
    b, ch, L = x.shape
    K = weight.shape[1]
    if K not in _CONV_WIDTHS or L == 0:
        return causal_conv1d_ref(
            x, weight, bias, initial_state=initial_state, activation=activation, emit_at=emit_at
        )
    positions = check_emit_at(emit_at, L)
    init = x.new_zeros(b, ch, K) if initial_state is None else initial_state.to(x.dtype)
    y = causal_conv1d_fn(
        _channel_last(x),
        weight.contiguous(),
        None if bias is None else bias.to(weight.dtype).contiguous(),
        initial_states=_channel_last(init[:, :, 1:]),
        activation=activation,
    )
    history = torch.cat([init, x], dim=-1)
    final_state = history[:, :, L:].clone()
    if positions:
        emitted = torch.stack([history[:, :, p : p + K] for p in positions])
    else:
        emitted = x.new_empty((0, b, ch, K))
    return y.to(x.dtype).contiguous(), final_state, emitted


def causal_conv1d_update_cuda(
    x: torch.Tensor,
    state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = "silu",
) -> torch.Tensor:
    """``causal_conv1d_update`` (state_len = K, shifted in place) with our signature.

    x [b, C]; state [b, C, K] in place; weight [C, K]; bias [C]. The kernel needs x in the
    state's dtype, so x is cast to it. Widths outside 2..4 fall back to the reference.
    Returns y [b, C] in x.dtype.
    """
    if weight.shape[1] not in _CONV_WIDTHS:
        return causal_conv1d_update_ref(x, state, weight, bias, activation=activation)
    y: torch.Tensor = causal_conv1d_update(
        x.to(state.dtype),
        state,
        weight.contiguous(),
        None if bias is None else bias.to(weight.dtype).contiguous(),
        activation=activation,
    )
    return y.to(x.dtype)
