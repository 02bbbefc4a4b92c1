"""`SlotTable`: logical KV slot ids and where each one lives.

A tree node's KV handle is an array of slot ids; the ids never change, while the KV
behind an id may sit in a row of the device pool or of the host pool. The table maps
every id to its tier (`FREE`, `DEVICE` or `HOST`) and its row in that tier's pool
(`-1` when free). Freed ids are reused, last freed first; the table grows by doubling.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

Slots = npt.NDArray[np.int64]
Tiers = npt.NDArray[np.int8]
FREE, DEVICE, HOST = 0, 1, 2
TIER_NAMES = {DEVICE: "the device", HOST: "the host"}


class RowPool(Protocol):
    """What `check` needs of a tier's pool (`DeviceKVPool`, `HostKVPool`)."""

    @property
    def capacity(self) -> int: ...

    @property
    def held(self) -> int: ...

    def is_held(self, rows: Slots) -> npt.NDArray[np.bool_]: ...


class SlotTable:
    """Slot id -> (tier, row) for `capacity` ids (grows as ids are allocated)."""

    def __init__(self, capacity: int) -> None:
        self.tier: Tiers = np.zeros(capacity, dtype=np.int8)
        """id -> FREE, DEVICE or HOST."""
        self.row = np.full(capacity, -1, dtype=np.int64)
        """id -> its row in its tier's pool (-1 when free)."""
        self._free: list[int] = list(range(capacity - 1, -1, -1))

    def count(self, tier: int) -> int:
        """Ids in `tier`."""
        return int(np.count_nonzero(self.tier == tier))

    def ids(self, tier: int | None = None) -> Slots:
        """Held ids (of `tier`, or of either), ascending."""
        held = self.tier != FREE if tier is None else self.tier == tier
        return np.flatnonzero(held).astype(np.int64)

    def tiers_of(self, ids: Slots, table: Tiers | None = None) -> Tiers:
        """The tier of each id in `table` (default: this table's), FREE out of range."""
        table = self.tier if table is None else table
        out = np.zeros(len(ids), dtype=np.int8)
        ok = (ids >= 0) & (ids < len(table))
        out[ok] = table[ids[ok]]
        return out

    def not_held(self, ids: Slots, table: Tiers | None = None) -> list[int]:
        """Ids of `ids` that `table` (default: this table's) does not hold, or that are
        listed twice, ascending."""
        bad = set(ids[self.tiers_of(ids, table) == FREE].tolist())
        uniq, counts = np.unique(ids, return_counts=True)
        bad.update(uniq[counts > 1].tolist())
        return sorted(bad)

    def alloc(self, n: int) -> Slots:
        """`n` free ids (growing the table if needed); the caller places them."""
        if n > len(self._free):
            cap = len(self.tier)
            new_cap = max(2 * cap, cap + n - len(self._free))
            self.tier = np.concatenate([self.tier, np.zeros(new_cap - cap, dtype=np.int8)])
            self.row = np.concatenate([self.row, np.full(new_cap - cap, -1, dtype=np.int64)])
            self._free = list(range(new_cap - 1, cap - 1, -1)) + self._free
        out = np.asarray(self._free[len(self._free) - n :][::-1], dtype=np.int64)
        del self._free[len(self._free) - n :]
        return out

    def place(self, ids: Slots, tier: int, rows: Slots) -> None:
        """Record that `ids` now live in `rows` of `tier`."""
        self.tier[ids] = tier
        self.row[ids] = rows

    def free(self, ids: Slots) -> None:
        """Free held `ids` (the caller has validated them and freed their rows)."""
        self.tier[ids] = FREE
        self.row[ids] = -1
        self._free.extend(ids.tolist())

    def check(self, pools: dict[int, RowPool]) -> None:
        """Raise AssertionError unless: the free list is exactly the free ids, each once,
        and they have no row; in each tier, every id has a row of that tier's pool, no two
        ids share a row, and the pool holds exactly those rows."""
        free = np.sort(np.asarray(self._free, dtype=np.int64))
        if not np.array_equal(free, np.flatnonzero(self.tier == FREE)):
            raise AssertionError("the free id list is not exactly the ids without a tier")
        if (self.row[self.tier == FREE] != -1).any():
            raise AssertionError("a free slot id still has a row")
        for tier, pool in pools.items():
            rows = self.row[self.tier == tier]
            name = TIER_NAMES[tier]
            if ((rows < 0) | (rows >= pool.capacity)).any():
                raise AssertionError(f"a slot id on {name} has no row there")
            if len(np.unique(rows)) != len(rows):
                raise AssertionError(f"two slot ids share a row on {name}")
            if not pool.is_held(rows).all() or pool.held != len(rows):
                raise AssertionError(f"the rows held on {name} are not those of its slot ids")
