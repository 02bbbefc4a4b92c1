"""Triton RG-LRU kernels against the pure-torch references (interpreter on CPU): the scan
across channel blocks with states and emitted (duplicated) depths, strided inputs, the
varlen scan with empty and one-token sequences, and the in-place step on strided rows."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled
from rglru_inputs import rglru_inputs

from marconi_kernels import triton_rglru as tr
from marconi_kernels.rglru import rglru_scan_ref, rglru_scan_varlen_ref, rglru_step_ref
from marconi_kernels.triton_rglru import (
    rglru_scan_triton,
    rglru_scan_varlen_triton,
    rglru_step_triton,
)

pytestmark = pytest.mark.triton

BD = tr._BLOCK_D


def _check(out, ref, tol=1e-6):
    for got, want in zip(out, ref, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert_close_scaled(got, want, tol)


@pytest.mark.parametrize(("n_b", "d", "L", "state"), [(1, 3, 1, False), (2, BD + 5, 9, True)])
def test_scan_matches_ref(n_b, d, L, state):
    x, a, b = rglru_inputs((n_b, d, L), seed=d)
    h0 = torch.randn(n_b, d) if state else None
    emit = [1, L // 2 + 1, L // 2 + 1, L] if L > 1 else [1]
    kw = {"initial_state": h0, "emit_at": emit}
    _check(rglru_scan_triton(x, a, b, **kw), rglru_scan_ref(x, a, b, **kw))


def test_scan_reads_strided_inputs():
    x, a, b = rglru_inputs((1, 7, 6), seed=3)
    xt = x[0].t().contiguous().t()[None]  # [1, 7, 6] with the token axis outermost
    kw = {"emit_at": [2, 6]}
    _check(rglru_scan_triton(xt, a, b, **kw), rglru_scan_ref(x, a, b, **kw))


@pytest.mark.parametrize("has_state", [True, False])
def test_varlen_matches_ref(has_state):
    lengths = [4, 0, 7, 1]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    x, a, b = rglru_inputs((BD + 3, cu[-1]), seed=9)
    h0 = torch.randn(len(lengths), BD + 3) if has_state else None
    emits = [[1, 4, 4], [], [3, 7], [1]]
    kw = {"cu_seqlens": cu, "initial_states": h0, "emit_at": emits}
    _check(rglru_scan_varlen_triton(x, a, b, **kw), rglru_scan_varlen_ref(x, a, b, **kw))


def test_step_matches_ref_in_place_on_strided_rows():
    x, a, b = rglru_inputs((3, 10), seed=1)
    rows = torch.randn(3, 2, 10)
    want = rows[:, 1].clone()
    y_ref = rglru_step_ref(x, a, b, want)
    y = rglru_step_triton(x, a, b, rows[:, 1])
    _check((y, rows[:, 1]), (y_ref, want))
