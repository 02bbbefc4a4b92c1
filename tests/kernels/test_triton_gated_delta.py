"""Triton gated delta rule (prefill with emitted states, decode step) against the pure-torch
references (interpreter on CPU; float64 references, so the tolerance is float32 rounding)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled, gated_delta_inputs

from marconi_kernels import triton_gated_delta as tgd
from marconi_kernels.gated_delta import gated_delta_chunk_ref, gated_delta_step_ref
from marconi_kernels.triton_gated_delta import gated_delta_chunk_triton, gated_delta_step_triton

pytestmark = pytest.mark.triton

ARGS = ("q", "k", "v", "g", "beta")
BV = tgd._BV


def _args(inp, dtype=None):
    return [inp[name] if dtype is None else inp[name].to(dtype) for name in ARGS]


def _both(inp, *, with_state=True, **kw):
    out = gated_delta_chunk_triton(
        *_args(inp), initial_state=inp["state"] if with_state else None, **kw
    )
    ref = gated_delta_chunk_ref(
        *_args(inp, torch.float64),
        initial_state=inp["state"].double() if with_state else None,
        **kw,
    )
    return out, ref


def _check(out, ref, tol=1e-5):
    for a, e in zip(out, ref, strict=True):
        assert a.shape == e.shape
        assert_close_scaled(a, e, tol)


@pytest.mark.parametrize(
    ("b", "L", "H", "K", "V", "chunk", "with_state", "l2", "emit_at"),
    [
        (1, 1, 1, 4, 3, 16, True, True, [1]),  # one token, head dims below the block
        (2, 40, 2, 12, BV + 8, 16, True, True, [1, 15, 16, 17, 31, 32, 33, 40]),  # 2 V blocks
        (1, 70, 1, 16, 16, 64, False, True, [1, 15, 16, 17, 63, 64, 65, 70]),
        (1, 20, 2, 8, 8, 5, True, False, [5, 20]),  # chunk 5 runs as 16; no L2 norm
    ],
)
def test_chunk_matches_ref(b, L, H, K, V, chunk, with_state, l2, emit_at):
    inp = gated_delta_inputs(b, L, H, K, V, seed=L + V)
    if not l2:
        inp["q"], inp["k"] = inp["q"] * 0.3, inp["k"] * 0.3
    out, ref = _both(
        inp, with_state=with_state, chunk_size=chunk, emit_at=emit_at, use_qk_l2norm=l2
    )
    assert [t.dtype for t in out] == [torch.float32] * 3
    assert out[2].shape == (len(emit_at), b, H, K, V)
    _check(out, ref)


def test_non_contiguous_inputs_and_strong_decay():
    """q, k, v sliced from one fused projection; g, beta transposed views; decays to 1e-13."""
    b, L, H, K, V = 2, 21, 2, 8, 8
    inp = gated_delta_inputs(b, L, H, K, V, seed=12, decay=10.0)
    fused = torch.cat([inp["q"], inp["k"], inp["v"]], dim=-1)
    inp["q"], inp["k"], inp["v"] = fused[..., :K], fused[..., K : 2 * K], fused[..., 2 * K :]
    inp["g"] = inp["g"].transpose(1, 2).contiguous().transpose(1, 2)
    inp["beta"] = inp["beta"].transpose(0, 1).contiguous().transpose(0, 1)
    assert not inp["q"].is_contiguous() and not inp["g"].is_contiguous()
    out, ref = _both(inp, chunk_size=16, emit_at=[3, 16, 21])
    _check(out, ref)


def test_bf16_inputs():
    inp = gated_delta_inputs(1, 24, 2, 16, 16, dtype=torch.bfloat16, seed=5)
    out, ref = _both(inp, chunk_size=16, emit_at=[9, 24])
    assert out[0].dtype == torch.bfloat16
    assert out[1].dtype == out[2].dtype == torch.float32
    assert_close_scaled(out[0], ref[0], 1e-2)  # bf16 output rounding
    assert_close_scaled(out[1], ref[1], 1e-5)
    assert_close_scaled(out[2], ref[2], 1e-5)


def test_resume_from_emitted_state_equals_one_call():
    L, p = 30, 13
    inp = gated_delta_inputs(1, L, 1, 8, 8, seed=13)
    y, final, emitted = gated_delta_chunk_triton(*_args(inp), chunk_size=16, emit_at=[p])
    rest = [t[:, p:] for t in _args(inp)]
    y2, final2, _ = gated_delta_chunk_triton(*rest, chunk_size=16, initial_state=emitted[0])
    assert_close_scaled(y2, y[:, p:], 1e-5)
    assert_close_scaled(final2, final, 1e-5)


@pytest.mark.parametrize(("l2", "V"), [(True, BV + 3), (False, 6)])
def test_step_matches_ref_in_place_on_a_cache_view(l2, V):
    b, H, K = 3, 2, 12
    inp = gated_delta_inputs(b, 1, H, K, V, seed=V)
    step = [t[:, 0] for t in _args(inp)]
    if not l2:
        step[0], step[1] = step[0] * 0.3, step[1] * 0.3
    cache = torch.zeros(b + 2, H, V, K).transpose(-1, -2)  # [slots, H, K, V], V-major layout
    cache[1 : b + 1] = inp["state"]
    rows = cache[1 : b + 1]
    expected = inp["state"].double()
    o_ref = gated_delta_step_ref(expected, *(t.double() for t in step), use_qk_l2norm=l2)
    o = gated_delta_step_triton(rows, *step, use_qk_l2norm=l2)
    assert o.shape == (b, H, V) and o.dtype == torch.float32
    assert_close_scaled(o, o_ref, 1e-5)
    assert_close_scaled(cache[1 : b + 1], expected, 1e-5)
    assert torch.equal(cache[0], torch.zeros(H, K, V)) and torch.equal(cache[-1], cache[0])


def test_step_with_bf16_inputs_returns_bf16():
    inp = gated_delta_inputs(2, 1, 2, 16, 8, dtype=torch.bfloat16, seed=2)
    step = [t[:, 0] for t in _args(inp)]
    state, expected = inp["state"].clone(), inp["state"].clone()
    o = gated_delta_step_triton(state, *step)
    o_ref = gated_delta_step_ref(expected, *step)
    assert o.dtype == torch.bfloat16
    assert_close_scaled(o, o_ref, 1e-2)
    assert_close_scaled(state, expected, 1e-5)


def test_empty_sequence_returns_initial_state():
    inp = gated_delta_inputs(2, 0, 2, 4, 3, seed=0)
    y, state, emitted = gated_delta_chunk_triton(*_args(inp), initial_state=inp["state"])
    assert y.shape == (2, 0, 2, 3) and emitted.shape == (0, 2, 2, 4, 3)
    assert torch.equal(state, inp["state"]) and state.data_ptr() != inp["state"].data_ptr()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"emit_at": [0]}, "position 0"),
        ({"emit_at": [6]}, "position 6"),
        ({"emit_at": [3, 3]}, "position 3"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"initial_state": torch.zeros(1, 2, 4, 5)}, "initial_state"),
    ],
)
def test_bad_inputs_raise(kw, match):
    inp = gated_delta_inputs(1, 5, 2, 4, 3, seed=0)
    with pytest.raises(ValueError, match=match):
        gated_delta_chunk_triton(*_args(inp), **kw)


def test_bad_step_shapes_raise():
    inp = gated_delta_inputs(1, 1, 2, 4, 3, seed=0)
    q, k, v, g, beta = (t[:, 0] for t in _args(inp))
    with pytest.raises(ValueError, match="v must be"):
        gated_delta_step_triton(inp["state"], q, k, v[..., :2], g, beta)
