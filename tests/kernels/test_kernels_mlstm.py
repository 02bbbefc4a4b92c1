"""mLSTM references: the chunked form equals the token-by-token recurrence (which equals
transformers' native recurrent step), states at any depth are exact, results do not
depend on how a sequence is cut into calls or chunks, decode steps continue a prefill,
and the varlen form equals one call per sequence."""

from __future__ import annotations

import itertools

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.mlstm import (
    mlstm_chunk_ref,
    mlstm_chunk_varlen_ref,
    mlstm_recurrent_ref,
    mlstm_state_size,
    mlstm_step_ref,
    pack_mlstm_state,
    unpack_mlstm_state,
)


def mlstm_inputs(b, L, H, K, V, *, seed=0, dtype=torch.float64):
    """q, k [b, L, H, K], v [b, L, H, V], igate, fgate [b, L, H] (soft-capped at 15 as
    xLSTM does), a packed state [b, H, P] reached by a random prefix."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    def gate(*shape):
        return 15.0 * torch.tanh(rnd(*shape) * 3.0 / 15.0)

    C = rnd(b, H, K, V) * 0.3
    n = rnd(b, H, K) * 0.3
    m = rnd(b, H) * 2.0
    out = {
        "q": rnd(b, L, H, K),
        "k": rnd(b, L, H, K),
        "v": rnd(b, L, H, V),
        "igate": gate(b, L, H),
        "fgate": gate(b, L, H) + 2.0,
        "state": pack_mlstm_state(C, n, m),
    }
    return {name: t.to(dtype) for name, t in out.items()}


def _args(inp, rows=slice(None)):
    return tuple(inp[n][:, rows] for n in ("q", "k", "v", "igate", "fgate"))


def test_pack_and_unpack_are_inverse_views():
    s = torch.arange(2 * 3 * mlstm_state_size(4, 5), dtype=torch.float32).view(2, 3, -1)
    C, n, m = unpack_mlstm_state(s, 4, 5)
    assert C.shape == (2, 3, 4, 5) and n.shape == (2, 3, 4) and m.shape == (2, 3)
    assert torch.equal(pack_mlstm_state(C, n, m), s)
    m.fill_(-1.0)
    assert torch.equal(s[..., -1], torch.full((2, 3), -1.0))
    with pytest.raises(ValueError, match="packed mLSTM state"):
        unpack_mlstm_state(s[..., 1:], 4, 5)


@pytest.mark.parametrize(
    ("b", "L", "H", "K", "V", "chunk", "with_state"),
    [
        (1, 1, 1, 4, 3, 64, True),  # one token
        (2, 130, 3, 8, 12, 64, True),  # L not a multiple of the chunk, K != V
        (2, 37, 2, 5, 7, 8, False),  # odd head dims, zero initial state
        (1, 9, 1, 6, 5, 1, True),  # chunk of one token
    ],
)
def test_chunk_matches_recurrence_fp64(b, L, H, K, V, chunk, with_state):
    inp = mlstm_inputs(b, L, H, K, V, seed=L + K)
    emit_at = sorted({1, (L + 1) // 2, L})
    kw = {"initial_state": inp["state"] if with_state else None, "emit_at": emit_at}
    out = mlstm_chunk_ref(*_args(inp), chunk_size=chunk, **kw)
    ref = mlstm_recurrent_ref(*_args(inp), **kw)
    assert out[1].dtype == torch.float64
    assert out[1].shape == (b, H, mlstm_state_size(K, V))
    for a, e in zip(out, ref, strict=True):
        assert a.dtype == e.dtype
        assert_close_scaled(a, e, 1e-10)


def test_recurrence_equals_transformers_native_step():
    """The step is transformers' `mlstm_recurrent_sequence_native` (their [b, H, L, D]
    layout, m [b, H, 1]), from the same state."""
    from transformers.models.xlstm import modeling_xlstm as hf

    b, L, H, K, V = 2, 11, 2, 4, 6
    inp = mlstm_inputs(b, L, H, K, V, seed=3, dtype=torch.float32)
    C, n, m = unpack_mlstm_state(inp["state"], K, V)
    h_hf, (C_hf, n_hf, m_hf) = hf.mlstm_recurrent_sequence_native(
        *(inp[x].transpose(1, 2) for x in ("q", "k", "v", "igate", "fgate")),
        c_initial=C, n_initial=n, m_initial=m.unsqueeze(-1), return_last_states=True,
    )  # fmt: skip
    h, final, _ = mlstm_recurrent_ref(*_args(inp), initial_state=inp["state"])
    assert_close_scaled(h, h_hf.transpose(1, 2), 1e-5)
    assert_close_scaled(final, pack_mlstm_state(C_hf, n_hf, m_hf.squeeze(-1)), 1e-5)


def test_fp32_chunk_matches_fp64_recurrence():
    inp = mlstm_inputs(2, 100, 2, 16, 16, seed=3, dtype=torch.float32)
    out = mlstm_chunk_ref(*_args(inp), initial_state=inp["state"], emit_at=[50, 100])
    ref = mlstm_recurrent_ref(
        *(t.double() for t in _args(inp)), initial_state=inp["state"].double(), emit_at=[50, 100]
    )
    assert [t.dtype for t in out] == [torch.float32] * 3
    for a, e in zip(out, ref, strict=True):
        assert_close_scaled(a, e.float(), 1e-5)


def test_states_at_any_depth_are_exact():
    L = 130
    emit_at = [1, 15, 16, 17, 63, 64, 65, 127, 128, 129, L]
    inp = mlstm_inputs(2, L, 2, 8, 4, seed=1)
    _, final, emitted = mlstm_chunk_ref(
        *_args(inp), chunk_size=64, initial_state=inp["state"], emit_at=emit_at
    )
    _, _, rec = mlstm_recurrent_ref(*_args(inp), initial_state=inp["state"], emit_at=emit_at)
    assert emitted.shape == (len(emit_at), 2, 2, mlstm_state_size(8, 4))
    assert_close_scaled(emitted, rec, 1e-10)
    assert_close_scaled(emitted[-1], final, 1e-12)
    for i in (0, 3, 5, 6):  # a separate call over the prefix ends in the emitted state
        p = emit_at[i]
        _, alone, _ = mlstm_chunk_ref(*_args(inp, slice(0, p)), initial_state=inp["state"])
        assert_close_scaled(alone, emitted[i], 1e-10)


@pytest.mark.parametrize("cuts", [(1,), (17, 64), (5, 6, 100)])
def test_segmentation_invariance(cuts):
    """Prefilling in pieces, each resuming from the previous one's final state, gives the
    outputs and states of one call (and of other chunk sizes)."""
    L = 130
    inp = mlstm_inputs(1, L, 2, 8, 8, seed=11)
    whole_h, whole_s, _ = mlstm_chunk_ref(*_args(inp), chunk_size=32)
    state, outs = None, []
    for a, z in itertools.pairwise([0, *cuts, L]):
        h, state, _ = mlstm_chunk_ref(*_args(inp, slice(a, z)), chunk_size=16, initial_state=state)
        outs.append(h)
    assert_close_scaled(torch.cat(outs, dim=1), whole_h, 1e-10)
    assert state is not None
    assert_close_scaled(state, whole_s, 1e-10)


def test_steps_continue_a_prefill():
    L, n = 40, 6
    inp = mlstm_inputs(2, L + n, 2, 8, 12, seed=5)
    full_h, full_s, _ = mlstm_chunk_ref(*_args(inp), initial_state=inp["state"])
    _, state, _ = mlstm_chunk_ref(*_args(inp, slice(0, L)), initial_state=inp["state"])
    cache = state.clone()
    for t in range(L, L + n):
        h = mlstm_step_ref(cache, *(x[:, t] for x in _args(inp)))
        assert_close_scaled(h, full_h[:, t], 1e-10)
    assert_close_scaled(cache, full_s, 1e-10)


def test_step_updates_a_strided_float32_state_in_place():
    inp = mlstm_inputs(3, 1, 2, 4, 5, seed=2, dtype=torch.float32)
    rows = torch.randn(5, 2, mlstm_state_size(4, 5))
    state = rows[::2]  # strided rows of a cache
    before = state.clone()
    tok = [x[:, 0] for x in _args(inp)]
    h = mlstm_step_ref(state, *tok)
    expect_s = before.clone()
    expect_h = mlstm_step_ref(expect_s, *tok)
    assert torch.equal(rows[::2], expect_s)
    assert not torch.equal(rows[::2], before)
    assert_close_scaled(h, expect_h, 0.0)


def test_varlen_equals_one_call_per_sequence():
    lens = [5, 0, 70, 33]
    cu = [0, *itertools.accumulate(lens)]
    T = cu[-1]
    inp = mlstm_inputs(1, T, 2, 8, 6, seed=4)
    q, k, v, ig, fg = (x[0] for x in _args(inp))
    states = mlstm_inputs(4, 1, 2, 8, 6, seed=9)["state"]
    emits = [[2, 5], [], [1, 16, 64, 65, 70], [33]]
    h, finals, emitted = mlstm_chunk_varlen_ref(
        q, k, v, ig, fg, cu_seqlens=cu, chunk_size=16, initial_states=states, emit_at=emits
    )
    P = mlstm_state_size(8, 6)
    assert h.shape == (T, 2, 6) and finals.shape == (4, 2, P) and emitted.shape == (8, 2, P)
    e = 0
    for s in range(len(lens)):
        rows = slice(cu[s], cu[s + 1])
        h1, f1, e1 = mlstm_recurrent_ref(
            q[None, rows], k[None, rows], v[None, rows], ig[None, rows], fg[None, rows],
            initial_state=states[s : s + 1], emit_at=emits[s],
        )  # fmt: skip
        assert_close_scaled(h[rows], h1[0], 1e-10)
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
    inp = mlstm_inputs(1, 6, 1, 4, 4)
    with pytest.raises(ValueError, match=match):
        mlstm_chunk_ref(*_args(inp), **kwargs)


def test_bad_shapes_raise():
    inp = mlstm_inputs(1, 6, 2, 4, 4)
    q, k, v, ig, fg = _args(inp)
    with pytest.raises(ValueError, match="fgate"):
        mlstm_chunk_ref(q, k, v, ig, fg[..., :1])
    with pytest.raises(ValueError, match="initial_state"):
        mlstm_chunk_ref(q, k, v, ig, fg, initial_state=inp["state"][:, :1])
    with pytest.raises(ValueError, match="state must be"):
        mlstm_step_ref(inp["state"][..., 1:], q[:, 0], k[:, 0], v[:, 0], ig[:, 0], fg[:, 0])
