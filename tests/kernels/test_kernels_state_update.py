"""Repeated single-step updates equal the full-sequence scans they stand in for."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled, mamba1_inputs, ssd_inputs

from marconi_kernels import (
    mamba1_state_update_ref,
    mamba2_state_update_ref,
    selective_scan_ref,
    ssd_chunk_scan_ref,
)


@pytest.mark.parametrize(
    ("G", "use_d", "dt_limit"), [(1, True, (0.0, float("inf"))), (2, False, (0.4, 1.5))]
)
def test_mamba2_steps_equal_chunk_scan(G, use_d, dt_limit):
    b, L, H, P, N = 2, 13, 4, 3, 5
    inp = ssd_inputs(b, L, H, P, G, N, seed=21)
    D = inp["D"] if use_d else None
    y, final, _ = ssd_chunk_scan_ref(
        inp["x"],
        inp["dt"],
        inp["A"],
        inp["B"],
        inp["C"],
        chunk_size=4,
        D=D,
        dt_bias=inp["dt_bias"],
        dt_limit=dt_limit,
        initial_state=inp["state"],
    )
    state = inp["state"].clone()
    ys = [
        mamba2_state_update_ref(
            state,
            inp["x"][:, t],
            inp["dt"][:, t],
            inp["A"],
            inp["B"][:, t],
            inp["C"][:, t],
            D=D,
            dt_bias=inp["dt_bias"],
            dt_limit=dt_limit,
        )
        for t in range(L)
    ]
    assert_close_scaled(torch.stack(ys, dim=1), y, 1e-5)
    assert_close_scaled(state, final, 1e-5)


def test_mamba2_update_is_in_place_and_keeps_dtypes():
    inp = ssd_inputs(1, 1, 2, 3, 1, 4, dtype=torch.bfloat16, seed=2)
    state = inp["state"].float()
    before = state.clone()
    ptr = state.data_ptr()
    y = mamba2_state_update_ref(
        state, inp["x"][:, 0], inp["dt"][:, 0], inp["A"], inp["B"][:, 0], inp["C"][:, 0]
    )
    assert y.dtype == torch.bfloat16 and y.shape == (1, 2, 3)
    assert state.data_ptr() == ptr and state.dtype == torch.float32
    assert not torch.equal(state, before)


@pytest.mark.parametrize(
    ("use_d", "use_z", "use_bias"), [(True, True, True), (False, False, False)]
)
def test_mamba1_steps_equal_selective_scan(use_d, use_z, use_bias):
    b, Dm, N, L = 2, 6, 4, 11
    inp = mamba1_inputs(b, Dm, N, L, seed=5)
    kw = {
        "D": inp["D"] if use_d else None,
        "delta_bias": inp["delta_bias"] if use_bias else None,
    }
    z = inp["z"] if use_z else None
    y, final, _ = selective_scan_ref(
        inp["u"],
        inp["delta"],
        inp["A"],
        inp["B"],
        inp["C"],
        z=z,
        initial_state=inp["state"],
        **kw,
    )
    state = inp["state"].clone()
    ys = [
        mamba1_state_update_ref(
            state,
            inp["u"][..., t],
            inp["delta"][..., t],
            inp["A"],
            inp["B"][..., t],
            inp["C"][..., t],
            z=None if z is None else z[..., t],
            **kw,
        )
        for t in range(L)
    ]
    assert_close_scaled(torch.stack(ys, dim=-1), y, 1e-5)
    assert_close_scaled(state, final, 1e-5)


def test_bad_shapes_raise():
    inp = ssd_inputs(1, 1, 2, 3, 1, 4, seed=2)
    with pytest.raises(ValueError, match="bad shapes"):
        mamba2_state_update_ref(
            inp["state"],
            inp["x"][:, 0, :1],
            inp["dt"][:, 0],
            inp["A"],
            inp["B"][:, 0],
            inp["C"][:, 0],
        )
