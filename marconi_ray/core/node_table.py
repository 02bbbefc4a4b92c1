"""Slot-indexed columns of per-node eviction data, so victim selection is vectorised.

Every tree node owns one slot. The columns hold what an eviction policy needs to rank
candidates without walking the tree in Python: last access time, FLOP efficiency and two
candidate masks. The tree keeps them current on every mutation (see
`RadixTree._refresh`); a policy then picks a victim with a few numpy reductions over
the masked slots, O(slots) in C instead of O(nodes) in Python.

Invariants (checked by `core.invariants.check_tree`):
- `evictable[s]` is True iff slot s belongs to a live non-root node that holds an SSM
  state, has at most one child and is not locked.
- `leaf[s]` is True iff `evictable[s]` and that node has no children.
- free slots have both masks False.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

_INITIAL_SLOTS = 256


class NodeTable:
    """Growable columns indexed by node slot.

    Attributes:
        last_access: float64[slots], logical time of the node's last access.
        efficiency: float64[slots], FLOPs saved per byte freed if the node is evicted.
        evictable: bool[slots], candidate mask of the FLOP-aware policy.
        leaf: bool[slots], candidate mask of LRU (evictable leaves).
    """

    def __init__(self, n_slots: int = _INITIAL_SLOTS) -> None:
        self.last_access: npt.NDArray[np.float64] = np.zeros(n_slots, dtype=np.float64)
        self.efficiency: npt.NDArray[np.float64] = np.zeros(n_slots, dtype=np.float64)
        self.evictable: npt.NDArray[np.bool_] = np.zeros(n_slots, dtype=np.bool_)
        self.leaf: npt.NDArray[np.bool_] = np.zeros(n_slots, dtype=np.bool_)
        self._free: list[int] = list(range(n_slots - 1, -1, -1))

    @property
    def n_slots(self) -> int:
        return int(self.last_access.shape[0])

    def alloc(self) -> int:
        """Return a free slot with cleared columns, growing the columns when full."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.last_access[slot] = 0.0
        self.efficiency[slot] = 0.0
        self.evictable[slot] = False
        self.leaf[slot] = False
        return slot

    def release(self, slot: int) -> None:
        """Give a slot back; it leaves every candidate mask."""
        self.evictable[slot] = False
        self.leaf[slot] = False
        self._free.append(slot)

    def _grow(self) -> None:
        old = self.n_slots
        new = old * 2
        self.last_access = np.concatenate([self.last_access, np.zeros(old)])
        self.efficiency = np.concatenate([self.efficiency, np.zeros(old)])
        self.evictable = np.concatenate([self.evictable, np.zeros(old, dtype=np.bool_)])
        self.leaf = np.concatenate([self.leaf, np.zeros(old, dtype=np.bool_)])
        self._free.extend(range(new - 1, old - 1, -1))

    def used_slots(self) -> int:
        return self.n_slots - len(self._free)
