"""The Mamba-1 selective scan of several sequences packed in one call
(`selective_scan_varlen`): the reference against `selective_scan_ref` of each sequence
alone, with an empty and a one-token sequence, states or none, duplicated emit positions;
the Triton kernel (TRITON_INTERPRET=1 without a GPU) against the reference across
channel blocks and token chunks (an emit position right at a sequence's end must not
leak into the next one); bad arguments named."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.selective_scan import selective_scan_ref, selective_scan_varlen_ref

TOL = 1e-5


def _packed(lengths: list[int], Dm: int = 40, N: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    T = cu[-1]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    tensors = {
        "u": rnd(Dm, T), "delta": rnd(Dm, T), "A": -torch.rand(Dm, N, generator=g),
        "B": rnd(N, T), "C": rnd(N, T),
    }  # fmt: skip
    extra = {"D": rnd(Dm), "z": rnd(Dm, T), "delta_bias": rnd(Dm)}
    return cu, tensors, extra, rnd(len(lengths), Dm, N)


def _emits(lengths: list[int]) -> list[list[int]]:
    return [sorted({p for p in (1, n // 2, n) if 1 <= p <= n}) for n in lengths]


LENGTHS = [[5, 0, 17, 1, 33], [20], [16, 16, 3]]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("has_state", [True, False])
def test_ref_equals_each_sequence_alone(lengths, has_state):
    cu, t, extra, h0 = _packed(lengths)
    emits = _emits(lengths)
    y, final, emitted = selective_scan_varlen_ref(
        *t.values(), cu_seqlens=cu, initial_states=h0 if has_state else None, emit_at=emits,
        **extra,
    )  # fmt: skip
    e = 0
    for s in range(len(lengths)):
        cols = slice(cu[s], cu[s + 1])
        ys, fs, es = selective_scan_ref(
            t["u"][None, :, cols], t["delta"][None, :, cols], t["A"], t["B"][None, :, cols],
            t["C"][None, :, cols], D=extra["D"], z=extra["z"][None, :, cols],
            delta_bias=extra["delta_bias"], initial_state=h0[s : s + 1] if has_state else None,
            emit_at=emits[s],
        )  # fmt: skip
        assert torch.equal(y[:, cols], ys[0]) and torch.equal(final[s], fs[0])
        for j in range(len(emits[s])):
            assert torch.equal(emitted[e], es[j, 0])
            e += 1
    assert emitted.shape[0] == e


def test_ref_rejects_bad_arguments_naming_them():
    cu, t, _, h0 = _packed([3, 4])
    with pytest.raises(ValueError, match=r"cu_seqlens must rise from 0 to T = 7"):
        selective_scan_varlen_ref(*t.values(), cu_seqlens=[0, 3, 5])
    with pytest.raises(ValueError, match=r"initial_states must be \(2, 40, 5\)"):
        selective_scan_varlen_ref(*t.values(), cu_seqlens=cu, initial_states=h0[:1])
    with pytest.raises(ValueError, match=r"emit_at position 5 is outside \[1, 4\]"):
        selective_scan_varlen_ref(*t.values(), cu_seqlens=cu, emit_at=[[], [5]])
    with pytest.raises(ValueError, match=r"u and delta must be \[Dm, T\]"):
        selective_scan_varlen_ref(t["u"][None], *list(t.values())[1:], cu_seqlens=cu)


@pytest.mark.triton
@pytest.mark.parametrize("lengths", [*LENGTHS, [40, 1]])
@pytest.mark.parametrize("has_state", [True, False])
def test_triton_matches_ref(lengths, has_state):
    from marconi_kernels.triton_selective_scan import selective_scan_varlen_triton

    cu, t, extra, h0 = _packed(lengths, seed=4)
    emits = [[*e, *e[-1:]] for e in _emits(lengths)]  # each last position twice
    kwargs = {"cu_seqlens": cu, "initial_states": h0 if has_state else None, "emit_at": emits}
    got = selective_scan_varlen_triton(*t.values(), **kwargs, **extra)
    want = selective_scan_varlen_ref(*t.values(), **kwargs, **extra)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert_close_scaled(g, w, TOL)
