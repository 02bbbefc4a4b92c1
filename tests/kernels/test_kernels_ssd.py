"""Chunked SSD scan vs the token-by-token recurrence; emission and segmentation invariance."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled, ssd_inputs

from marconi_kernels import ssd_chunk_scan_ref, ssd_naive_ref

# (b, L, H, P, G, N, chunk_size)
SHAPES = [
    pytest.param(2, 5, 4, 3, 1, 4, 8, id="L<chunk"),
    pytest.param(1, 16, 4, 3, 2, 4, 16, id="L==chunk"),
    pytest.param(2, 37, 6, 4, 3, 5, 8, id="L%chunk!=0,G=3"),
    pytest.param(1, 64, 4, 8, 1, 8, 16, id="multi-chunk,G=1"),
    pytest.param(1, 9, 2, 2, 2, 3, 1, id="chunk=1"),
]


def _scan(fn, inp, *, chunk_size, use_d=True, use_init=True, emit_at=(), dt_limit=None):
    kwargs = {}
    if dt_limit is not None:
        kwargs["dt_limit"] = dt_limit
    return fn(
        inp["x"],
        inp["dt"],
        inp["A"],
        inp["B"],
        inp["C"],
        chunk_size=chunk_size,
        D=inp["D"] if use_d else None,
        dt_bias=inp["dt_bias"],
        initial_state=inp["state"] if use_init else None,
        emit_at=emit_at,
        **kwargs,
    )


@pytest.mark.parametrize(("b", "L", "H", "P", "G", "N", "cs"), SHAPES)
@pytest.mark.parametrize("use_d", [True, False])
@pytest.mark.parametrize("use_init", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_chunked_matches_naive(b, L, H, P, G, N, cs, use_d, use_init, dtype):
    inp = ssd_inputs(b, L, H, P, G, N, dtype=dtype, seed=L + G)
    kw = {"chunk_size": cs, "use_d": use_d, "use_init": use_init}
    y, state, emitted = _scan(ssd_chunk_scan_ref, inp, **kw)
    y_n, state_n, _ = _scan(ssd_naive_ref, inp, **kw)
    tol = 1e-5 if dtype == torch.float32 else 1e-11
    assert y.dtype == dtype and state.dtype == dtype and emitted.shape == (0, b, H, P, N)
    assert_close_scaled(y, y_n, tol)
    assert_close_scaled(state, state_n, tol)


@pytest.mark.parametrize("dt_limit", [(0.5, float("inf")), (0.3, 1.2)])
def test_dt_limit_clamps_like_naive(dt_limit):
    inp = ssd_inputs(2, 21, 4, 3, 2, 4, dtype=torch.float64, seed=3)
    y, state, _ = _scan(ssd_chunk_scan_ref, inp, chunk_size=8, dt_limit=dt_limit)
    y_n, state_n, _ = _scan(ssd_naive_ref, inp, chunk_size=8, dt_limit=dt_limit)
    assert_close_scaled(y, y_n, 1e-11)
    assert_close_scaled(state, state_n, 1e-11)
    y_free, _, _ = _scan(ssd_chunk_scan_ref, inp, chunk_size=8)
    assert not torch.allclose(y, y_free), "the clamp should change the result"


def test_dt_softplus_off():
    inp = ssd_inputs(1, 12, 2, 3, 1, 4, dtype=torch.float64, seed=4)
    inp["dt"] = inp["dt"].abs()
    args = (inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"])
    y, s, _ = ssd_chunk_scan_ref(*args, chunk_size=5, dt_softplus=False)
    y_n, s_n, _ = ssd_naive_ref(*args, chunk_size=5, dt_softplus=False)
    assert_close_scaled(y, y_n, 1e-11)
    assert_close_scaled(s, s_n, 1e-11)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_emitted_states_match_naive(dtype):
    L, cs = 37, 8
    inp = ssd_inputs(2, L, 6, 4, 3, 5, dtype=dtype, seed=7)
    emit_at = [1, 3, 8, 9, 15, 16, 16, 24, 36, 37]  # aligned, unaligned, repeated, p == L
    y, state, emitted = _scan(ssd_chunk_scan_ref, inp, chunk_size=cs, emit_at=emit_at)
    _, _, emitted_n = _scan(ssd_naive_ref, inp, chunk_size=cs, emit_at=emit_at)
    tol = 1e-5 if dtype == torch.float32 else 1e-11
    assert emitted.shape == (len(emit_at), 2, 6, 4, 5)
    assert_close_scaled(emitted, emitted_n, tol)
    assert torch.equal(emitted[-1], state)
    y_plain, _, _ = _scan(ssd_chunk_scan_ref, inp, chunk_size=cs)
    assert torch.equal(y, y_plain), "emitting must not change the output"


@pytest.mark.parametrize("p", [1, 7, 8, 9, 20, 36])
def test_segmentation_invariance(p):
    L, cs = 37, 8
    inp = ssd_inputs(2, L, 4, 3, 2, 4, seed=11)
    y, state, emitted = _scan(ssd_chunk_scan_ref, inp, chunk_size=cs, emit_at=[p])
    head = {**inp, **{k: inp[k][:, :p] for k in ("x", "dt", "B", "C")}}
    tail = {**inp, **{k: inp[k][:, p:] for k in ("x", "dt", "B", "C")}}
    y1, s1, _ = _scan(ssd_chunk_scan_ref, head, chunk_size=cs)
    tail["state"] = s1
    y2, s2, _ = _scan(ssd_chunk_scan_ref, tail, chunk_size=cs)
    assert_close_scaled(torch.cat([y1, y2], dim=1), y, 1e-5)
    assert_close_scaled(s2, state, 1e-5)
    assert_close_scaled(emitted[0], s1, 1e-5)


def test_low_precision_inputs_keep_dtype_and_float32_states():
    inp = ssd_inputs(1, 20, 4, 8, 1, 8, dtype=torch.bfloat16, seed=5)
    inp["state"] = inp["state"].float()
    y, state, emitted = _scan(ssd_chunk_scan_ref, inp, chunk_size=8, emit_at=[5])
    assert y.dtype == torch.bfloat16
    assert state.dtype == torch.float32 and emitted.dtype == torch.float32
    ref = {k: v.double() for k, v in inp.items()}
    y_n, s_n, _ = _scan(ssd_naive_ref, ref, chunk_size=8)
    assert_close_scaled(y, y_n, 2e-2)
    assert_close_scaled(state, s_n, 1e-5)


def test_empty_sequence_returns_initial_state():
    inp = ssd_inputs(1, 0, 2, 3, 1, 4, seed=1)
    y, state, emitted = _scan(ssd_chunk_scan_ref, inp, chunk_size=4)
    assert y.shape == (1, 0, 2, 3) and emitted.shape[0] == 0
    assert torch.equal(state, inp["state"])


@pytest.mark.parametrize(
    ("emit_at", "match"),
    [([0], "outside"), ([11], "outside"), ([5, 3], "sorted")],
)
def test_bad_emit_positions_raise(emit_at, match):
    inp = ssd_inputs(1, 10, 2, 3, 1, 4, seed=1)
    with pytest.raises(ValueError, match=match):
        _scan(ssd_chunk_scan_ref, inp, chunk_size=4, emit_at=emit_at)


def test_bad_shapes_raise():
    inp = ssd_inputs(1, 10, 3, 3, 2, 4, seed=1)
    with pytest.raises(ValueError, match="multiple of groups"):
        _scan(ssd_chunk_scan_ref, inp, chunk_size=4)
    inp = ssd_inputs(1, 10, 4, 3, 2, 4, seed=1)
    with pytest.raises(ValueError, match="chunk_size"):
        _scan(ssd_chunk_scan_ref, inp, chunk_size=0)


def test_fast_decay_does_not_overflow():
    """Large dt*|A| makes exp(cs_i - cs_j) overflow above the diagonal: must stay finite."""
    inp = ssd_inputs(1, 40, 2, 3, 1, 4, seed=9)
    inp["A"] = torch.tensor([-60.0, -0.01])
    inp["dt"] = inp["dt"].abs() + 2.0
    y, state, emitted = _scan(ssd_chunk_scan_ref, inp, chunk_size=16, emit_at=[5, 40])
    y_n, state_n, emitted_n = _scan(ssd_naive_ref, inp, chunk_size=16, emit_at=[5, 40])
    assert torch.isfinite(y).all() and torch.isfinite(state).all()
    assert_close_scaled(y, y_n, 1e-5)
    assert_close_scaled(state, state_n, 1e-5)
    assert_close_scaled(emitted, emitted_n, 1e-5)
