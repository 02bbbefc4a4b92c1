"""A position-weighted checksum of a tensor's bytes, computed where the tensor lives (no
copy to the host for a device tensor), so a transfer that arrives short, reordered or
with flipped bits is told apart from the one that was sent."""

from __future__ import annotations

import torch

_CHUNK = 1 << 20
"""Words summed per pass: bounds the int64 temporary at 8 MiB whatever the tensor."""
_MOD = 65521
"""Weights cycle through 1..65521 (the largest prime below 2**16), so moving a word
changes the weighted sum."""


def checksum(t: torch.Tensor) -> tuple[int, int, int]:
    """(byte count, sum of the 32-bit words, sum of word x weight) of `t`'s bytes in
    row-major order (a non-contiguous tensor is read as its contiguous copy; the last
    word is zero-padded). int64 sums wrap, identically on every device."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    n = raw.numel()
    pad = (-n) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    words = raw.view(torch.int32)
    plain = torch.zeros((), dtype=torch.int64, device=t.device)
    weighted = torch.zeros((), dtype=torch.int64, device=t.device)
    for at in range(0, words.numel(), _CHUNK):
        w = words[at : at + _CHUNK].to(torch.int64)
        weights = torch.arange(at, at + w.numel(), dtype=torch.int64, device=t.device) % _MOD + 1
        plain += w.sum()
        weighted += (w * weights).sum()
    return n, int(plain), int(weighted)
