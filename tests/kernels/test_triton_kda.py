"""Triton KDA (prefill with emitted states, packed sequences, decode step) against the
pure-torch references (interpreter on CPU; float64 references, so the tolerance is
float32 rounding). Tiny shapes: the interpreter is slow."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled
from test_kernels_kda import kda_inputs

from marconi_kernels.kda import kda_chunk_ref, kda_chunk_varlen_ref, kda_step_ref
from marconi_kernels.triton_kda import (
    _BV,
    kda_chunk_triton,
    kda_chunk_varlen_triton,
    kda_step_triton,
)

pytestmark = pytest.mark.triton

ARGS = ("q", "k", "v", "g", "beta")


def _args(inp, dtype=None):
    return [inp[n] if dtype is None else inp[n].to(dtype) for n in ARGS]


def _check(out, ref, tol=1e-5):
    for a, e in zip(out, ref, strict=True):
        assert a.shape == e.shape
        assert_close_scaled(a, e, tol)


@pytest.mark.parametrize(
    ("b", "L", "H", "K", "V", "with_state", "emit_at"),
    [
        (1, 1, 1, 4, 3, True, [1]),  # one token, head dims below the block
        (2, 35, 2, 12, _BV + 5, True, [1, 15, 16, 17, 31, 32, 33, 35]),  # 2 V blocks
        (1, 20, 1, 8, 8, False, [4, 20]),
    ],
)
def test_chunk_matches_ref(b, L, H, K, V, with_state, emit_at):
    inp = kda_inputs(b, L, H, K, V, seed=L + V, dtype=torch.float32)
    h0 = inp["state"] if with_state else None
    out = kda_chunk_triton(*_args(inp), initial_state=h0, emit_at=emit_at)
    ref = kda_chunk_ref(
        *_args(inp, torch.float64), initial_state=None if h0 is None else h0.double(),
        emit_at=emit_at,
    )  # fmt: skip
    assert [t.dtype for t in out] == [torch.float32] * 3
    _check(out, ref)


def test_strong_decay_and_strided_inputs():
    """q, k, v sliced from one fused projection; decays so strong that exp(-gamma) would
    overflow float32 within a chunk (the pairwise form never forms it)."""
    inp = kda_inputs(1, 21, 2, 8, 8, seed=3, decay=60.0, dtype=torch.float32)
    fused = torch.cat([inp["q"], inp["k"], inp["v"]], dim=-1)
    inp["q"], inp["k"], inp["v"] = fused[..., :8], fused[..., 8:16], fused[..., 16:]
    assert not inp["q"].is_contiguous()
    out = kda_chunk_triton(*_args(inp), initial_state=inp["state"], emit_at=[3, 16, 21])
    ref = kda_chunk_ref(
        *_args(inp, torch.float64), initial_state=inp["state"].double(), emit_at=[3, 16, 21]
    )
    assert all(torch.isfinite(t).all() for t in out)
    _check(out, ref)


def test_varlen_matches_ref():
    cu = [0, 5, 5, 26]
    inp = kda_inputs(1, 26, 2, 8, 6, seed=9, dtype=torch.float32)
    flat = [t[0] for t in _args(inp)]
    states = torch.randn(3, 2, 8, 6)
    emits = [[2, 5], [], [1, 16, 17, 21]]
    out = kda_chunk_varlen_triton(*flat, cu_seqlens=cu, initial_states=states, emit_at=emits)
    ref = kda_chunk_varlen_ref(
        *(t.double() for t in flat), cu_seqlens=cu, initial_states=states.double(),
        emit_at=emits,
    )  # fmt: skip
    _check(out, ref)


def test_step_matches_ref_in_place_on_a_cache_view():
    b, H, K, V = 3, 2, 12, _BV + 3
    inp = kda_inputs(b, 1, H, K, V, seed=V, dtype=torch.float32)
    step = [t[:, 0] for t in _args(inp)]
    cache = torch.zeros(b + 2, H, V, K).transpose(-1, -2)  # [slots, H, K, V], V-major
    cache[1 : b + 1] = inp["state"]
    expected = inp["state"].double()
    o_ref = kda_step_ref(expected, *(t.double() for t in step))
    o = kda_step_triton(cache[1 : b + 1], *step)
    assert o.shape == (b, H, V) and o.dtype == torch.float32
    assert_close_scaled(o, o_ref, 1e-5)
    assert_close_scaled(cache[1 : b + 1], expected, 1e-5)
    assert torch.equal(cache[0], torch.zeros(H, K, V)) and torch.equal(cache[-1], cache[0])


def test_bad_inputs_raise():
    inp = kda_inputs(1, 5, 2, 4, 3, seed=0, dtype=torch.float32)
    with pytest.raises(ValueError, match="position 6"):
        kda_chunk_triton(*_args(inp), emit_at=[6])
    with pytest.raises(ValueError, match="g must be"):
        kda_chunk_triton(inp["q"], inp["k"], inp["v"], inp["g"][..., 0], inp["beta"])
