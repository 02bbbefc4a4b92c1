"""Rotary position embedding on the first `rotary_dim` channels of each head (NeoX style:
the rotated half is `[-x2, x1]`), as Bamba applies it with `partial_rotary_factor`."""

from __future__ import annotations

import torch


class Rope:
    """cos/sin tables computed on demand for absolute positions.

    `apply(x, positions)`: x [n_heads, L, head_dim], positions [L] (long) -> same shape.
    """

    def __init__(self, rotary_dim: int, theta: float, device: torch.device) -> None:
        self.rotary_dim = rotary_dim
        exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float()
        self.inv_freq = 1.0 / (theta ** (exponent / rotary_dim))

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        half = self.rotary_dim // 2
        rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        return torch.cat((rot * cos + rotated * sin, rest), dim=-1)
