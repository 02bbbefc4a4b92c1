"""Mamba-1 selective scan: naive loop, resuming from a state, emitted states."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import assert_close_scaled, mamba1_inputs

from marconi_kernels import selective_scan_ref


def _naive(inp):
    """Plain double-precision recurrence with delta_bias, softplus, D and z."""
    u, delta, A, B, C = (inp[k].double() for k in ("u", "delta", "A", "B", "C"))
    d = F.softplus(delta + inp["delta_bias"].double()[:, None])
    h = inp["state"].double().clone()
    ys = []
    for t in range(u.shape[-1]):
        h = (
            torch.exp(d[..., t, None] * A) * h
            + (d[..., t] * u[..., t])[..., None] * B[:, None, :, t]
        )
        ys.append((h * C[:, None, :, t]).sum(-1))
    y = torch.stack(ys, dim=-1) + inp["D"].double()[:, None] * u
    return y * F.silu(inp["z"].double()), h


def _scan(inp, **kw):
    return selective_scan_ref(
        inp["u"],
        inp["delta"],
        inp["A"],
        inp["B"],
        inp["C"],
        D=inp["D"],
        z=inp["z"],
        delta_bias=inp["delta_bias"],
        initial_state=inp["state"],
        **kw,
    )


@pytest.mark.parametrize("L", [1, 9, 300])  # 300 spans two internal blocks
def test_matches_naive(L):
    inp = mamba1_inputs(2, 3, 4, L, seed=L)
    y, state, _ = _scan(inp)
    y_n, state_n = _naive(inp)
    assert y.dtype == torch.float32 and state.dtype == torch.float32
    assert_close_scaled(y, y_n, 1e-5)
    assert_close_scaled(state, state_n, 1e-5)


@pytest.mark.parametrize("p", [1, 5, 255, 256, 257, 299])
def test_resume_from_state_and_emit(p):
    inp = mamba1_inputs(1, 3, 4, 300, seed=3)
    y, state, emitted = _scan(inp, emit_at=[p, 300])
    head = {**inp, **{k: inp[k][..., :p] for k in ("u", "delta", "B", "C", "z")}}
    tail = {**inp, **{k: inp[k][..., p:] for k in ("u", "delta", "B", "C", "z")}}
    y1, s1, _ = _scan(head)
    tail["state"] = s1
    y2, s2, _ = _scan(tail)
    assert_close_scaled(torch.cat([y1, y2], dim=-1), y, 1e-5)
    assert_close_scaled(s2, state, 1e-5)
    assert_close_scaled(emitted[0], s1, 1e-6)
    assert torch.equal(emitted[1], state)


def test_no_initial_state_is_zeros_and_dtype_kept():
    inp = mamba1_inputs(1, 3, 4, 6, dtype=torch.bfloat16, seed=1)
    y0, s0, _ = selective_scan_ref(inp["u"], inp["delta"], inp["A"], inp["B"], inp["C"])
    y1, s1, _ = selective_scan_ref(
        inp["u"],
        inp["delta"],
        inp["A"],
        inp["B"],
        inp["C"],
        initial_state=torch.zeros(1, 3, 4),
    )
    assert y0.dtype == torch.bfloat16 and s0.dtype == torch.float32
    assert torch.equal(y0, y1) and torch.equal(s0, s1)
