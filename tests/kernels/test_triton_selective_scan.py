"""Triton Mamba-1 selective scan against the pure-torch reference (interpreter on CPU)."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled, mamba1_inputs

from marconi_kernels import triton_selective_scan as tss
from marconi_kernels.selective_scan import selective_scan_ref
from marconi_kernels.triton_selective_scan import selective_scan_triton

pytestmark = pytest.mark.triton

CH = tss._CHUNK
BD = tss._BLOCK_D
KEYS = ("D", "z", "delta_bias", "state")


def _kwargs(inp, use=KEYS, **kw):
    names = {"state": "initial_state"}
    return {names.get(k, k): inp[k] for k in use} | kw


def _both(inp, use=KEYS, **kw):
    args = [inp[k] for k in ("u", "delta", "A", "B", "C")]
    ref = selective_scan_ref(*args, **_kwargs(inp, use, **kw))
    out = selective_scan_triton(*args, **_kwargs(inp, use, **kw))
    return out, ref


def _check(out, ref, tol=1e-5):
    for a, e in zip(out, ref, strict=True):
        assert a.dtype == e.dtype and a.shape == e.shape
        assert_close_scaled(a, e, tol)


@pytest.mark.parametrize(
    ("b", "Dm", "N", "L", "use", "softplus"),
    [
        (1, 3, 4, 1, KEYS, True),  # L = 1
        (2, BD + 5, 16, 2 * CH + 3, KEYS, True),  # Dm, L not multiples of the block sizes
        (2, 7, 6, CH, KEYS, True),  # non-power-of-two N, L exactly one chunk
        (1, 5, 4, CH + 1, (), True),  # no D / z / bias / state
        (2, 4, 16, 9, ("D", "state"), False),  # no softplus, no gate, no bias
        (1, 6, 6, 11, ("z", "delta_bias"), True),
    ],
)
def test_matches_ref(b, Dm, N, L, use, softplus):
    inp = mamba1_inputs(b, Dm, N, L, seed=b * 100 + L)
    if not softplus:  # raw delta must be positive without softplus
        inp["delta"] = inp["delta"].abs() * 0.5
    _check(*_both(inp, use, delta_softplus=softplus))


def test_extreme_delta_and_longer_sequence():
    """Raw delta far beyond the softplus threshold (20) both ways, over several blocks."""
    b, Dm, N, L = 2, 2 * BD + 3, 16, 6 * CH + 5
    inp = mamba1_inputs(b, Dm, N, L, seed=3)
    inp["delta"] = inp["delta"] * 15.0
    inp["u"] = inp["u"] * 0.1  # keep y O(1) with steps of size ~40
    _check(*_both(inp, emit_at=[CH * 3, L - 1]))


def test_emitted_states():
    L = 2 * CH + 5
    emit_at = [1, 3, CH - 1, CH, CH, CH + 1, 2 * CH, 2 * CH + 2, L, L]  # interior, edges, dups
    inp = mamba1_inputs(2, 9, 6, L, seed=7)
    out, ref = _both(inp, emit_at=emit_at)
    _check(out, ref)
    emitted, final = out[2], out[1]
    assert emitted.shape == (len(emit_at), 2, 9, 6)
    assert torch.equal(emitted[3], emitted[4]) and torch.equal(emitted[-1], final)


@pytest.mark.parametrize("p", [1, CH - 3, CH, CH + 2])
def test_resume_equals_one_call(p):
    L = CH + 7
    inp = mamba1_inputs(1, 5, 4, L, seed=p)
    y, state, emitted = selective_scan_triton(
        *(inp[k] for k in ("u", "delta", "A", "B", "C")), **_kwargs(inp, emit_at=[p])
    )
    halves = []
    h = inp["state"]
    for sl in (slice(0, p), slice(p, L)):
        part = {**inp, **{k: inp[k][..., sl] for k in ("u", "delta", "B", "C", "z")}}
        part["state"] = h
        yi, h, _ = selective_scan_triton(
            *(part[k] for k in ("u", "delta", "A", "B", "C")), **_kwargs(part)
        )
        if sl.start == 0:
            assert_close_scaled(emitted[0], h, 1e-6)
        halves.append(yi)
    assert_close_scaled(torch.cat(halves, dim=-1), y, 1e-5)
    assert_close_scaled(h, state, 1e-5)


def test_non_contiguous_inputs():
    b, Dm, N, L = 2, 6, 4, CH + 3
    inp = mamba1_inputs(b, Dm, N, L, seed=11)
    inp["B"] = inp["B"].transpose(1, 2).contiguous().transpose(1, 2)  # [b, N, L], stride_t = N
    inp["z"] = torch.cat([inp["z"], inp["u"]], dim=1)[:, :Dm]  # channel slice of a wider tensor
    _check(*_both(inp, emit_at=[CH]))


def test_bf16_inputs():
    inp = mamba1_inputs(2, 10, 16, CH + 4, dtype=torch.bfloat16, seed=5)
    inp["state"] = inp["state"].float()
    out, ref = _both(inp, emit_at=[4, CH + 4])
    assert out[0].dtype == torch.bfloat16 and out[1].dtype == torch.float32
    _check(out, ref, tol=2e-2)


def test_empty_sequence_returns_initial_state():
    inp = mamba1_inputs(2, 3, 4, 0, seed=0)
    (y, state, emitted), _ = _both(inp)
    assert y.shape == (2, 3, 0) and emitted.shape == (0, 2, 3, 4)
    assert torch.equal(state, inp["state"]) and state.data_ptr() != inp["state"].data_ptr()
    _, s0, _ = selective_scan_triton(*(inp[k] for k in ("u", "delta", "A", "B", "C")))
    assert torch.equal(s0, torch.zeros(2, 3, 4))


@pytest.mark.parametrize(
    ("key", "shape", "kw"),
    [
        ("delta", (2, 3, 4), {}),
        ("A", (4, 4), {}),
        ("B", (2, 5, 5), {}),
        ("C", (2, 4, 4), {}),
        ("state", (2, 3, 5), {}),
        ("z", (2, 3, 6), {}),
        ("D", (4,), {}),
        ("delta_bias", (2,), {}),
        (None, None, {"emit_at": [0]}),
        (None, None, {"emit_at": [6]}),
        (None, None, {"emit_at": [3, 2]}),
    ],
)
def test_bad_inputs_raise(key, shape, kw):
    inp = mamba1_inputs(2, 3, 4, 5, seed=0)
    if key is not None:
        inp[key] = torch.zeros(shape)
    args = [inp[k] for k in ("u", "delta", "A", "B", "C")]
    with pytest.raises(ValueError):
        selective_scan_triton(*args, **_kwargs(inp, **kw))
