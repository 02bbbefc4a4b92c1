"""`ChunkTable`: how a varlen chunked kernel walks S packed sequences. Each sequence is cut
into chunks of its own (a chunk never spans two sequences: the last one of each may be
short), and each emit position is filed under the chunk that holds its last token, as a
position local to that chunk. Built on the host from host ints (no sync), handed to the
kernels as small int tensors."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ChunkTable:
    """starts, lengths: [nc] each chunk's first packed token and its tokens; crange:
    [S + 1] sequence s owns chunks crange[s]:crange[s + 1]; epos: [E] each emit's
    position local to its chunk (1..BT), sequence by sequence in emit order; erange:
    [nc + 1] chunk c's emits are epos[erange[c]:erange[c + 1]]."""

    starts: list[int]
    lengths: list[int]
    crange: list[int]
    epos: list[int]
    erange: list[int]

    @staticmethod
    def of(cu: Sequence[int], emits: Sequence[Sequence[int]], chunk: int) -> ChunkTable:
        """The table of sequences cu[s]:cu[s + 1] cut into `chunk`-token chunks, emitting
        at `emits[s]` (sorted positions, relative to each sequence's start)."""
        starts: list[int] = []
        lengths: list[int] = []
        crange, epos, echunk = [0], [], []
        for s in range(len(cu) - 1):
            first, n = len(starts), cu[s + 1] - cu[s]
            for c0 in range(0, n, chunk):
                starts.append(cu[s] + c0)
                lengths.append(min(chunk, n - c0))
            crange.append(len(starts))
            for p in emits[s]:
                c = (p - 1) // chunk
                echunk.append(first + c)
                epos.append(p - c * chunk)
        erange = [bisect.bisect_left(echunk, c) for c in range(len(starts) + 1)]
        return ChunkTable(starts, lengths, crange, epos, erange)

    def tensors(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(starts, lengths, crange, erange) as int64 and epos as int32 tensors on
        `device` (a [1] zero for an empty list: kernels take a valid pointer)."""

        def ints(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
            return torch.tensor(values or [0], dtype=dtype, device=device)

        return (
            ints(self.starts), ints(self.lengths), ints(self.crange), ints(self.erange),
            ints(self.epos, torch.int32),
        )  # fmt: skip
