"""Rotary position embedding (NeoX style: the rotated half is `[-x2, x1]`).

Default RoPE turns the first `rotary_dim` channels of each head as pairs
(i, i + rotary_dim / 2) at frequencies theta^(-2i / rotary_dim), as Bamba applies it with
`partial_rotary_factor`. Proportional RoPE (LFM3's full attention, transformers'
"proportional") pairs (i, i + head_dim / 2) over the whole head, the first
rotary_dim / 2 pairs at theta^(-2i / head_dim) and the rest at frequency 0 (unturned).
"""

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

    @classmethod
    def proportional(
        cls, rotary_dim: int, head_dim: int, theta: float, device: torch.device
    ) -> Rope:
        """Proportional RoPE over heads of `head_dim` turning `rotary_dim` channels (even,
        <= head_dim): a full-head Rope whose frequencies past rotary_dim / 2 are 0."""
        rope = cls(head_dim, theta, device)
        exponent = torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).float()
        turned = 1.0 / (theta ** (exponent / head_dim))
        still = torch.zeros(head_dim // 2 - rotary_dim // 2, device=device)
        rope.inv_freq = torch.cat((turned, still))
        return rope

    def apply(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        rot, rest = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        half = self.rotary_dim // 2
        rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
        return torch.cat((rot * cos + rotated * sin, rest), dim=-1)
