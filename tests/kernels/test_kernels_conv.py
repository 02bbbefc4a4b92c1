"""Causal conv1d with state: matches F.conv1d, chains through states, steps equal one call."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from kernel_helpers import assert_close_scaled

from marconi_kernels import causal_conv1d_ref, causal_conv1d_update_ref


def _inputs(b=2, C=5, L=11, K=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(b, C, L, generator=g),
        torch.randn(C, K, generator=g),
        torch.randn(C, generator=g),
        torch.randn(b, C, K, generator=g),
    )


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("K", [2, 4, 5])
def test_no_state_equals_left_padded_conv1d(activation, K):
    x, w, bias, _ = _inputs(K=K)
    y, state, emitted = causal_conv1d_ref(x, w, bias, activation=activation)
    expected = F.conv1d(F.pad(x, (K - 1, 0)), w.unsqueeze(1), bias, groups=x.shape[1])
    if activation == "silu":
        expected = F.silu(expected)
    assert_close_scaled(y, expected, 1e-6)
    assert torch.equal(state, x[:, :, -K:]) and emitted.shape == (0, 2, 5, K)


def test_short_input_state_keeps_history():
    x, w, bias, init = _inputs(L=2, K=4)
    _, state, _ = causal_conv1d_ref(x, w, bias, initial_state=init)
    assert torch.equal(state, torch.cat([init[:, :, 2:], x], dim=-1))
    _, state0, _ = causal_conv1d_ref(x, w, bias)
    assert torch.equal(state0[:, :, :2], torch.zeros(2, 5, 2))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 10])
def test_chaining_with_state_equals_one_call(p):
    x, w, bias, init = _inputs()
    y, state, emitted = causal_conv1d_ref(x, w, bias, initial_state=init, emit_at=[p, 11])
    y1, s1, _ = causal_conv1d_ref(x[..., :p], w, bias, initial_state=init)
    y2, s2, _ = causal_conv1d_ref(x[..., p:], w, bias, initial_state=s1)
    assert_close_scaled(torch.cat([y1, y2], dim=-1), y, 1e-6)
    assert torch.equal(s2, state)
    assert torch.equal(emitted[0], s1) and torch.equal(emitted[1], state)


@pytest.mark.parametrize("activation", ["silu", None])
def test_update_steps_equal_one_call(activation):
    x, w, bias, init = _inputs()
    y, final, _ = causal_conv1d_ref(x, w, bias, initial_state=init, activation=activation)
    state = init.clone()
    ys = [
        causal_conv1d_update_ref(x[..., t], state, w, bias, activation=activation)
        for t in range(x.shape[-1])
    ]
    assert_close_scaled(torch.stack(ys, dim=-1), y, 1e-6)
    assert torch.equal(state, final)


def test_low_precision_dtype_and_bad_activation():
    x, w, bias, init = _inputs()
    y, state, _ = causal_conv1d_ref(x.bfloat16(), w, bias, initial_state=init)
    assert y.dtype == torch.bfloat16 and state.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="relu"):
        causal_conv1d_ref(x, w, bias, activation="relu")
