"""The Mamba-2 SSD scan of several sequences packed in one call (`ssd_chunk_scan_varlen`):
the reference against `ssd_chunk_scan_ref` of each sequence alone (an empty and a
one-token sequence, states or none, grouped B/C); our Triton kernel (TRITON_INTERPRET=1
without a GPU) against the reference, sequences over several chunks ending mid-chunk,
emits at chunk ends and starts, the model's chunk larger than the kernel's; bad
arguments named."""

from __future__ import annotations

import pytest
import torch
from kernel_helpers import assert_close_scaled

from marconi_kernels.ssd import ssd_chunk_scan_ref, ssd_chunk_scan_varlen_ref

TOL = 1e-5


def _packed(lengths: list[int], H: int = 4, P: int = 20, G: int = 2, N: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    T = cu[-1]
    tensors = (
        torch.randn(T, H, P, generator=g), torch.randn(T, H, generator=g),
        -torch.rand(H, generator=g), torch.randn(T, G, N, generator=g),
        torch.randn(T, G, N, generator=g),
    )  # fmt: skip
    extra = {"D": torch.randn(H, generator=g), "dt_bias": torch.randn(H, generator=g),
             "dt_limit": (0.0, 5.0)}  # fmt: skip
    return cu, tensors, extra, torch.randn(len(lengths), H, P, N, generator=g)


def _emits(lengths: list[int]) -> list[list[int]]:
    return [sorted({p for p in (1, 16, 17, n) if 1 <= p <= n}) for n in lengths]


LENGTHS = [[5, 0, 37, 1, 16], [20], [33, 2]]


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("has_state", [True, False])
def test_ref_equals_each_sequence_alone(lengths, has_state):
    cu, t, extra, h0 = _packed(lengths)
    emits = _emits(lengths)
    y, final, emitted = ssd_chunk_scan_varlen_ref(
        *t, cu_seqlens=cu, chunk_size=16, initial_states=h0 if has_state else None,
        emit_at=emits, **extra,
    )  # fmt: skip
    e = 0
    x, dt, A, B, C = t
    for s in range(len(lengths)):
        r = slice(cu[s], cu[s + 1])
        ys, fs, es = ssd_chunk_scan_ref(
            x[None, r], dt[None, r], A, B[None, r], C[None, r], chunk_size=16,
            initial_state=h0[s : s + 1] if has_state else None, emit_at=emits[s], **extra,
        )  # fmt: skip
        assert torch.equal(y[r], ys[0]) and torch.equal(final[s], fs[0])
        for j in range(len(emits[s])):
            assert torch.equal(emitted[e], es[j, 0])
            e += 1
    assert emitted.shape[0] == e


def test_ref_rejects_bad_arguments_naming_them():
    cu, t, _, h0 = _packed([3, 4])
    with pytest.raises(ValueError, match=r"cu_seqlens must rise from 0 to T = 7"):
        ssd_chunk_scan_varlen_ref(*t, cu_seqlens=[0, 7, 6], chunk_size=16)
    with pytest.raises(ValueError, match=r"initial_states must be \(2, 4, 20, 8\)"):
        ssd_chunk_scan_varlen_ref(*t, cu_seqlens=cu, chunk_size=16, initial_states=h0[1:])
    with pytest.raises(ValueError, match=r"emit_at position 0 is outside \[1, 3\]"):
        ssd_chunk_scan_varlen_ref(*t, cu_seqlens=cu, chunk_size=16, emit_at=[[0], []])
    with pytest.raises(ValueError, match=r"x must be \[T, H, P\]"):
        ssd_chunk_scan_varlen_ref(t[0][None], *t[1:], cu_seqlens=cu, chunk_size=16)


@pytest.mark.triton
@pytest.mark.parametrize("lengths", [*LENGTHS, [70, 0]])
@pytest.mark.parametrize("has_state", [True, False])
@pytest.mark.parametrize("chunk_size", [16, 256])
def test_triton_matches_ref(lengths, has_state, chunk_size):
    from marconi_kernels.triton_ssd_varlen import ssd_chunk_scan_varlen_triton

    cu, t, extra, h0 = _packed(lengths, seed=8)
    kwargs = {
        "cu_seqlens": cu, "chunk_size": chunk_size,
        "initial_states": h0 if has_state else None, "emit_at": _emits(lengths), **extra,
    }  # fmt: skip
    got = ssd_chunk_scan_varlen_triton(*t, **kwargs)
    want = ssd_chunk_scan_varlen_ref(*t, **kwargs)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        assert_close_scaled(g, w, TOL)


@pytest.mark.triton
def test_triton_bf16_inputs_keep_float32_states():
    from marconi_kernels.triton_ssd_varlen import ssd_chunk_scan_varlen_triton

    cu, t, extra, h0 = _packed([9, 30], seed=9)
    low = tuple(v.bfloat16() if v.dim() > 1 else v for v in t)
    kwargs = {"cu_seqlens": cu, "chunk_size": 16, "initial_states": h0, "emit_at": [[4], [30]]}
    y, final, emitted = ssd_chunk_scan_varlen_triton(*low, **kwargs, **extra)
    assert y.dtype == torch.bfloat16 and final.dtype == emitted.dtype == torch.float32
    want = ssd_chunk_scan_varlen_ref(*(v.float() for v in low), **kwargs, **extra)
    assert_close_scaled(final, want[1], TOL)
    assert_close_scaled(y.float(), want[0], 2e-2)
