"""Slot-indexed columns of per-node eviction data, so victim selection is vectorised.

Every tree node owns one slot. The columns hold what an eviction policy needs to rank
candidates without walking the tree in Python: last access time, the node's depth, its
anchor depth and edge length (from which a FLOP-efficiency formula is evaluated over the
candidates at once, see `cost_model.EFFICIENCY_FORMULAS`) and two candidate masks. The
tree keeps them current on every mutation (see `RadixTree._refresh`); a policy then picks
a victim with a few numpy reductions over the masked slots, O(slots) in C instead of
O(nodes) in Python. LRU needs only the oldest leaf: `lru` is a lazy min-heap of
(last access, slot) that makes that O(log n).

Invariants (checked by `core.cache.invariants.check_tree`):
- `evictable[s]` is True iff slot s belongs to a live non-root node that holds an SSM
  state, has at most one child and is not locked.
- `leaf[s]` is True iff `evictable[s]` and that node has no children.
- free slots have both masks False.
- for a live node: `depth[s]` is its depth, `edge_len[s]` its edge's length and
  `anchor[s]` the depth of its nearest state-holding proper ancestor (0: none); the
  root's slot holds zeros.
- `host_tokens[s]` is the count of a live node's edge tokens whose KV is on the host and
  `state_host[s]` whether its state is (both 0 / False on a one-tier cache).
- `lru` holds `(last_access[s], s)` for every s with `leaf[s]` (and stale entries, which
  `oldest_leaf` discards: an entry is current iff its slot is a leaf with that time).
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

from marconi_ray.core.model.cost_model import CostModel, FloatArray, IntArray

_INITIAL_SLOTS = 256
_LRU_SLACK = 4096
"""Stale heap entries tolerated beyond twice the live ones before `lru` is rebuilt."""


class NodeTable:
    """Growable columns indexed by node slot.

    Attributes:
        last_access: float64[slots], logical time of the node's last access.
        depth: int64[slots], tokens from the root to the end of the node.
        anchor: int64[slots], depth of the nearest state-holding proper ancestor.
        edge_len: int64[slots], tokens on the node's edge.
        geometry: int64[slots, 3], the rows (depth, anchor, edge_len): the three
            columns above are its views.
        evictable: bool[slots], candidate mask of the FLOP-aware policy.
        leaf: bool[slots], candidate mask of LRU (evictable leaves).
        host_tokens: int64[slots], edge tokens whose KV is on the host tier.
        state_host: bool[slots], the node's state is on the host tier.
        lru: min-heap of (last access, slot) covering every `leaf` slot (see above).
    """

    def __init__(self, n_slots: int = _INITIAL_SLOTS) -> None:
        self.last_access: npt.NDArray[np.float64] = np.zeros(n_slots, dtype=np.float64)
        self._set_geometry(np.zeros((n_slots, 3), dtype=np.int64))
        self.evictable: npt.NDArray[np.bool_] = np.zeros(n_slots, dtype=np.bool_)
        self.leaf: npt.NDArray[np.bool_] = np.zeros(n_slots, dtype=np.bool_)
        self.host_tokens: IntArray = np.zeros(n_slots, dtype=np.int64)
        self.state_host: npt.NDArray[np.bool_] = np.zeros(n_slots, dtype=np.bool_)
        self.lru: list[tuple[float, int]] = []
        self._lru_limit = _LRU_SLACK
        self._free: list[int] = list(range(n_slots - 1, -1, -1))

    def _set_geometry(self, geometry: IntArray) -> None:
        """`geometry` rows are (depth, anchor, edge_len) per slot (one gather fetches all
        three); the named columns are views of it."""
        self.geometry = geometry
        self.depth: IntArray = geometry[:, 0]
        self.anchor: IntArray = geometry[:, 1]
        self.edge_len: IntArray = geometry[:, 2]

    @property
    def n_slots(self) -> int:
        return int(self.last_access.shape[0])

    def alloc(self) -> int:
        """Return a free slot with cleared columns, growing the columns when full."""
        if not self._free:
            self._grow()
        slot = self._free.pop()
        self.last_access[slot] = 0.0
        self.depth[slot] = 0  # three scalar stores cost less than one row store
        self.anchor[slot] = 0
        self.edge_len[slot] = 0
        self.evictable[slot] = False
        self.leaf[slot] = False
        self.host_tokens[slot] = 0
        self.state_host[slot] = False
        return slot

    def alloc_many(self, k: int) -> list[int]:
        """The slots `k` calls of `alloc` would return, in that order, with their masks
        cleared; the caller sets every other column."""
        out: list[int] = []
        free = self._free
        while k > 0:
            if not free:
                self._grow()
            take = min(k, len(free))
            cut = len(free) - take
            out.extend(reversed(free[cut:]))
            del free[cut:]
            k -= take
        self.evictable[out] = False
        self.leaf[out] = False
        self.host_tokens[out] = 0
        self.state_host[out] = False
        return out

    def release(self, slot: int) -> None:
        """Give a slot back; it leaves every candidate mask."""
        self.evictable[slot] = False
        self.leaf[slot] = False
        self._free.append(slot)

    def _grow(self) -> None:
        old = self.n_slots
        new = old * 2
        self.last_access = np.concatenate([self.last_access, np.zeros(old)])
        self._set_geometry(np.concatenate([self.geometry, np.zeros((old, 3), dtype=np.int64)]))
        self.evictable = np.concatenate([self.evictable, np.zeros(old, dtype=np.bool_)])
        self.leaf = np.concatenate([self.leaf, np.zeros(old, dtype=np.bool_)])
        self.host_tokens = np.concatenate([self.host_tokens, np.zeros(old, dtype=np.int64)])
        self.state_host = np.concatenate([self.state_host, np.zeros(old, dtype=np.bool_)])
        self._free.extend(range(new - 1, old - 1, -1))

    def device_candidates(self) -> npt.NDArray[np.bool_]:
        """Eviction candidates whose eviction frees device bytes: a state on the device,
        or, for a leaf (whose eviction frees its edge), a KV token on the device."""
        out: npt.NDArray[np.bool_] = self.evictable & (
            ~self.state_host | (self.leaf & (self.host_tokens < self.edge_len))
        )
        return out

    def host_candidates(self) -> npt.NDArray[np.bool_]:
        """Eviction candidates whose eviction frees host bytes: a state on the host, or,
        for a leaf, a KV token on the host."""
        out: npt.NDArray[np.bool_] = self.evictable & (
            self.state_host | (self.leaf & (self.host_tokens > 0))
        )
        return out

    def used_slots(self) -> int:
        return self.n_slots - len(self._free)

    # -------------------------------------------------------------- LRU heap
    def push_leaf(self, slot: int) -> None:
        """Record `slot`'s current (last access, slot) in `lru`: call when it becomes a
        leaf candidate, and when a leaf's last access changes."""
        heapq.heappush(self.lru, (float(self.last_access[slot]), slot))
        if len(self.lru) > self._lru_limit:
            self.rebuild_lru()

    def rebuild_lru(self) -> None:
        """`lru` from the columns, without stale entries."""
        slots = np.flatnonzero(self.leaf)
        self.lru = list(zip(self.last_access[slots].tolist(), slots.tolist(), strict=True))
        heapq.heapify(self.lru)
        self._lru_limit = 2 * len(self.lru) + _LRU_SLACK

    def oldest_leaf(self) -> int | None:
        """The leaf slot with the smallest (last access, slot), i.e. the argmin of
        `last_access` over `leaf` with ties to the lowest slot; None when none is."""
        heap = self.lru
        leaf = self.leaf
        last = self.last_access
        while heap:
            t, slot = heap[0]
            if leaf[slot] and last[slot] == t:
                return slot
            heapq.heappop(heap)
        return None

    # ------------------------------------------------------------ efficiency
    def efficiency(self, cost: CostModel, formula: str, slots: IntArray) -> FloatArray:
        """FLOP efficiency (`cost_model.EFFICIENCY_FORMULAS[formula]`) of the nodes at
        `slots`, evaluated over the columns at once. Defined for state-holding nodes;
        `leaf` (not locked, childless) is what `freed` counts as a leaf, so it is the
        node's own value for eviction candidates."""
        rows = self.geometry[slots]
        return cost.efficiencies(rows[:, 0], rows[:, 1], rows[:, 2], self.leaf[slots], formula)
