"""KDA references (the gated delta rule with a per-channel decay): the chunked form equals
the token-by-token recurrence, states at any depth are exact, segments and decode steps
continue a prefill, a channel-uniform decay is Gated DeltaNet, and both equal transformers'
Kimi Linear torch implementations."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled, gated_delta_inputs

from marconi_kernels.gated_delta import gated_delta_chunk_ref
from marconi_kernels.kda import (
    kda_chunk_ref,
    kda_chunk_varlen_ref,
    kda_recurrent_ref,
    kda_step_ref,
)

ARGS = ("q", "k", "v", "g", "beta")


def kda_inputs(b, L, H, K, V, *, seed=0, decay=0.5, dtype=torch.float64):
    """Gated delta inputs with a per-channel log-decay g [b, L, H, K] (<= 0)."""
    inp = gated_delta_inputs(b, L, H, K, V, seed=seed, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1000)
    inp["g"] = (
        -torch.nn.functional.softplus(torch.randn(b, L, H, K, generator=gen, dtype=torch.float64))
        * decay
    ).to(dtype)
    return inp


def _args(inp):
    return [inp[name] for name in ARGS]


def _check(out, ref, tol):
    for a, e in zip(out, ref, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert_close_scaled(a, e, tol)


@pytest.mark.parametrize(
    ("b", "L", "H", "K", "V", "chunk", "with_state"),
    [
        (1, 1, 1, 4, 3, 64, True),  # one token
        (2, 70, 2, 8, 6, 32, True),  # L not a multiple of the chunk, K != V
        (1, 37, 2, 5, 7, 8, False),  # odd head dims, zero initial state
        (1, 9, 1, 6, 5, 1, True),  # chunk of one token
    ],
)
def test_chunk_matches_recurrence_fp64(b, L, H, K, V, chunk, with_state):
    inp = kda_inputs(b, L, H, K, V, seed=L + K)
    emit_at = sorted({1, (L + 1) // 2, L})
    kw = {"initial_state": inp["state"].double() if with_state else None, "emit_at": emit_at}
    out = kda_chunk_ref(*_args(inp), chunk_size=chunk, **kw)
    ref = kda_recurrent_ref(*_args(inp), **kw)
    assert out[1].dtype == torch.float64
    _check(out, ref, 1e-10)


def test_states_at_any_depth_incl_chunk_edges_are_exact():
    L = 50
    emit_at = [1, 15, 16, 17, 31, 32, 33, 49, L]
    inp = kda_inputs(2, L, 2, 8, 4, seed=1)
    state = inp["state"].double()
    _, final, emitted = kda_chunk_ref(
        *_args(inp), chunk_size=16, initial_state=state, emit_at=emit_at
    )
    _, _, rec = kda_recurrent_ref(*_args(inp), initial_state=state, emit_at=emit_at)
    assert emitted.shape == (len(emit_at), 2, 2, 8, 4)
    assert_close_scaled(emitted, rec, 1e-10)
    assert_close_scaled(emitted[-1], final, 1e-12)


@pytest.mark.parametrize("cuts", [(1,), (16, 17), (5, 33, 34)])
def test_segmentation_invariance(cuts):
    L = 40
    inp = kda_inputs(1, L, 2, 8, 8, seed=len(cuts))
    y, final, _ = kda_chunk_ref(*_args(inp), chunk_size=16)
    state, ys = None, []
    for a, z in zip((0, *cuts), (*cuts, L), strict=True):
        part = {name: inp[name][:, a:z] for name in ARGS}
        y_p, state, _ = kda_chunk_ref(*_args(part), chunk_size=16, initial_state=state)
        ys.append(y_p)
    assert_close_scaled(torch.cat(ys, dim=1), y, 1e-10)
    assert_close_scaled(state, final, 1e-10)


def test_decode_steps_continue_a_prefill_in_place():
    L, steps = 20, 3
    inp = kda_inputs(3, L + steps, 2, 8, 6, seed=8)
    y_all, final_all, _ = kda_chunk_ref(*_args(inp), chunk_size=8)
    head = {name: inp[name][:, :L] for name in ARGS}
    _, state, _ = kda_chunk_ref(*_args(head), chunk_size=8)
    for t in range(L, L + steps):
        o = kda_step_ref(state, *(inp[name][:, t] for name in ARGS))
        assert_close_scaled(o, y_all[:, t], 1e-10)
    assert_close_scaled(state, final_all, 1e-10)


def test_channel_uniform_decay_is_gated_deltanet():
    inp = gated_delta_inputs(2, 45, 2, 8, 5, seed=4, dtype=torch.float64)
    g_full = inp["g"].unsqueeze(-1).expand(-1, -1, -1, 8).contiguous()
    kw = {"chunk_size": 16, "initial_state": inp["state"].double(), "emit_at": [3, 16, 45]}
    out = kda_chunk_ref(inp["q"], inp["k"], inp["v"], g_full, inp["beta"], **kw)
    ref = gated_delta_chunk_ref(*_args(inp), **kw)
    _check(out, ref, 1e-10)


def test_strong_decay_stays_finite():
    inp = kda_inputs(1, 70, 2, 8, 8, seed=6, decay=40.0)
    out = kda_chunk_ref(*_args(inp), initial_state=inp["state"].double(), emit_at=[33])
    ref = kda_recurrent_ref(*_args(inp), initial_state=inp["state"].double(), emit_at=[33])
    assert all(torch.isfinite(t).all() for t in out)
    _check(out, ref, 1e-10)


def test_fp32_chunk_matches_fp64_recurrence():
    inp = kda_inputs(1, 80, 2, 16, 8, seed=3, dtype=torch.float32)
    out = kda_chunk_ref(*_args(inp), initial_state=inp["state"], emit_at=[40, 80])
    ref = kda_recurrent_ref(
        *(inp[n].double() for n in ARGS), initial_state=inp["state"].double(), emit_at=[40, 80]
    )
    assert [t.dtype for t in out] == [torch.float32] * 3
    _check(out, tuple(t.float() for t in ref), 2e-5)


def test_varlen_equals_each_sequence_alone():
    lens = [5, 0, 19]
    cu = [0, 5, 5, 24]
    inp = kda_inputs(1, 24, 2, 4, 3, seed=9)
    flat = {name: inp[name][0] for name in ARGS}
    states = torch.randn(3, 2, 4, 3, dtype=torch.float64)
    emits = [[2, 5], [], [1, 16, 19]]
    y, finals, emitted = kda_chunk_varlen_ref(
        *(flat[n] for n in ARGS), cu_seqlens=cu, chunk_size=8, initial_states=states,
        emit_at=emits,
    )  # fmt: skip
    e = 0
    for s, n in enumerate(lens):
        rows = slice(cu[s], cu[s] + n)
        part = [flat[name][None, rows] for name in ARGS]
        y_s, f_s, em_s = kda_recurrent_ref(*part, initial_state=states[s : s + 1], emit_at=emits[s])
        assert_close_scaled(y[rows], y_s[0], 1e-10)
        assert_close_scaled(finals[s], f_s[0], 1e-10)
        assert_close_scaled(emitted[e : e + len(emits[s])], em_s[:, 0], 1e-10)
        e += len(emits[s])
    assert e == emitted.shape[0] and sum(lens) == 24


def test_bad_shapes_raise():
    inp = kda_inputs(1, 4, 2, 4, 3)
    with pytest.raises(ValueError, match="g must be"):
        kda_chunk_ref(inp["q"], inp["k"], inp["v"], inp["g"][..., 0], inp["beta"])
    with pytest.raises(ValueError, match="emit_at"):
        kda_chunk_ref(*_args(inp), emit_at=[5])


def test_equals_transformers_kimi_linear_torch_paths():
    kl = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    inp = kda_inputs(1, 70, 2, 16, 8, seed=11, dtype=torch.float32)
    state = inp["state"]
    o, final, _ = kda_chunk_ref(*_args(inp), initial_state=state)
    ho, hfinal = kl.chunk_kimi_delta_attention(
        *_args(inp), initial_state=state.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert_close_scaled(o, ho, 1e-4)
    assert_close_scaled(final, hfinal, 1e-4)
    step = {name: inp[name][:, :1] for name in ARGS}
    ro, rfinal = kl.recurrent_kimi_delta_attention(
        *_args(step), initial_state=state.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    s = state.clone()
    o1 = kda_step_ref(s, *(inp[name][:, 0] for name in ARGS))
    assert_close_scaled(o1, ro[:, 0], 1e-5)
    assert_close_scaled(s, rfinal, 1e-5)
