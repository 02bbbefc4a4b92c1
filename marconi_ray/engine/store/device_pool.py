"""`DeviceKVPool`: the device tier's KV rows (SGLang-style token-slot pool).

Attention block i keeps keys `k[i]` and values `v[i]`, each `[n_kv_i, rows, head_dim_i]`
in the store dtype on the model's device; row r of every block together is one token's KV.
The pool grows by doubling (a copy on the compute stream); freed rows are reused.

A row is free, held, or pending: left behind by a demotion whose copy may still be
reading it. A pending row becomes free once its copy's event has completed (`reclaim`,
run by every `alloc`); an allocation that needs pending rows waits for their event
rather than growing the pool.

Token rows (`pack` / `unpack`): one token's KV of every block flattened into one row of
`row_elems` values, block by block in `shapes` order, K `[n_kv, head_dim]` then V: the
host tier's layout, so one contiguous run of host rows is one DMA.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import numpy.typing as npt
import torch

from marconi_ray.engine.store.tier_copy import CopyEvent, device_index

Rows = npt.NDArray[np.int64]


class DeviceKVPool:
    """K/V rows of the attention blocks on one device.

    The tensors have `capacity + 1` rows: the last is the `scratch_row`, outside the
    free / held / pending partition (`check`).

    Args:
        shapes: attention block index -> (n_kv local heads, head_dim).
        dtype, device: of the pool tensors.
        rows: initial number of rows.
    """

    def __init__(
        self,
        shapes: dict[int, tuple[int, int]],
        dtype: torch.dtype,
        device: torch.device,
        rows: int,
    ) -> None:
        self.shapes = dict(shapes)
        self.dtype = dtype
        self.device = device
        self.k = {
            i: torch.zeros((n, rows + 1, d), dtype=dtype, device=device)
            for i, (n, d) in shapes.items()
        }
        self.v = {i: torch.zeros_like(t) for i, t in self.k.items()}
        self.row_elems = sum(2 * n * d for n, d in shapes.values())
        """Values in one token row (K and V of every block)."""
        self._capacity = rows
        self._free: list[int] = list(range(rows - 1, -1, -1))
        self._held = np.zeros(rows, dtype=np.bool_)
        self._pending: deque[tuple[CopyEvent, Rows]] = deque()
        self.sized = False
        """Sized once by `reserve` (from a memory budget): admission then also keeps
        every running request's remaining rows free, and `growths` counts the growths
        that still happened (a cache promotion ahead of its evictions)."""
        self.growths = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def scratch_row(self) -> int:
        """A row past the `capacity` rows that no slot ever gets: the padded rows of a
        static decode step (`step_graphs`) write their KV there and read only it."""
        return self._capacity

    @property
    def held(self) -> int:
        return int(self._held.sum())

    def is_held(self, rows: Rows) -> npt.NDArray[np.bool_]:
        return self._held[rows]

    @property
    def pending(self) -> int:
        """Rows waiting for a demotion's copy to complete."""
        return sum(len(rows) for _, rows in self._pending)

    def tensors(self) -> list[torch.Tensor]:
        """Every pool tensor (what a copy on another stream must `touch`)."""
        return [*self.k.values(), *self.v.values()]

    # ------------------------------------------------------------------ rows
    def alloc(self, n: int) -> Rows:
        """`n` free rows, now held: reclaims completed pending rows, waits for the oldest
        pending copies while rows are short, then grows the pool."""
        self.reclaim()
        while len(self._free) < n and self._pending:
            self._pending[0][0].synchronize()
            self.reclaim()
        if n > len(self._free):
            self._grow(max(2 * self._capacity, self._capacity + n - len(self._free)))
        out = np.asarray(self._free[len(self._free) - n :][::-1], dtype=np.int64)
        del self._free[len(self._free) - n :]
        self._held[out] = True
        return out

    def free(self, rows: Rows, after: CopyEvent | None = None) -> None:
        """Give back held rows: free now, or (with `after`) pending until that event has
        completed. The caller guarantees they are held (the store validates ids)."""
        rows = np.asarray(rows, dtype=np.int64)
        self._held[rows] = False
        if after is None:
            self._free.extend(rows.tolist())
        elif len(rows):
            self._pending.append((after, rows))

    def reclaim(self) -> None:
        """Free the pending rows whose copies have completed (events complete in the copy
        stream's order)."""
        while self._pending and self._pending[0][0].query():
            self._free.extend(self._pending.popleft()[1].tolist())

    def reserve(self, rows: int) -> None:
        """Grow the pool to `rows` rows at once (no-op when it has as many): a pool sized
        at start from a memory budget (`engine.kv_memory`) never grows while serving."""
        if rows > self._capacity:
            self._grow(rows)
        self.sized = True

    def _grow(self, new_cap: int) -> None:
        self.growths += self.sized
        for pool in (self.k, self.v):
            for i, t in pool.items():
                grown = t.new_zeros(t.shape[0], new_cap + 1, t.shape[2])
                grown[:, : self._capacity] = t[:, : self._capacity]
                pool[i] = grown
        self._free = list(range(new_cap - 1, self._capacity - 1, -1)) + self._free
        self._held = np.concatenate([self._held, np.zeros(new_cap - self._capacity, np.bool_)])
        self._capacity = new_cap

    # ------------------------------------------------------------------ data
    def write(self, rows: Rows, kv: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Store block -> (k, v) `[n_kv, len(rows), head_dim]` (any dtype) into `rows`."""
        idx = device_index(rows, self.device)
        for i, (k, v) in kv.items():
            self.k[i][:, idx] = k.to(self.dtype)
            self.v[i][:, idx] = v.to(self.dtype)

    def read(self, rows: Rows) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Block -> (k, v) `[n_kv, len(rows), head_dim]`, copies of `rows` in order."""
        idx = device_index(rows, self.device)
        return {i: (self.k[i].index_select(1, idx), self.v[i].index_select(1, idx)) for i in self.k}

    def merge(
        self, rows: Rows, on_host: npt.NDArray[np.bool_], packed: torch.Tensor
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Block -> (k, v) `[n_kv, len(rows), head_dim]` (new contiguous tensors) of
        positions taken in order from two tiers: where `on_host`, the next token row of
        `packed` (`[on_host.sum(), row_elems]`, on this device), elsewhere the pool row
        `rows[p]` (`rows` at host positions is ignored)."""
        at_host = device_index(np.flatnonzero(on_host), self.device)
        at_dev = device_index(np.flatnonzero(~on_host), self.device)
        from_dev = self.read(rows[~on_host])
        out = {}
        for i, pair in self.unpack(packed).items():
            both = []
            for host_part, dev_part in zip(pair, from_dev[i], strict=True):
                h, _, d = host_part.shape
                t = host_part.new_empty((h, len(rows), d))
                t.index_copy_(1, at_host, host_part)
                t.index_copy_(1, at_dev, dev_part)
                both.append(t)
            out[i] = (both[0], both[1])
        return out

    def pack(self, rows: Rows) -> torch.Tensor:
        """Token rows `[len(rows), row_elems]` of `rows`, in order (a new tensor)."""
        n = len(rows)
        parts = [t.transpose(0, 1).reshape(n, -1) for kv in self.read(rows).values() for t in kv]
        return (
            torch.cat(parts, dim=1)
            if parts
            else torch.empty(n, 0, dtype=self.dtype, device=self.device)
        )

    def unpack(self, packed: torch.Tensor) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Block -> (k, v) `[n_kv, n, head_dim]` views of token rows `[n, row_elems]`."""
        n, out, off = packed.shape[0], {}, 0
        for i, (h, d) in self.shapes.items():
            k = packed[:, off : off + h * d].reshape(n, h, d).transpose(0, 1)
            v = packed[:, off + h * d : off + 2 * h * d].reshape(n, h, d).transpose(0, 1)
            out[i] = (k, v)
            off += 2 * h * d
        return out

    def check(self) -> None:
        """Raise AssertionError unless every row is exactly one of free, held, pending."""
        free = np.asarray(self._free, dtype=np.int64)
        pending = [rows for _, rows in self._pending]
        parts = np.concatenate([free, *pending, np.flatnonzero(self._held)])
        if len(parts) != self._capacity or len(np.unique(parts)) != self._capacity:
            raise AssertionError(
                f"device rows: {len(free)} free + {self.pending} pending + {self.held} held "
                f"do not partition the {self._capacity} rows"
            )
