"""`ReplicaTable`: the registered replicas' open requests and confirmed flags as numpy
columns by registration slot, so routing finds the replicas that can take a request,
the least loaded of them and the k-th of them without a Python loop over replicas.

A replica gets the next slot when it is added, so slot order is registration order (the
order of the coordinator's `planners`; adding a replica already present keeps its slot,
as assigning a present dict key keeps its place). Removed slots are masked out (not
confirmed) and compacted away, order kept, once they outnumber the live ones.

`serve.coordinator.routing.state` keeps it in step with `CacheState`: open requests after every
operation, the confirmed flag where it changes (`CacheState.set_confirmed`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

Mask = npt.NDArray[np.bool_]

_NO_SLOT = np.iinfo(np.int64).max


class ReplicaTable:
    """Columns `open` (open requests) and `confirmed`, one row per slot (see the module
    docstring); freed slots are not confirmed and count 0 open requests."""

    def __init__(self) -> None:
        self._slot: dict[str, int] = {}
        self._ids: list[str | None] = []
        self.open = np.zeros(8, dtype=np.int64)
        self.confirmed = np.zeros(8, dtype=bool)

    def __len__(self) -> int:
        """Replicas in the table."""
        return len(self._slot)

    def __contains__(self, replica_id: object) -> bool:
        return replica_id in self._slot

    # ------------------------------------------------------------------ rows
    def add(self, replica_id: str, confirmed: bool, open_requests: int = 0) -> None:
        """A row for `replica_id` (at the end, unless it has one: then that one)."""
        slot = self._slot.get(replica_id)
        if slot is None:
            slot = len(self._ids)
            if slot == len(self.open):
                self.open = np.concatenate([self.open, np.zeros(slot, dtype=np.int64)])
                self.confirmed = np.concatenate([self.confirmed, np.zeros(slot, dtype=bool)])
            self._ids.append(replica_id)
            self._slot[replica_id] = slot
        self.open[slot] = open_requests
        self.confirmed[slot] = confirmed

    def remove(self, replica_id: str) -> None:
        """Free `replica_id`'s row (nothing when it has none)."""
        slot = self._slot.pop(replica_id, None)
        if slot is None:
            return
        self._ids[slot] = None
        self.open[slot], self.confirmed[slot] = 0, False
        if len(self._ids) > 2 * len(self._slot) + 8:
            self._compact()

    def set_open(self, replica_id: str, open_requests: int) -> None:
        self.open[self._slot[replica_id]] = open_requests

    def set_confirmed(self, replica_id: str, confirmed: bool) -> None:
        self.confirmed[self._slot[replica_id]] = confirmed

    def clear(self) -> None:
        """No rows."""
        self._slot, self._ids = {}, []
        self.open = np.zeros(8, dtype=np.int64)
        self.confirmed = np.zeros(8, dtype=bool)

    def _compact(self) -> None:
        live = [(s, rid) for s, rid in enumerate(self._ids) if rid is not None]
        slots = np.asarray([s for s, _ in live], dtype=np.int64)
        size = max(8, 2 * len(live))
        open_, confirmed = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=bool)
        open_[: len(live)] = self.open[slots]
        confirmed[: len(live)] = self.confirmed[slots]
        self.open, self.confirmed = open_, confirmed
        self._ids = [rid for _, rid in live]
        self._slot = {rid: i for i, (_, rid) in enumerate(live)}

    # ------------------------------------------------------------------ queries
    def slot(self, replica_id: str) -> int:
        """`replica_id`'s slot (KeyError when it has none)."""
        return self._slot[replica_id]

    def id_at(self, slot: int) -> str:
        rid = self._ids[slot]
        assert rid is not None, f"slot {slot} is free"
        return rid

    def confirmed_count(self) -> int:
        return int(np.count_nonzero(self.confirmed[: len(self._ids)]))

    def eligible(self, max_open: int | None) -> Mask:
        """Slots of the confirmed replicas with fewer than `max_open` open requests (None:
        no limit)."""
        n = len(self._ids)
        if max_open is None:
            return self.confirmed[:n].copy()
        return self.confirmed[:n] & (self.open[:n] < max_open)

    def least_loaded(self, mask: Mask, exclude: Sequence[int] = ()) -> int | None:
        """The slot in `mask` but not in `exclude` with the fewest open requests, the
        earliest among equals; None when there is none."""
        keys = np.where(mask, self.open[: len(mask)], _NO_SLOT)
        if len(exclude):
            keys[list(exclude)] = _NO_SLOT
        slot = int(keys.argmin())
        return None if keys[slot] == _NO_SLOT else slot

    def rows(self) -> Iterable[tuple[str, int, bool]]:
        """(replica id, open requests, confirmed) in slot order (for checks)."""
        for slot, rid in enumerate(self._ids):
            if rid is not None:
                yield rid, int(self.open[slot]), bool(self.confirmed[slot])
