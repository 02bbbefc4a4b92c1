"""Triton causal conv1d (prefill and decode step) against the pure-torch references.

Runs on CPU tensors under TRITON_INTERPRET=1 without a GPU, so shapes stay small. Block sizes
are picked by the wrapper: L = 300 gives 128-token blocks (three of them) and 16-channel
blocks, so C = 37 spans three channel blocks, none of them full.
"""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.conv import causal_conv1d_ref, causal_conv1d_update_ref
from marconi_kernels.triton_conv import causal_conv1d_triton, causal_conv1d_update_triton

pytestmark = pytest.mark.triton

TOL = 1e-5


def _inputs(b: int, C: int, L: int, K: int, seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    return rnd(b, C, L), rnd(C, K), rnd(C), rnd(b, C, K)


def _positions(L: int, K: int) -> list[int]:
    """1, < K, == K, a block boundary (128), a block interior (200) and L, where they fit."""
    return sorted({p for p in (1, K - 1, K, 128, 200, L) if 1 <= p <= L})


def _check(out, ref, tol: float = TOL) -> None:
    assert_close_scaled(out[0], ref[0], tol)
    assert out[0].dtype == ref[0].dtype
    assert torch.equal(out[1], ref[1]), "final state must be a bit-exact copy of inputs"
    assert torch.equal(out[2], ref[2]), "emitted states must be bit-exact copies of inputs"


# (has_bias, activation, has_initial_state): every flag value, every pair of values.
FLAG_SETS = [(True, "silu", True), (False, None, True), (True, None, False), (False, "silu", False)]


@pytest.mark.parametrize(("has_bias", "activation", "has_state"), FLAG_SETS)
@pytest.mark.parametrize(("b", "C", "L"), [(1, 5, 2), (3, 37, 300)])
@pytest.mark.parametrize("K", [2, 3, 4, 5])
def test_matches_ref(K, b, C, L, has_bias, activation, has_state):
    x, w, bias, init = _inputs(b, C, L, K)
    kwargs = {
        "initial_state": init if has_state else None,
        "activation": activation,
        "emit_at": _positions(L, K),
    }
    bias_arg = bias if has_bias else None
    _check(
        causal_conv1d_triton(x, w, bias_arg, **kwargs),
        causal_conv1d_ref(x, w, bias_arg, **kwargs),
    )


def test_kernel_width_one_and_swish_alias():
    x, w, bias, init = _inputs(2, 7, 5, 1)
    kwargs = {"initial_state": init, "emit_at": [1, 5]}
    _check(
        causal_conv1d_triton(x, w, bias, activation="swish", **kwargs),
        causal_conv1d_ref(x, w, bias, activation="silu", **kwargs),
    )


def test_non_contiguous_inputs():
    x, w, bias, init = _inputs(2, 9, 20, 4)
    x_t = x.transpose(1, 2).contiguous().transpose(1, 2)  # [b, C, L] with channels innermost
    w_t = w.t().contiguous().t()
    init_t = init.transpose(0, 2).contiguous().transpose(0, 2)
    assert not (x_t.is_contiguous() or w_t.is_contiguous() or init_t.is_contiguous())
    kwargs = {"emit_at": [2, 3, 4, 17]}
    _check(
        causal_conv1d_triton(x_t, w_t, bias, initial_state=init_t, **kwargs),
        causal_conv1d_ref(x, w, bias, initial_state=init, **kwargs),
    )


@pytest.mark.parametrize("has_state", [True, False])
def test_empty_sequence(has_state):
    x, w, bias, init = _inputs(2, 5, 0, 4)
    y, final, emitted = causal_conv1d_triton(x, w, bias, initial_state=init if has_state else None)
    assert y.shape == (2, 5, 0) and emitted.shape == (0, 2, 5, 4)
    assert torch.equal(final, init if has_state else torch.zeros(2, 5, 4))


@pytest.mark.parametrize("split", [1, 2, 129])
def test_resumed_call_equals_one_call(split):
    x, w, bias, init = _inputs(2, 37, 150, 4, seed=1)
    y, final, _ = causal_conv1d_triton(x, w, bias, initial_state=init)
    y1, s1, _ = causal_conv1d_triton(x[..., :split], w, bias, initial_state=init)
    y2, s2, _ = causal_conv1d_triton(x[..., split:], w, bias, initial_state=s1)
    assert_close_scaled(torch.cat([y1, y2], dim=-1), y, TOL)
    assert torch.equal(s2, final)


@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize(("C", "K"), [(37, 4), (150, 3)])
def test_update_steps_equal_one_call(activation, C, K):
    x, w, bias, init = _inputs(2, C, 9, K, seed=2)
    y, final, _ = causal_conv1d_triton(x, w, bias, initial_state=init, activation=activation)
    state, state_ref = init.clone(), init.clone()
    ys, ys_ref = [], []
    for t in range(x.shape[-1]):
        ys.append(causal_conv1d_update_triton(x[..., t], state, w, bias, activation=activation))
        ys_ref.append(
            causal_conv1d_update_ref(x[..., t], state_ref, w, bias, activation=activation)
        )
        assert torch.equal(state, state_ref)
    assert_close_scaled(torch.stack(ys, dim=-1), torch.stack(ys_ref, dim=-1), TOL)
    assert_close_scaled(torch.stack(ys, dim=-1), y, TOL)
    assert torch.equal(state, final)


def test_update_writes_into_non_contiguous_view():
    K, C = 4, 37
    g = torch.Generator().manual_seed(3)
    buf = torch.randn(7, C, K + 3, generator=g)
    view = buf[1:7:2, :, 2 : K + 2]  # rows 1, 3, 5 and a column window: strided everywhere
    assert not view.is_contiguous()
    x = torch.randn(3, 2 * C, generator=g)[:, ::2]  # non-contiguous [b, C]
    w, bias = torch.randn(C, K, generator=g), torch.randn(C, generator=g)
    expected_buf = buf.clone()
    y_ref = causal_conv1d_update_ref(x, expected_buf[1:7:2, :, 2 : K + 2], w, bias)
    y = causal_conv1d_update_triton(x, view, w, bias)
    assert_close_scaled(y, y_ref, TOL)
    assert torch.equal(buf, expected_buf)  # the view was written, nothing else was touched


def test_bf16():
    x, w, bias, init = _inputs(2, 37, 40, 4, seed=4, dtype=torch.bfloat16)
    kwargs = {"initial_state": init, "emit_at": [1, 3, 4, 40]}
    out = causal_conv1d_triton(x, w, bias, **kwargs)
    assert out[1].dtype == torch.bfloat16 and out[2].dtype == torch.bfloat16
    _check(out, causal_conv1d_ref(x, w, bias, **kwargs), tol=2e-2)
    state, state_ref = init.float(), init.float()  # a float32 cache fed bf16 tokens
    y = causal_conv1d_update_triton(x[..., 0], state, w, bias)
    y_ref = causal_conv1d_update_ref(x[..., 0], state_ref, w, bias)
    assert y.dtype == torch.bfloat16
    assert_close_scaled(y, y_ref, 2e-2)
    assert torch.equal(state, state_ref)


def test_bad_arguments_raise():
    x, w, bias, init = _inputs(2, 5, 6, 4)
    bad_calls = {
        "relu": lambda: causal_conv1d_triton(x, w, bias, activation="relu"),
        "x must be": lambda: causal_conv1d_triton(x[0], w),
        "weight must be": lambda: causal_conv1d_triton(x, w[:4]),
        "initial_state must be": lambda: causal_conv1d_triton(x, w, initial_state=init[..., :3]),
        "bias must be": lambda: causal_conv1d_triton(x, w, bias[:4]),
        "outside": lambda: causal_conv1d_triton(x, w, emit_at=[7]),
        "sorted": lambda: causal_conv1d_triton(x, w, emit_at=[3, 2]),
    }
    state = init.clone()
    bad_updates = {
        "gelu": lambda: causal_conv1d_update_triton(x[..., 0], state, w, activation="gelu"),
        "x must be": lambda: causal_conv1d_update_triton(x[:1, :, 0], state, w),
        "weight must be": lambda: causal_conv1d_update_triton(x[..., 0], state, w[:, :3]),
        "bias must be": lambda: causal_conv1d_update_triton(x[..., 0], state, w, bias[:2]),
    }
    for match, call in [*bad_calls.items(), *bad_updates.items()]:
        with pytest.raises(ValueError, match=match):
            call()
    assert torch.equal(state, init)
