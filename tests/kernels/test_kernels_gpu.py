"""CUDA kernel set (mamba-ssm, causal-conv1d) vs the references; skipped without them."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled, mamba1_inputs, ssd_inputs

from marconi_kernels import cuda_kernels_available, get_kernels

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not cuda_kernels_available(), reason="needs CUDA with mamba_ssm and causal_conv1d"
    ),
]

DTYPES = [
    pytest.param(torch.float32, 1e-3, id="fp32"),
    pytest.param(torch.bfloat16, 5e-2, id="bf16"),
]


@pytest.fixture(scope="module")
def kernel_sets():
    return get_kernels("cuda", prefer="cuda"), get_kernels("cuda", prefer="ref")


def test_auto_picks_cuda():
    assert get_kernels("cuda").name == "cuda"


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
@pytest.mark.parametrize("emit_at", [(), (1, 64, 100, 200)])
def test_ssd_chunk_scan(kernel_sets, dtype, tol, emit_at):
    cuda, ref = kernel_sets
    inp = ssd_inputs(2, 200, 8, 32, 2, 16, dtype=dtype, seed=1, device="cuda")
    state = inp["state"].float()
    outs = [
        ks.ssd_chunk_scan(
            inp["x"],
            inp["dt"],
            inp["A"].float(),
            inp["B"],
            inp["C"],
            chunk_size=64,
            D=inp["D"].float(),
            dt_bias=inp["dt_bias"].float(),
            dt_limit=(0.01, 10.0),
            initial_state=state,
            emit_at=emit_at,
        )
        for ks in (cuda, ref)
    ]
    for a, e in zip(outs[0], outs[1], strict=True):
        assert a.dtype == e.dtype
        assert_close_scaled(a, e, tol)


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
def test_mamba2_state_update(kernel_sets, dtype, tol):
    cuda, ref = kernel_sets
    inp = ssd_inputs(3, 1, 8, 32, 2, 16, dtype=dtype, seed=2, device="cuda")
    states = [inp["state"].float().clone() for _ in range(2)]
    ys = [
        ks.mamba2_state_update(
            s,
            inp["x"][:, 0],
            inp["dt"][:, 0],
            inp["A"].float(),
            inp["B"][:, 0],
            inp["C"][:, 0],
            D=inp["D"].float(),
            dt_bias=inp["dt_bias"].float(),
            dt_limit=(0.01, 10.0),
        )
        for ks, s in zip((cuda, ref), states, strict=True)
    ]
    assert_close_scaled(ys[0], ys[1], tol)
    assert_close_scaled(states[0], states[1], tol)


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
def test_mamba1_state_update(kernel_sets, dtype, tol):
    cuda, ref = kernel_sets
    inp = mamba1_inputs(3, 64, 16, 1, dtype=dtype, seed=3, device="cuda")
    states = [inp["state"].float().clone() for _ in range(2)]
    ys = [
        ks.mamba1_state_update(
            s,
            inp["u"][..., 0],
            inp["delta"][..., 0],
            inp["A"].float(),
            inp["B"][..., 0],
            inp["C"][..., 0],
            D=inp["D"].float(),
            z=inp["z"][..., 0],
            delta_bias=inp["delta_bias"].float(),
        )
        for ks, s in zip((cuda, ref), states, strict=True)
    ]
    assert_close_scaled(ys[0], ys[1], tol)
    assert_close_scaled(states[0], states[1], tol)


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
@pytest.mark.parametrize("K", [4, 5])  # 5 exercises the reference fallback
def test_causal_conv1d_and_update(kernel_sets, dtype, tol, K):
    cuda, ref = kernel_sets
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 64, 50, generator=g).to("cuda", dtype)
    w = torch.randn(64, K, generator=g).to("cuda", dtype)
    bias = torch.randn(64, generator=g).to("cuda", dtype)
    init = torch.randn(2, 64, K, generator=g).to("cuda", dtype)
    outs = [
        ks.causal_conv1d(x, w, bias, initial_state=init, emit_at=[1, 3, 50]) for ks in (cuda, ref)
    ]
    for a, e in zip(outs[0], outs[1], strict=True):
        assert a.dtype == e.dtype
        assert_close_scaled(a, e, tol)
    states = [init.clone(), init.clone()]
    ys = [
        ks.causal_conv1d_update(x[..., 0], s, w, bias)
        for ks, s in zip((cuda, ref), states, strict=True)
    ]
    assert_close_scaled(ys[0], ys[1], tol)
    assert torch.equal(states[0], states[1])


def test_selective_scan_stays_on_reference(kernel_sets):
    cuda, ref = kernel_sets
    assert cuda.selective_scan is ref.selective_scan
