"""Tensor-parallel plumbing: who this rank is, how a weight is split, and the all-reduce.

A `TPGroup` is passed to every layer. World size 1 never touches `torch.distributed`.
Weights are split along one dimension into *segments*: a fused projection such as
Mamba-2's `in_proj` rows `[z | x | B | C | dt]` is split per segment (each rank keeps its
slice of every split segment and the whole of every replicated one), so the local
projection's output has the same layout as the full one, only narrower.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class TPGroup:
    """Rank `rank` of `world` tensor-parallel ranks; `group` is the process group (None
    means the default group). World size 1 needs no process group at all."""

    rank: int = 0
    world: int = 1
    group: object | None = None

    def __post_init__(self) -> None:
        if self.world < 1 or not 0 <= self.rank < self.world:
            raise ValueError(f"invalid tensor-parallel rank {self.rank} of world {self.world}")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks in place (identity at world size 1); returns `x`."""
        if self.world > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """Copy rank `src`'s `x` to every rank in place (identity at world size 1)."""
        if self.world > 1:
            dist.broadcast(x, src=src, group=self.group)  # type: ignore[arg-type]
        return x

    def part(self, size: int) -> tuple[int, int]:
        """[start, stop) of this rank's equal share of `size` items (divisible by world)."""
        if size % self.world:
            raise ValueError(f"size {size} is not divisible by tensor-parallel size {self.world}")
        n = size // self.world
        return self.rank * n, (self.rank + 1) * n

    def local(self, size: int) -> int:
        """This rank's share of `size` items."""
        start, stop = self.part(size)
        return stop - start


@dataclass(frozen=True)
class Segment:
    """`size` consecutive rows of a fused weight; `split` across ranks or replicated."""

    size: int
    split: bool = True


def rank_ranges(size: int, segments: Sequence[Segment], tp: TPGroup) -> list[tuple[int, int]]:
    """The [start, stop) ranges of this rank's rows along a weight dimension of `size`
    rows made of `segments` (its share of each split segment, the whole of each
    replicated one), in order, adjacent ranges merged. ValueError when the segments do
    not add up to `size` or a split segment does not divide by the tensor-parallel size.
    """
    total = sum(s.size for s in segments)
    if size != total:
        raise ValueError(f"weight dim has size {size}, segments expect {total}")
    ranges: list[tuple[int, int]] = []
    offset = 0
    for s in segments:
        start, stop = tp.part(s.size) if s.split else (0, s.size)
        begin, end = offset + start, offset + stop
        if ranges and ranges[-1][1] == begin:
            ranges[-1] = (ranges[-1][0], end)
        elif end > begin:
            ranges.append((begin, end))
        offset += s.size
    return ranges


def local_size(segments: Sequence[Segment], tp: TPGroup) -> int:
    """Size of the local shard of `segments`."""
    return sum(tp.local(s.size) if s.split else s.size for s in segments)
