"""Tile sizes the chunked linear-attention Triton kernels share (gated delta rule, KDA,
lightning attention, mLSTM): every `tl.dot` operand dimension is a power of two of at
least `MIN_BLOCK`."""

from __future__ import annotations

import triton

MIN_BLOCK = 16
"""`tl.dot` needs every dimension >= 16."""


def block_k(K: int) -> int:
    """The tile width of a head dimension K: the next power of two, at least `MIN_BLOCK`."""
    return max(MIN_BLOCK, int(triton.next_power_of_2(K)))


def chunk_len(chunk_size: int) -> int:
    """The kernel's chunk: `chunk_size` rounded up to a power of two >= `MIN_BLOCK`
    (ValueError below 1)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return max(MIN_BLOCK, int(triton.next_power_of_2(chunk_size)))


def warps(KP: int, BT: int) -> int:
    """More warps for wide tiles (fewer register spills)."""
    return 4 if KP * BT <= 4096 else 8
