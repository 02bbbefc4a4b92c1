"""The RG-LRU recurrence's reference kernels: the scan against a naive per-element loop,
states emitted at any depth equal to a scan stopped there, segmentation invariance
(resuming from an emitted state), the decode step against the scan, the varlen form
against each sequence alone, and bad arguments named."""

from __future__ import annotations

import pytest
import torch
from rglru_inputs import rglru_inputs

from marconi_kernels.rglru import rglru_scan_ref, rglru_scan_varlen_ref, rglru_step_ref


def _naive(x, a, b, h0):
    """h_t = a_t h_{t-1} + b_t x_t element by element, in float64: (y, final)."""
    n_b, d, L = x.shape
    y = torch.zeros(n_b, d, L, dtype=torch.float64)
    h = h0.double().clone()
    for t in range(L):
        for i in range(n_b):
            for c in range(d):
                h[i, c] = a[i, c, t] * h[i, c] + b[i, c, t] * x[i, c, t]
        y[:, :, t] = h
    return y, h


@pytest.mark.parametrize(("n_b", "d", "L"), [(1, 1, 1), (2, 3, 17), (1, 5, 40)])
def test_scan_equals_naive_loop(n_b, d, L):
    x, a, b = rglru_inputs((n_b, d, L), seed=L, dtype=torch.float64)
    h0 = torch.randn(n_b, d, dtype=torch.float64)
    y, final, emitted = rglru_scan_ref(x, a, b, initial_state=h0)
    y_n, final_n = _naive(x, a, b, h0)
    torch.testing.assert_close(y, y_n, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(final, final_n, rtol=1e-12, atol=1e-12)
    assert emitted.shape == (0, n_b, d)


def test_float32_inputs_give_float32_states_and_input_dtype_outputs():
    x, a, b = rglru_inputs((2, 4, 9), dtype=torch.bfloat16)
    y, final, emitted = rglru_scan_ref(x, a, b, emit_at=[3])
    assert y.dtype == torch.bfloat16 and final.dtype == torch.float32
    assert emitted.dtype == torch.float32


def test_emission_at_every_depth_equals_a_scan_stopped_there():
    L = 23
    x, a, b = rglru_inputs((2, 6, L), seed=1)
    h0 = torch.randn(2, 6)
    depths = [1, 2, 7, 7, 16, L - 1, L]
    y, final, emitted = rglru_scan_ref(x, a, b, initial_state=h0, emit_at=depths)
    assert emitted.shape == (len(depths), 2, 6)
    for k, p in enumerate(depths):
        _, stopped, _ = rglru_scan_ref(x[..., :p], a[..., :p], b[..., :p], initial_state=h0)
        assert torch.equal(emitted[k], stopped)
        assert torch.equal(emitted[k], y[..., p - 1])
    assert torch.equal(emitted[-1], final)


@pytest.mark.parametrize("cut", [1, 5, 12, 19])
def test_segmentation_invariance(cut):
    L = 20
    x, a, b = rglru_inputs((1, 7, L), seed=cut)
    y, final, _ = rglru_scan_ref(x, a, b)
    y1, _, (mid,) = rglru_scan_ref(x[..., :cut], a[..., :cut], b[..., :cut], emit_at=[cut])
    y2, final2, _ = rglru_scan_ref(x[..., cut:], a[..., cut:], b[..., cut:], initial_state=mid)
    torch.testing.assert_close(torch.cat([y1, y2], -1), y, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(final2, final, rtol=1e-6, atol=1e-6)


def test_steps_equal_the_scan():
    L = 12
    x, a, b = rglru_inputs((3, 5, L), seed=4)
    h0 = torch.randn(3, 5)
    y, final, _ = rglru_scan_ref(x, a, b, initial_state=h0)
    state = h0.clone()
    for t in range(L):
        out = rglru_step_ref(x[..., t], a[..., t], b[..., t], state)
        torch.testing.assert_close(out, y[..., t], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, final, rtol=1e-6, atol=1e-6)


def test_a_zero_restarts_the_sequence():
    """a_0 = 0 (a sequence's first token) makes the state before it irrelevant."""
    x, a, b = rglru_inputs((1, 4, 6), seed=5)
    a[..., 0] = 0.0
    y1, _, _ = rglru_scan_ref(x, a, b, initial_state=torch.randn(1, 4))
    y2, _, _ = rglru_scan_ref(x, a, b)
    assert torch.equal(y1, y2)


@pytest.mark.parametrize("has_state", [True, False])
def test_varlen_equals_each_sequence_alone(has_state):
    lengths = [5, 0, 17, 1, 9]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    x, a, b = rglru_inputs((6, cu[-1]), seed=2)
    h0 = torch.randn(len(lengths), 6) if has_state else None
    emits = [sorted({p for p in (1, n // 2, n) if 1 <= p <= n}) for n in lengths]
    y, finals, emitted = rglru_scan_varlen_ref(
        x, a, b, cu_seqlens=cu, initial_states=h0, emit_at=emits
    )
    e = 0
    for s in range(len(lengths)):
        cols = slice(cu[s], cu[s + 1])
        ys, fs, es = rglru_scan_ref(
            x[None, :, cols], a[None, :, cols], b[None, :, cols],
            initial_state=None if h0 is None else h0[s : s + 1], emit_at=emits[s],
        )  # fmt: skip
        assert torch.equal(y[:, cols], ys[0]) and torch.equal(finals[s], fs[0])
        assert torch.equal(emitted[e : e + len(emits[s])], es[:, 0])
        e += len(emits[s])
    assert e == emitted.shape[0]


def test_bad_arguments_are_named():
    x, a, b = rglru_inputs((1, 3, 4))
    with pytest.raises(ValueError, match="x, a and b"):
        rglru_scan_ref(x, a[..., :3], b)
    with pytest.raises(ValueError, match="initial_state"):
        rglru_scan_ref(x, a, b, initial_state=torch.zeros(1, 2))
    with pytest.raises(ValueError, match="emit_at"):
        rglru_scan_ref(x, a, b, emit_at=[5])
    with pytest.raises(ValueError, match="state must be"):
        rglru_step_ref(x[..., 0], a[..., 0], b[..., 0], torch.zeros(1, 2))
    with pytest.raises(ValueError, match="cu_seqlens"):
        rglru_scan_varlen_ref(x[0], a[0], b[0], cu_seqlens=[0, 3])
