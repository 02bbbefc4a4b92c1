"""`HostKVPool`: the host tier's KV rows, in host memory.

Row r is one token's K and V of every attention block, `row_elems` values in the store
dtype, laid out as `DeviceKVPool.pack` makes them. Token-major rows (rather than the device
pool's `[n_kv, rows, head_dim]` per block) make a contiguous run of host rows one
contiguous block of memory, so moving it is one DMA: a per-block slice of rows is strided,
and `copy_` would stage it through pageable memory, blocking the host.

Rows live in segments, pinned when the store's device is CUDA: the first of
`initial_rows` rows, then each new one as large as all before it, so the capacity doubles
without copying or waiting for copies in flight (no row ever moves). Allocation takes the
lowest free rows, so rows allocated together mostly form one run.

Rows are read and written only by the copies the store queues through a `TierCopier` (on
CUDA: in the copy stream's order), never by the host thread directly, so a row may be
freed and reused while copies involving it are still queued.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import pairwise

import numpy as np
import numpy.typing as npt
import torch

Rows = npt.NDArray[np.int64]
CopyFn = Callable[[torch.Tensor, torch.Tensor], None]
"""`copy(dst, src)`: how data crosses between the tiers (`TierCopier.copy`)."""


class HostKVPool:
    """Token rows `[rows, row_elems]` in host memory.

    Args:
        row_elems: values per token row (`DeviceKVPool.row_elems`).
        dtype: the store dtype.
        empty: `empty(shape, dtype)` makes an uninitialised host tensor (pinned on CUDA:
            `TierCopier.host_empty`).
        initial_rows: rows of the first segment.
    """

    def __init__(
        self,
        row_elems: int,
        dtype: torch.dtype,
        empty: Callable[[tuple[int, int], torch.dtype], torch.Tensor],
        initial_rows: int = 256,
    ) -> None:
        self.row_elems = row_elems
        self.dtype = dtype
        self._empty = empty
        self.segments: list[torch.Tensor] = []
        self._starts = np.zeros(0, dtype=np.int64)
        self._held = np.zeros(0, dtype=np.bool_)
        self._add_segment(max(1, initial_rows))

    @property
    def capacity(self) -> int:
        return len(self._held)

    @property
    def held(self) -> int:
        return int(self._held.sum())

    def is_held(self, rows: Rows) -> npt.NDArray[np.bool_]:
        return self._held[rows]

    def _add_segment(self, rows: int) -> None:
        self._starts = np.append(self._starts, self.capacity)
        self.segments.append(self._empty((rows, self.row_elems), self.dtype))
        self._held = np.concatenate([self._held, np.zeros(rows, dtype=np.bool_)])

    def alloc(self, n: int) -> Rows:
        """The `n` lowest free rows, ascending, now held (adds a segment if short)."""
        free = np.flatnonzero(~self._held)
        if len(free) < n:
            self._add_segment(max(self.capacity, n - len(free)))
            free = np.flatnonzero(~self._held)
        out = free[:n].astype(np.int64)
        self._held[out] = True
        return out

    def free(self, rows: Rows) -> None:
        """Give back held rows (the caller guarantees they are held)."""
        self._held[np.asarray(rows, dtype=np.int64)] = False

    def runs(self, rows: Rows) -> Iterator[tuple[int, int, torch.Tensor]]:
        """(i, j, view): positions [i, j) of `rows` are consecutive rows of one segment,
        `view` (`[j - i, row_elems]`, contiguous); the runs cover `rows` in order."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return
        seg = np.searchsorted(self._starts, rows, side="right") - 1
        breaks = np.flatnonzero((np.diff(rows) != 1) | (np.diff(seg) != 0)) + 1
        bounds = [0, *breaks.tolist(), len(rows)]
        for i, j in pairwise(bounds):
            s = int(seg[i])
            off = int(rows[i] - self._starts[s])
            yield i, j, self.segments[s][off : off + j - i]

    def write(self, rows: Rows, packed: torch.Tensor, copy: CopyFn) -> None:
        """Copy token rows `packed` `[len(rows), row_elems]` into `rows`, run by run."""
        for i, j, view in self.runs(rows):
            copy(view, packed[i:j])

    def read(self, rows: Rows, out: torch.Tensor, copy: CopyFn) -> None:
        """Copy `rows` into `out` `[len(rows), row_elems]` (in order), run by run."""
        for i, j, view in self.runs(rows):
            copy(out[i:j], view)
