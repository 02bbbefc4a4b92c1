"""The chunked gated delta rule of several sequences packed in one call
(`gated_delta_chunk_varlen`): the reference against `gated_delta_chunk_ref` of each
sequence alone (an empty and a one-token sequence, states or none); the Triton kernels
(TRITON_INTERPRET=1 without a GPU) against the reference, sequences spanning several
chunks and ending mid-chunk, emits at chunk ends and starts; bad arguments named."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.gated_delta import gated_delta_chunk_ref, gated_delta_chunk_varlen_ref

TOL = 1e-5


def _packed(lengths: list[int], H: int = 2, K: int = 16, V: int = 40, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    T = cu[-1]
    tensors = (
        torch.randn(T, H, K, generator=g), torch.randn(T, H, K, generator=g),
        torch.randn(T, H, V, generator=g), -torch.rand(T, H, generator=g),
        torch.rand(T, H, generator=g),
    )  # fmt: skip
    return cu, tensors, torch.randn(len(lengths), H, K, V, generator=g)


def _emits(lengths: list[int]) -> list[list[int]]:
    return [sorted({p for p in (1, 16, 17, n) if 1 <= p <= n}) for n in lengths]


LENGTHS = [[5, 0, 37, 1, 16], [20], [33, 2]]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("has_state", [True, False])
def test_ref_equals_each_sequence_alone(lengths, has_state):
    cu, t, h0 = _packed(lengths)
    emits = _emits(lengths)
    o, final, emitted = gated_delta_chunk_varlen_ref(
        *t, cu_seqlens=cu, chunk_size=16, initial_states=h0 if has_state else None,
        emit_at=emits,
    )  # fmt: skip
    e = 0
    for s in range(len(lengths)):
        rows = slice(cu[s], cu[s + 1])
        os_, fs, es = gated_delta_chunk_ref(
            *(x[None, rows] for x in t), chunk_size=16,
            initial_state=h0[s : s + 1] if has_state else None, emit_at=emits[s],
        )  # fmt: skip
        assert torch.equal(o[rows], os_[0]) and torch.equal(final[s], fs[0])
        for j in range(len(emits[s])):
            assert torch.equal(emitted[e], es[j, 0])
            e += 1
    assert emitted.shape[0] == e


def test_ref_rejects_bad_arguments_naming_them():
    cu, t, h0 = _packed([3, 4])
    with pytest.raises(ValueError, match=r"cu_seqlens must rise from 0 to T = 7"):
        gated_delta_chunk_varlen_ref(*t, cu_seqlens=[0, 2, 3])
    with pytest.raises(ValueError, match=r"initial_states must be \(2, 2, 16, 40\)"):
        gated_delta_chunk_varlen_ref(*t, cu_seqlens=cu, initial_states=h0[:1])
    with pytest.raises(ValueError, match="emit_at position 2 is repeated"):
        gated_delta_chunk_varlen_ref(*t, cu_seqlens=cu, emit_at=[[2, 2], []])
    with pytest.raises(ValueError, match=r"q and k must both be \[T, H, K\]"):
        gated_delta_chunk_varlen_ref(t[0][None], *t[1:], cu_seqlens=cu)


@pytest.mark.triton
@pytest.mark.parametrize("lengths", [*LENGTHS, [40, 0]])
@pytest.mark.parametrize("has_state", [True, False])
def test_triton_matches_ref(lengths, has_state):
    from marconi_kernels.triton_gated_delta import gated_delta_chunk_varlen_triton

    cu, t, h0 = _packed(lengths, seed=6)
    kwargs = {
        "cu_seqlens": cu, "chunk_size": 16, "initial_states": h0 if has_state else None,
        "emit_at": _emits(lengths),
    }  # fmt: skip
    got = gated_delta_chunk_varlen_triton(*t, **kwargs)
    want = gated_delta_chunk_varlen_ref(*t, **kwargs)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert_close_scaled(g, w, TOL)
