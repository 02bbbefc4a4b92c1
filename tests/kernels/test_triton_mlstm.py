"""Triton mLSTM (prefill with emitted states, varlen prefill, decode step) against the
pure-torch references (interpreter on CPU; float64 references, so the tolerance is
float32 rounding)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled
from test_kernels_mlstm import mlstm_inputs

from marconi_kernels import triton_mlstm as tm_mod
from marconi_kernels.mlstm import (
    mlstm_chunk_ref,
    mlstm_chunk_varlen_ref,
    mlstm_state_size,
    mlstm_step_ref,
)
from marconi_kernels.triton_mlstm import (
    mlstm_chunk_triton,
    mlstm_chunk_varlen_triton,
    mlstm_step_triton,
)

pytestmark = pytest.mark.triton

BV = tm_mod._BV
NAMES = ("q", "k", "v", "igate", "fgate")


def _args(inp, dtype=torch.float32):
    return [inp[name].to(dtype) for name in NAMES]


@pytest.mark.parametrize(
    ("b", "L", "H", "K", "V", "chunk", "with_state", "emit_at"),
    [
        (1, 1, 1, 4, 3, 16, True, [1]),  # one token, head dims below the block
        (2, 40, 2, 12, BV + 8, 16, True, [1, 15, 16, 17, 31, 32, 33, 40]),  # 2 V blocks
        (1, 37, 1, 16, 16, 5, False, [5, 16, 37]),  # chunk 5 runs as 16; zero state
    ],
)
def test_chunk_matches_ref(b, L, H, K, V, chunk, with_state, emit_at):
    inp = mlstm_inputs(b, L, H, K, V, seed=L + V, dtype=torch.float32)
    state = inp["state"] if with_state else None
    out = mlstm_chunk_triton(*_args(inp), chunk_size=chunk, initial_state=state,
                             emit_at=emit_at)  # fmt: skip
    ref = mlstm_chunk_ref(
        *_args(inp, torch.float64), chunk_size=chunk,
        initial_state=None if state is None else state.double(), emit_at=emit_at,
    )  # fmt: skip
    assert [t.dtype for t in out] == [torch.float32] * 3
    assert out[2].shape == (len(emit_at), b, H, mlstm_state_size(K, V))
    for a, e in zip(out, ref, strict=True):
        assert_close_scaled(a, e, 1e-5)


def test_varlen_matches_ref():
    lens = [3, 0, 20, 17]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    inp = mlstm_inputs(1, cu[-1], 2, 8, 8, seed=6, dtype=torch.float32)
    states = mlstm_inputs(4, 1, 2, 8, 8, seed=8, dtype=torch.float32)["state"]
    emits = [[3], [], [1, 16, 17, 20], [2, 16]]
    args = [t[0] for t in _args(inp)]
    out = mlstm_chunk_varlen_triton(
        *args, cu_seqlens=cu, chunk_size=16, initial_states=states, emit_at=emits
    )
    ref = mlstm_chunk_varlen_ref(
        *(t.double() for t in args), cu_seqlens=cu, chunk_size=16,
        initial_states=states.double(), emit_at=emits,
    )  # fmt: skip
    for a, e in zip(out, ref, strict=True):
        assert a.shape == e.shape
        assert_close_scaled(a, e, 1e-5)


def test_step_matches_ref_in_place_on_strided_rows():
    inp = mlstm_inputs(3, 1, 2, 8, BV + 4, seed=2, dtype=torch.float32)
    rows = mlstm_inputs(6, 1, 2, 8, BV + 4, seed=3, dtype=torch.float32)["state"]
    state = rows[::2]
    expect = state.clone()
    o = mlstm_step_triton(state, *(t[:, 0] for t in _args(inp)))
    o_ref = mlstm_step_ref(expect, *(t[:, 0] for t in _args(inp)))
    assert_close_scaled(o, o_ref, 1e-5)
    assert_close_scaled(rows[::2], expect, 1e-5)
