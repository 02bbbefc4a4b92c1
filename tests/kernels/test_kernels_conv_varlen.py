"""The causal conv of several sequences packed in one call (`causal_conv1d_varlen`): the
reference against `causal_conv1d_ref` of each sequence alone (outputs to rounding, final
and emitted states bit-exact copies), with an empty and a one-token sequence and states
shorter than the kernel; the Triton kernel (TRITON_INTERPRET=1 without a GPU) against
the reference across token and channel block boundaries; bad arguments named."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.conv import causal_conv1d_ref, causal_conv1d_varlen_ref

TOL = 1e-5


def _packed(lengths: list[int], C: int, K: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    x = torch.randn(C, cu[-1], generator=g)
    return (
        x,
        torch.randn(C, K, generator=g),
        torch.randn(C, generator=g),
        cu,
        torch.randn(len(lengths), C, K, generator=g),
    )


def _emits(lengths: list[int], K: int) -> list[list[int]]:
    return [sorted({p for p in (1, K - 1, K, n // 2, n) if 1 <= p <= n}) for n in lengths]


LENGTHS = [[5, 0, 1, 9, 2], [17], [3, 40, 2, 33], [0, 0]]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("has_state", [True, False])
@pytest.mark.parametrize("activation", ["silu", None])
def test_ref_equals_each_sequence_alone(lengths, has_state, activation):
    K = 4
    x, w, b, cu, init = _packed(lengths, 6, K)
    emits = _emits(lengths, K)
    states = init if has_state else None
    y, final, emitted = causal_conv1d_varlen_ref(
        x, w, b, cu_seqlens=cu, initial_states=states, activation=activation, emit_at=emits
    )
    e = 0
    for s, n in enumerate(lengths):
        own = init[s : s + 1] if has_state else torch.zeros(1, 6, K)
        if n == 0:
            assert torch.equal(final[s], own[0])
            continue
        ys, fs, es = causal_conv1d_ref(
            x[None, :, cu[s] : cu[s + 1]], w, b, initial_state=own, activation=activation,
            emit_at=emits[s],
        )  # fmt: skip
        assert_close_scaled(y[:, cu[s] : cu[s + 1]], ys[0], TOL)
        assert torch.equal(final[s], fs[0])
        for j in range(len(emits[s])):
            assert torch.equal(emitted[e], es[j, 0])
            e += 1
    assert emitted.shape[0] == e


def test_ref_rejects_bad_arguments_naming_them():
    x, w, b, cu, init = _packed([3, 4], 5, 3)
    with pytest.raises(ValueError, match=r"cu_seqlens must rise from 0 to T = 7, got \[0, 3, 6\]"):
        causal_conv1d_varlen_ref(x, w, b, cu_seqlens=[0, 3, 6])
    with pytest.raises(ValueError, match=r"initial_states must be \(2, 5, 3\)"):
        causal_conv1d_varlen_ref(x, w, b, cu_seqlens=cu, initial_states=init[:1])
    with pytest.raises(ValueError, match="one list per sequence"):
        causal_conv1d_varlen_ref(x, w, b, cu_seqlens=cu, emit_at=[[1]])
    with pytest.raises(ValueError, match=r"emit_at position 4 is outside \[1, 3\]"):
        causal_conv1d_varlen_ref(x, w, b, cu_seqlens=cu, emit_at=[[4], []])
    with pytest.raises(ValueError, match=r"x must be \[C, T\]"):
        causal_conv1d_varlen_ref(x[None], w, b, cu_seqlens=cu)


@pytest.mark.triton
@pytest.mark.parametrize("lengths", [*LENGTHS, [130, 0, 140]])
@pytest.mark.parametrize("has_state", [True, False])
@pytest.mark.parametrize("has_bias", [True, False])
def test_triton_matches_ref(lengths, has_state, has_bias):
    from marconi_kernels.triton_conv import causal_conv1d_varlen_triton

    x, w, b, cu, init = _packed(lengths, 37, 4, seed=2)
    kwargs = {
        "cu_seqlens": cu,
        "initial_states": init if has_state else None,
        "emit_at": _emits(lengths, 4),
    }
    bias = b if has_bias else None
    got = causal_conv1d_varlen_triton(x, w, bias, **kwargs)
    want = causal_conv1d_varlen_ref(x, w, bias, **kwargs)
    assert_close_scaled(got[0], want[0], TOL)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


@pytest.mark.triton
def test_triton_reads_strided_inputs_and_bf16():
    from marconi_kernels.triton_conv import causal_conv1d_varlen_triton

    x, w, b, cu, init = _packed([9, 20], 8, 4, seed=5)
    strided = x.t().contiguous().t()  # [C, T] with the token dim contiguous-first
    kwargs = {"cu_seqlens": cu, "initial_states": init, "emit_at": [[3], [1, 20]]}
    want = causal_conv1d_varlen_ref(x, w, b, **kwargs)
    got = causal_conv1d_varlen_triton(strided, w, b, **kwargs)
    assert_close_scaled(got[0], want[0], TOL)
    low = causal_conv1d_varlen_triton(x.bfloat16(), w.bfloat16(), b.bfloat16(), **kwargs)
    assert low[0].dtype == torch.bfloat16
    want_low = causal_conv1d_varlen_ref(x.bfloat16(), w.bfloat16(), b.bfloat16(), **kwargs)
    assert_close_scaled(low[0].float(), want_low[0].float(), 2e-2)
