"""Grouped matmul (MoE dispatch): the reference against a per-row loop, its device layout
(`align_by_expert`), and the Triton kernel equal to the reference under
`TRITON_INTERPRET=1`."""

from __future__ import annotations

import pytest
import torch

from marconi_kernels.grouped_matmul import grouped_matmul_ref

CASES = [
    # (M, K, N, E, experts: "random" | "one" (all rows one expert) | "skip" (some empty))
    (1, 8, 8, 4, "random"),
    (37, 40, 72, 6, "random"),
    (50, 64, 33, 8, "one"),
    (64, 17, 48, 5, "skip"),
]


def _inputs(m: int, k: int, n: int, e: int, kind: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    w = torch.randn(e, n, k, generator=g)
    if kind == "one":
        experts = torch.full((m,), e - 1, dtype=torch.long)
    elif kind == "skip":
        experts = torch.randint(0, e // 2, (m,), generator=g) * 2  # odd experts get none
    else:
        experts = torch.randint(0, e, (m,), generator=g)
    return x, w, experts


def _loop(x: torch.Tensor, w: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    return torch.stack([w[int(e)] @ x[i] for i, e in enumerate(experts)])


@pytest.mark.parametrize(("m", "k", "n", "e", "kind"), CASES)
def test_the_reference_is_each_row_times_its_expert(m, k, n, e, kind):
    x, w, experts = _inputs(m, k, n, e, kind)
    torch.testing.assert_close(grouped_matmul_ref(x, w, experts), _loop(x, w, experts))


def test_bad_shapes_are_refused_by_name():
    x, w, experts = _inputs(4, 8, 8, 2, "random")
    with pytest.raises(ValueError, match="disagree on K or M"):
        grouped_matmul_ref(x[:, :7], w, experts)
    with pytest.raises(ValueError, match="int64"):
        grouped_matmul_ref(x, w, experts.int())
    assert grouped_matmul_ref(x[:0], w, experts[:0]).shape == (0, 8)


@pytest.mark.triton
@pytest.mark.parametrize(("m", "e"), [(1, 3), (37, 6), (64, 5)])
def test_the_layout_places_every_row_once_in_its_experts_blocks(m, e):
    from marconi_kernels.triton_grouped_matmul import align_by_expert

    experts = torch.randint(0, e, (m,), generator=torch.Generator().manual_seed(m))
    rows, block_expert = align_by_expert(experts, e, 16)
    real = rows[rows < m]
    assert sorted(real.tolist()) == list(range(m))  # every row once
    blocks = rows.view(-1, 16)
    for b, expert in enumerate(block_expert.tolist()):
        members = blocks[b][blocks[b] < m]
        if expert < 0:
            assert len(members) == 0
        else:
            assert (experts[members] == expert).all()


@pytest.mark.triton
@pytest.mark.parametrize(("m", "k", "n", "e", "kind"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_matches_ref(m, k, n, e, kind, dtype):
    from marconi_kernels.triton_grouped_matmul import grouped_matmul_triton

    x, w, experts = _inputs(m, k, n, e, kind, seed=2)
    got = grouped_matmul_triton(x.to(dtype), w.to(dtype), experts)
    want = grouped_matmul_ref(x.to(dtype).float(), w.to(dtype).float(), experts)
    assert got.dtype == dtype
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * 10)
    # strided weights (an expert stack viewed transposed) read the same
    wt = w.to(dtype).transpose(1, 2).contiguous().transpose(1, 2)
    torch.testing.assert_close(grouped_matmul_triton(x.to(dtype), wt, experts), got)
