"""Random RG-LRU recurrence inputs shared by the RG-LRU kernel tests."""

from __future__ import annotations

import torch


def rglru_inputs(
    shape: tuple[int, ...], seed: int = 0, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x, a, b of `shape`: x normal, the decay a in (0, 1) (as exp(-8 r softplus(p))
    gives it), the multiplier b = sqrt(1 - a^2)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    a = torch.rand(*shape, generator=g, dtype=torch.float64) * 0.98 + 0.01
    b = torch.sqrt(1 - a * a)
    return x.to(dtype), a.to(dtype), b.to(dtype)
