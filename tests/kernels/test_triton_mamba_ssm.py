"""mamba-ssm's Triton kernels behind our signatures (the "triton" set's Mamba-2 scan and
both state updates) against the torch references. Under TRITON_INTERPRET=1 on CPU tensors
without a GPU (small shapes), on CUDA with bigger ones and TF32-aware tolerances."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled, mamba1_inputs, ssd_inputs

from marconi_kernels import get_kernels

pytestmark = pytest.mark.triton

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 Triton dots use TF32 on NVIDIA GPUs (10-bit mantissa); the interpreter is exact.
FP32_TOL = 5e-3 if DEVICE == "cuda" else 2e-5
DTYPES = [
    pytest.param(torch.float32, FP32_TOL, id="fp32"),
    pytest.param(torch.bfloat16, 5e-2, id="bf16"),
]
# Triton's interpreter (3.9) computes tl.dot on bfloat16 operands wrongly (errors of 1e10 on
# a bare 16x16 bf16 dot), so the chunked scan, which is made of dots, is checked in bf16
# on CUDA only (here and in scripts/gpu_check.sh); the state updates have no dots.
SSD_DTYPES = DTYPES if DEVICE == "cuda" else DTYPES[:1]


@pytest.fixture(scope="module")
def sets():
    return get_kernels(DEVICE, prefer="triton"), get_kernels(DEVICE, prefer="ref")


def test_triton_set_names_triton_for_every_op(sets):
    fast, _ = sets
    assert fast.name == "triton"
    assert all(b.startswith("triton:") for b in fast.backends.values()), fast.backends


@pytest.mark.parametrize(("dtype", "tol"), SSD_DTYPES)
@pytest.mark.parametrize(
    ("L", "H", "G", "chunk", "emit_at"),
    [
        (40, 4, 2, 16, (1, 5, 16, 32, 40)),  # chunk boundaries and interiors, GQA groups
        (23, 2, 1, 8, (8, 8, 13)),  # duplicates, L not a multiple of the chunk
        (9, 4, 4, 16, ()),  # one partial chunk, one group per head
    ],
)
@pytest.mark.parametrize("resume", [False, True])
def test_ssd_chunk_scan_matches_reference(sets, dtype, tol, L, H, G, chunk, emit_at, resume):
    fast, ref = sets
    inp = ssd_inputs(2, L, H, 8, G, 16, dtype=dtype, seed=L + H, device=DEVICE)
    kwargs = {
        "chunk_size": chunk,
        "D": inp["D"].float(),
        "dt_bias": inp["dt_bias"].float(),
        "dt_limit": (0.01, 10.0),
        "initial_state": inp["state"].float() if resume else None,
        "emit_at": emit_at,
    }
    args = (inp["x"], inp["dt"], inp["A"].float(), inp["B"], inp["C"])
    got, want = fast.ssd_chunk_scan(*args, **kwargs), ref.ssd_chunk_scan(*args, **kwargs)
    for a, e in zip(got, want, strict=True):
        assert a.dtype == e.dtype and a.device == e.device
        assert_close_scaled(a, e, tol)


def test_ssd_chunk_scan_without_d_or_bias(sets):
    fast, ref = sets
    inp = ssd_inputs(1, 12, 2, 4, 1, 8, seed=7, device=DEVICE)
    args = (inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"])
    got = fast.ssd_chunk_scan(*args, chunk_size=8, emit_at=(12,))
    want = ref.ssd_chunk_scan(*args, chunk_size=8, emit_at=(12,))
    for a, e in zip(got, want, strict=True):
        assert_close_scaled(a, e, FP32_TOL)


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
@pytest.mark.parametrize("with_optional", [True, False])
def test_mamba2_state_update_matches_reference(sets, dtype, tol, with_optional):
    _fast, _ref = sets
    inp = ssd_inputs(3, 1, 4, 8, 2, 16, dtype=dtype, seed=2, device=DEVICE)
    states = [inp["state"].float().clone() for _ in range(2)]
    opt = {"D": inp["D"].float(), "dt_bias": inp["dt_bias"].float(), "dt_limit": (0.01, 10.0)}
    ys = [
        ks.mamba2_state_update(
            s,
            inp["x"][:, 0],
            inp["dt"][:, 0],
            inp["A"].float(),
            inp["B"][:, 0],
            inp["C"][:, 0],
            **(opt if with_optional else {}),
        )
        for ks, s in zip(sets, states, strict=True)
    ]
    assert_close_scaled(ys[0], ys[1], tol)
    assert_close_scaled(states[0], states[1], tol)


@pytest.mark.parametrize(("dtype", "tol"), DTYPES)
@pytest.mark.parametrize("with_optional", [True, False])
def test_mamba1_state_update_matches_reference(sets, dtype, tol, with_optional):
    _fast, _ref = sets
    inp = mamba1_inputs(3, 12, 6, 1, dtype=dtype, seed=3, device=DEVICE)
    states = [inp["state"].float().clone() for _ in range(2)]
    opt = {"D": inp["D"].float(), "z": inp["z"][..., 0], "delta_bias": inp["delta_bias"].float()}
    ys = [
        ks.mamba1_state_update(
            s,
            inp["u"][..., 0],
            inp["delta"][..., 0],
            inp["A"].float(),
            inp["B"][..., 0],
            inp["C"][..., 0],
            **(opt if with_optional else {}),
        )
        for ks, s in zip(sets, states, strict=True)
    ]
    assert_close_scaled(ys[0], ys[1], tol)
    assert_close_scaled(states[0], states[1], tol)


def test_state_update_writes_into_a_batch_view(sets):
    """Decode updates rows of a preallocated state buffer in place (no copy back)."""
    fast, ref = sets
    inp = ssd_inputs(4, 1, 4, 8, 2, 16, seed=5, device=DEVICE)
    buf = inp["state"].float().clone()
    expected = buf.clone()
    rows = slice(1, 3)
    args = (inp["x"][rows, 0], inp["dt"][rows, 0], inp["A"], inp["B"][rows, 0], inp["C"][rows, 0])
    fast.mamba2_state_update(buf[rows], *args)
    ref.mamba2_state_update(expected[rows], *args)
    assert_close_scaled(buf, expected, FP32_TOL)
    assert torch.equal(buf[0], inp["state"][0].float()) and torch.equal(buf[3], inp["state"][3])


def test_loading_the_kernels_leaves_no_half_imported_mamba_ssm(sets):
    """The kernel modules stay loaded, but the bare `mamba_ssm` package registered to reach
    them (its `__init__` not run) is gone again: a library that probes `import mamba_ssm`
    afterwards (transformers picks mamba-ssm's kernels for its own Mamba-2 models when the
    import works) sees the installed package as it is, and a second call reuses the
    loaded modules."""
    import importlib
    import sys

    from marconi_kernels.mamba_ssm_import import import_mamba_triton

    ssd, ssu = import_mamba_triton()
    assert "mamba_ssm" not in sys.modules
    assert import_mamba_triton() == (ssd, ssu)
    assert callable(ssd.mamba_chunk_scan_combined) and callable(ssu.selective_state_update)
    try:  # the CUDA-less wheel's own __init__ needs its compiled extension
        importlib.import_module("mamba_ssm")
    except ImportError:
        assert "mamba_ssm" not in sys.modules
