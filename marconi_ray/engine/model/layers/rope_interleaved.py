"""Rotary position embedding in DeepSeek's interleaved layout (MLA's rope channels).

Channel pairs (2i, 2i+1) rotate by frequency i = theta ** (-2i / dim); the rotated
channels are written evens first, then odds ([x_even', x_odd']), as transformers'
`apply_rotary_pos_emb_interleave` does. Queries and keys get the same permutation, so
their dot products are the interleaved rotation's.
"""

from __future__ import annotations

import torch


class InterleavedRope:
    """cos/sin of absolute positions over `dim` channels (dim even).

    `apply(x, positions)`: x [L, ..., dim], positions [L] (long) -> same shape, x's dtype.
    """

    def __init__(self, dim: int, theta: float, device: torch.device | None = None) -> None:
        exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float()
        self.inv_freq = 1.0 / (theta ** (exponent / dim))

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions.float()[:, None] * self.inv_freq.to(positions.device)[None, :]
        shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (freqs.shape[-1],)
        cos, sin = freqs.cos().to(x.dtype).view(shape), freqs.sin().to(x.dtype).view(shape)
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.cat([even * cos - odd * sin, odd * cos + even * sin], dim=-1)
