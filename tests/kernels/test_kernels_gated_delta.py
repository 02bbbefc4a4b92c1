"""Gated delta rule references: the chunked (WY) form equals the token-by-token recurrence,
states at any depth are exact, decode steps continue a prefill, and both equal transformers'
Qwen3-Next torch implementations."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled, gated_delta_inputs

from marconi_kernels.gated_delta import (
    gated_delta_chunk_ref,
    gated_delta_recurrent_ref,
    gated_delta_step_ref,
)

ARGS = ("q", "k", "v", "g", "beta")


def _args(inp):
    return [inp[name] for name in ARGS]


def _double(inp):
    return {name: t.double() for name, t in inp.items()}


def _check(out, ref, tol):
    for a, e in zip(out, ref, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert_close_scaled(a, e, tol)


@pytest.mark.parametrize(
    ("b", "L", "H", "K", "V", "chunk", "with_state", "l2"),
    [
        (1, 1, 1, 4, 3, 64, True, True),  # one token
        (2, 130, 3, 16, 24, 64, True, True),  # L not a multiple of the chunk, K != V
        (2, 37, 2, 5, 7, 8, False, True),  # odd head dims, zero initial state
        (1, 48, 2, 8, 8, 16, True, False),  # no L2 norm (keys scaled down: stable writes)
        (1, 9, 1, 6, 5, 1, True, True),  # chunk of one token
    ],
)
def test_chunk_matches_recurrence_fp64(b, L, H, K, V, chunk, with_state, l2):
    inp = _double(gated_delta_inputs(b, L, H, K, V, seed=L + K))
    if not l2:
        inp["q"], inp["k"] = inp["q"] * 0.3, inp["k"] * 0.3
    emit_at = sorted({1, (L + 1) // 2, L})
    kw = {"initial_state": inp["state"] if with_state else None, "emit_at": emit_at,
          "use_qk_l2norm": l2}  # fmt: skip
    out = gated_delta_chunk_ref(*_args(inp), chunk_size=chunk, **kw)
    ref = gated_delta_recurrent_ref(*_args(inp), **kw)
    assert out[1].dtype == torch.float64
    _check(out, ref, 1e-10)


def test_fp32_chunk_matches_fp64_recurrence():
    inp = gated_delta_inputs(2, 100, 2, 32, 16, seed=3)
    out = gated_delta_chunk_ref(*_args(inp), initial_state=inp["state"], emit_at=[50, 100])
    ref = gated_delta_recurrent_ref(
        *_args(_double(inp)), initial_state=inp["state"].double(), emit_at=[50, 100]
    )
    assert [t.dtype for t in out] == [torch.float32] * 3
    _check(out, tuple(t.float() for t in ref), 2e-6)


def test_states_at_any_depth_are_exact():
    L = 130
    emit_at = [1, 15, 16, 17, 63, 64, 65, 127, 128, 129, L]
    inp = _double(gated_delta_inputs(2, L, 2, 16, 8, seed=1))
    _, final, emitted = gated_delta_chunk_ref(
        *_args(inp), chunk_size=64, initial_state=inp["state"], emit_at=emit_at
    )
    _, _, rec = gated_delta_recurrent_ref(*_args(inp), initial_state=inp["state"], emit_at=emit_at)
    assert emitted.shape == (len(emit_at), 2, 2, 16, 8)
    assert_close_scaled(emitted, rec, 1e-10)
    assert_close_scaled(emitted[-1], final, 1e-12)
    for i in (0, 3, 6):  # a separate call over the prefix ends in the emitted state
        p = emit_at[i]
        prefix = {name: inp[name][:, :p] for name in ARGS}
        _, state_p, _ = gated_delta_chunk_ref(*_args(prefix), initial_state=inp["state"])
        assert_close_scaled(emitted[i], state_p, 1e-10)


@pytest.mark.parametrize("p", [1, 17, 64, 65])
def test_resume_from_emitted_state_equals_one_call(p):
    L = 90
    inp = _double(gated_delta_inputs(1, L, 2, 8, 8, seed=p))
    y, final, emitted = gated_delta_chunk_ref(*_args(inp), emit_at=[p])
    rest = {name: inp[name][:, p:] for name in ARGS}
    y2, final2, _ = gated_delta_chunk_ref(*_args(rest), initial_state=emitted[0])
    assert_close_scaled(y2, y[:, p:], 1e-10)
    assert_close_scaled(final2, final, 1e-10)


def test_bf16_inputs_compute_in_fp32():
    inp = gated_delta_inputs(2, 40, 2, 16, 16, dtype=torch.bfloat16, seed=4)
    out = gated_delta_chunk_ref(*_args(inp), chunk_size=16, initial_state=inp["state"],
                                emit_at=[7, 40])  # fmt: skip
    ref = gated_delta_recurrent_ref(*_args(inp), initial_state=inp["state"], emit_at=[7, 40])
    assert out[0].dtype == torch.bfloat16
    assert out[1].dtype == out[2].dtype == torch.float32
    assert_close_scaled(out[0], ref[0], 1e-2)  # the same fp32 value rounded to bf16
    assert_close_scaled(out[1], ref[1], 1e-5)
    assert_close_scaled(out[2], ref[2], 1e-5)


def test_strong_decay_stays_finite():
    inp = _double(gated_delta_inputs(1, 70, 2, 8, 8, seed=6, decay=20.0))
    out = gated_delta_chunk_ref(*_args(inp), initial_state=inp["state"], emit_at=[33])
    ref = gated_delta_recurrent_ref(*_args(inp), initial_state=inp["state"], emit_at=[33])
    assert all(torch.isfinite(t).all() for t in out)
    _check(out, ref, 1e-10)


def test_decode_steps_continue_a_prefill_in_place():
    L, steps = 20, 3
    inp = _double(gated_delta_inputs(3, L + steps, 2, 8, 6, seed=8))
    _, _, rec = gated_delta_recurrent_ref(*_args(inp), emit_at=[L, L + steps])
    y_all, _, _ = gated_delta_recurrent_ref(*_args(inp))
    head = {name: inp[name][:, :L] for name in ARGS}
    _, state, _ = gated_delta_chunk_ref(*_args(head), chunk_size=8)
    cache = torch.zeros(5, 2, 8, 6, dtype=torch.float64)
    cache[1:4] = state
    rows = cache[1:4]  # a view into a larger cache, updated in place
    for t in range(L, L + steps):
        o = gated_delta_step_ref(rows, *(inp[name][:, t] for name in ARGS))
        assert o.shape == (3, 2, 6) and o.dtype == torch.float64
        assert_close_scaled(o, y_all[:, t], 1e-10)
    assert_close_scaled(cache[1:4], rec[1], 1e-10)
    assert torch.equal(cache[0], torch.zeros(2, 8, 6))


def test_step_keeps_state_dtype_and_returns_q_dtype():
    inp = gated_delta_inputs(2, 1, 2, 8, 8, dtype=torch.bfloat16, seed=9)
    state = inp["state"].clone()
    o = gated_delta_step_ref(state, *(inp[name][:, 0] for name in ARGS))
    _, final, _ = gated_delta_recurrent_ref(*_args(inp), initial_state=inp["state"])
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    assert torch.equal(state, final)


@pytest.mark.parametrize("l2", [True, False])
def test_matches_transformers_qwen3_next(l2):
    """transformers expands grouped key heads itself; our callers expand them first."""
    qn = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    b, L, Hk, H, K, V = 2, 70, 2, 4, 16, 8
    inp = gated_delta_inputs(b, L, H, K, V, seed=10)
    q, k = inp["q"][:, :, :Hk], inp["k"][:, :, :Hk]  # [b, L, Hk, K]
    if not l2:
        q, k = q * 0.3, k * 0.3
    rest = (inp["v"], inp["g"], inp["beta"])
    expanded = (q.repeat_interleave(H // Hk, dim=2), k.repeat_interleave(H // Hk, dim=2))
    kw = {"initial_state": inp["state"], "output_final_state": True,
          "use_qk_l2norm_in_kernel": l2}  # fmt: skip
    ours = gated_delta_chunk_ref(*expanded, *rest, initial_state=inp["state"], use_qk_l2norm=l2)
    chunk_o, chunk_s = qn.torch_chunk_gated_delta_rule(q, k, *rest, chunk_size=64, **kw)
    rec_o, rec_s = qn.torch_recurrent_gated_delta_rule(q, k, *rest, **kw)
    for o, s in ((chunk_o, chunk_s), (rec_o, rec_s)):
        assert_close_scaled(ours[0], o, 2e-6)
        assert_close_scaled(ours[1], s, 2e-6)
    step_state = inp["state"].clone()
    step_o = gated_delta_step_ref(
        step_state, expanded[0][:, 0], expanded[1][:, 0], *(t[:, 0] for t in rest),
        use_qk_l2norm=l2,
    )  # fmt: skip
    one_o, one_s = qn.torch_recurrent_gated_delta_rule(
        q[:, :1], k[:, :1], *(t[:, :1] for t in rest), **kw
    )
    assert_close_scaled(step_o, one_o[:, 0], 2e-6)
    assert_close_scaled(step_state, one_s, 2e-6)


def test_empty_sequence_returns_initial_state():
    inp = gated_delta_inputs(2, 0, 2, 4, 3, seed=0)
    y, state, emitted = gated_delta_chunk_ref(*_args(inp), initial_state=inp["state"])
    assert y.shape == (2, 0, 2, 3) and emitted.shape == (0, 2, 2, 4, 3)
    assert torch.equal(state, inp["state"]) and state.data_ptr() != inp["state"].data_ptr()


@pytest.mark.parametrize(
    ("emit_at", "match"),
    [([0], "position 0"), ([11], "position 11"), ([3, 2], r"\[3, 2\]"), ([2, 2], "position 2")],
)
@pytest.mark.parametrize("fn", [gated_delta_chunk_ref, gated_delta_recurrent_ref])
def test_bad_emit_at_raises_naming_it(fn, emit_at, match):
    inp = gated_delta_inputs(1, 10, 1, 4, 4, seed=0)
    with pytest.raises(ValueError, match=match):
        fn(*_args(inp), emit_at=emit_at)


@pytest.mark.parametrize(
    ("name", "shape"),
    [("k", (1, 10, 2, 5)), ("v", (1, 9, 2, 4)), ("g", (1, 10, 1)), ("beta", (10, 2)),
     ("state", (1, 2, 4, 5))],
)  # fmt: skip
def test_bad_shapes_raise(name, shape):
    inp = gated_delta_inputs(1, 10, 2, 4, 4, seed=0)
    inp[name] = torch.zeros(shape)
    with pytest.raises(ValueError, match=name if name != "state" else "initial_state"):
        gated_delta_chunk_ref(*_args(inp), initial_state=inp["state"])


def test_bad_step_shapes_and_chunk_size_raise():
    inp = gated_delta_inputs(2, 1, 2, 4, 4, seed=0)
    step = [inp[name][:, 0] for name in ARGS]
    with pytest.raises(ValueError, match="beta"):
        gated_delta_step_ref(inp["state"], *step[:4], step[4][:1])
    with pytest.raises(ValueError, match="chunk_size"):
        gated_delta_chunk_ref(*_args(inp), chunk_size=0)
