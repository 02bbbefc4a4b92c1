"""Lightning attention references: the chunked form equals the token-by-token recurrence,
states at any depth (chunk edges included) are exact, results do not depend on how a
sequence is cut into calls or chunks, decode steps continue a prefill, and the varlen
form equals one call per sequence."""

from __future__ import annotations

import itertools

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.lightning import (
    lightning_chunk_ref,
    lightning_chunk_varlen_ref,
    lightning_recurrent_ref,
    lightning_step_ref,
)


def lightning_inputs(b, L, H, K, V, *, seed=0, dtype=torch.float64):
    """q, k [b, L, H, K], v [b, L, H, V], slope [H] (MiniMax-like rates), state [b, H, K, V]."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    out = {
        "q": rnd(b, L, H, K) * 0.5,
        "k": rnd(b, L, H, K) * 0.5,
        "v": rnd(b, L, H, V),
        "slope": 2.0 ** (-8.0 * (torch.arange(H, dtype=torch.float64) + 1) / H),
        "state": rnd(b, H, K, V),
    }
    return {name: t.to(dtype) for name, t in out.items()}


def _args(inp):
    return inp["q"], inp["k"], inp["v"], inp["slope"]


@pytest.mark.parametrize(
    ("b", "L", "H", "K", "V", "chunk", "with_state"),
    [
        (1, 1, 1, 4, 3, 64, True),  # one token
        (2, 130, 3, 16, 24, 64, True),  # L not a multiple of the chunk, K != V
        (2, 37, 2, 5, 7, 8, False),  # odd head dims, zero initial state
        (1, 9, 1, 6, 5, 1, True),  # chunk of one token
    ],
)
def test_chunk_matches_recurrence_fp64(b, L, H, K, V, chunk, with_state):
    inp = lightning_inputs(b, L, H, K, V, seed=L + K)
    emit_at = sorted({1, (L + 1) // 2, L})
    kw = {"initial_state": inp["state"] if with_state else None, "emit_at": emit_at}
    out = lightning_chunk_ref(*_args(inp), chunk_size=chunk, **kw)
    ref = lightning_recurrent_ref(*_args(inp), **kw)
    assert out[1].dtype == torch.float64
    for a, e in zip(out, ref, strict=True):
        assert a.dtype == e.dtype
        assert_close_scaled(a, e, 1e-10)


def test_recurrence_is_the_definition():
    """S_t = exp(-s) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t, written out for one head."""
    inp = lightning_inputs(1, 5, 1, 3, 2, seed=7)
    q, k, v, s = inp["q"][0, :, 0], inp["k"][0, :, 0], inp["v"][0, :, 0], inp["slope"][0]
    S = inp["state"][0, 0].clone()
    expected = []
    for t in range(5):
        S = torch.exp(-s) * S + torch.outer(k[t], v[t])
        expected.append(S.t() @ q[t])
    o, final, _ = lightning_recurrent_ref(*_args(inp), initial_state=inp["state"])
    assert_close_scaled(o[0, :, 0], torch.stack(expected), 1e-12)
    assert_close_scaled(final[0, 0], S, 1e-12)


def test_fp32_chunk_matches_fp64_recurrence():
    inp = lightning_inputs(2, 100, 2, 32, 16, seed=3, dtype=torch.float32)
    out = lightning_chunk_ref(*_args(inp), initial_state=inp["state"], emit_at=[50, 100])
    ref = lightning_recurrent_ref(
        *(t.double() for t in _args(inp)), initial_state=inp["state"].double(), emit_at=[50, 100]
    )
    assert [t.dtype for t in out] == [torch.float32] * 3
    for a, e in zip(out, ref, strict=True):
        assert_close_scaled(a, e.float(), 2e-6)


def test_states_at_any_depth_are_exact():
    L = 130
    emit_at = [1, 15, 16, 17, 63, 64, 65, 127, 128, 129, L]
    inp = lightning_inputs(2, L, 2, 16, 8, seed=1)
    _, final, emitted = lightning_chunk_ref(
        *_args(inp), chunk_size=64, initial_state=inp["state"], emit_at=emit_at
    )
    _, _, rec = lightning_recurrent_ref(*_args(inp), initial_state=inp["state"], emit_at=emit_at)
    assert emitted.shape == (len(emit_at), 2, 2, 16, 8)
    assert_close_scaled(emitted, rec, 1e-10)
    assert_close_scaled(emitted[-1], final, 1e-12)
    for i in (0, 3, 5, 6):  # a separate call over the prefix ends in the emitted state
        p = emit_at[i]
        _, alone, _ = lightning_chunk_ref(
            inp["q"][:, :p], inp["k"][:, :p], inp["v"][:, :p], inp["slope"],
            initial_state=inp["state"],
        )  # fmt: skip
        assert_close_scaled(alone, emitted[i], 1e-10)


@pytest.mark.parametrize("cuts", [(1,), (17, 64), (5, 6, 100)])
def test_segmentation_invariance(cuts):
    """Prefilling in pieces, each resuming from the previous one's final state, gives the
    outputs and states of one call (and of other chunk sizes)."""
    L = 130
    inp = lightning_inputs(1, L, 2, 8, 8, seed=11)
    whole_o, whole_s, _ = lightning_chunk_ref(*_args(inp), chunk_size=32)
    bounds = [0, *cuts, L]
    state, outs = None, []
    for a, z in itertools.pairwise(bounds):
        o, state, _ = lightning_chunk_ref(
            inp["q"][:, a:z], inp["k"][:, a:z], inp["v"][:, a:z], inp["slope"],
            chunk_size=16, initial_state=state,
        )  # fmt: skip
        outs.append(o)
    assert_close_scaled(torch.cat(outs, dim=1), whole_o, 1e-10)
    assert state is not None
    assert_close_scaled(state, whole_s, 1e-10)


def test_steps_continue_a_prefill():
    L, n = 40, 6
    inp = lightning_inputs(2, L + n, 2, 8, 12, seed=5)
    full_o, full_s, _ = lightning_chunk_ref(*_args(inp), initial_state=inp["state"])
    _, state, _ = lightning_chunk_ref(
        inp["q"][:, :L], inp["k"][:, :L], inp["v"][:, :L], inp["slope"],
        initial_state=inp["state"],
    )  # fmt: skip
    cache = state.clone()
    for t in range(L, L + n):
        o = lightning_step_ref(cache, inp["q"][:, t], inp["k"][:, t], inp["v"][:, t], inp["slope"])
        assert_close_scaled(o, full_o[:, t], 1e-10)
    assert_close_scaled(cache, full_s, 1e-10)


def test_step_updates_a_strided_float32_state_in_place():
    inp = lightning_inputs(3, 1, 2, 4, 5, seed=2, dtype=torch.float32)
    rows = torch.randn(5, 2, 4, 5)
    state = rows[::2]  # strided rows of a cache
    before = state.clone()
    o = lightning_step_ref(state, inp["q"][:, 0], inp["k"][:, 0], inp["v"][:, 0], inp["slope"])
    expect_s = before.clone()
    expect_o = lightning_step_ref(
        expect_s, inp["q"][:, 0], inp["k"][:, 0], inp["v"][:, 0], inp["slope"]
    )
    assert torch.equal(rows[::2], expect_s)
    assert not torch.equal(rows[::2], before)
    assert_close_scaled(o, expect_o, 0.0)


def test_varlen_equals_one_call_per_sequence():
    lens = [5, 0, 70, 33]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    T = cu[-1]
    inp = lightning_inputs(1, T, 2, 8, 6, seed=4)
    q, k, v = inp["q"][0], inp["k"][0], inp["v"][0]
    states = lightning_inputs(4, 1, 2, 8, 6, seed=9)["state"]
    emits = [[2, 5], [], [1, 16, 64, 65, 70], [33]]
    o, finals, emitted = lightning_chunk_varlen_ref(
        q, k, v, inp["slope"], cu_seqlens=cu, chunk_size=16, initial_states=states,
        emit_at=emits,
    )  # fmt: skip
    assert o.shape == (T, 2, 6) and finals.shape == (4, 2, 8, 6)
    assert emitted.shape == (8, 2, 8, 6)
    e = 0
    for s in range(len(lens)):
        rows = slice(cu[s], cu[s + 1])
        o1, f1, e1 = lightning_recurrent_ref(
            q[None, rows], k[None, rows], v[None, rows], inp["slope"],
            initial_state=states[s : s + 1], emit_at=emits[s],
        )  # fmt: skip
        assert_close_scaled(o[rows], o1[0], 1e-10)
        assert_close_scaled(finals[s], f1[0], 1e-10)
        assert_close_scaled(emitted[e : e + len(emits[s])], e1[:, 0], 1e-10)
        e += len(emits[s])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"emit_at": [0]}, "outside"),
        ({"emit_at": [3, 3]}, "repeated"),
        ({"emit_at": [4, 2]}, "sorted"),
        ({"chunk_size": 0}, "chunk_size"),
    ],
)
def test_bad_arguments_raise(kwargs, match):
    inp = lightning_inputs(1, 6, 1, 4, 4)
    with pytest.raises(ValueError, match=match):
        lightning_chunk_ref(*_args(inp), **kwargs)


def test_bad_shapes_raise():
    inp = lightning_inputs(1, 6, 2, 4, 4)
    with pytest.raises(ValueError, match="slope"):
        lightning_chunk_ref(inp["q"], inp["k"], inp["v"], inp["slope"][:1])
    with pytest.raises(ValueError, match="initial_state"):
        lightning_chunk_ref(*_args(inp), initial_state=inp["state"][:, :1])
    with pytest.raises(ValueError, match="v must be"):
        lightning_step_ref(
            inp["state"], inp["q"][:, 0], inp["k"][:, 0], inp["v"][:, 0, :1], inp["slope"]
        )
