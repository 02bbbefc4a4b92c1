"""`LeaseTable`: the deadlines of the coordinator's open plans.

A plan holds its hit (a locked tree node, a byte reservation) under a lease: granted when
the request is planned, renewed by the heartbeats of the replica that runs or queues it,
released at its commit or abort. A lease past its deadline plus a grace is expired: the
coordinator aborts the plan, so a request whose replica or ingress died never pins
states forever.

Invariant: the table holds exactly the coordinator's open plans, each under the replica
it was planned on (`CacheCoordinator` grants and releases in the same calls that open
and close plans; the coordinator tests check `len(table)` against open requests).

Finding the expired leases does not scan the table: `Deadlines`, a min-heap with lazy
deletion, holds one entry per lease whose value is at most its deadline (a renewal that
extends a deadline leaves the entry; one popped early is pushed again with the lease's
current deadline), so a check costs O(log n) per lease that expired or was renewed since
its entry was pushed. The coordinator drops silent replicas with one too.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable, Iterable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

LEASE_GRACE: Final = 0.5
"""Fraction of `lease_s` a lease outlives its deadline at the coordinator (clock skew
between the coordinator and the replica that checks the deadline). The replica reads it
too (`serve.replica.deployment`: when a heartbeat's renewal is sound), so it lives here,
beside the leases, where both may import it."""

_COMPACT_SLACK = 1024
"""Stale heap entries (of released leases) tolerated beyond twice the live ones."""


class Deadlines(Generic[K]):
    """Keys with a deadline-like value, in a min-heap with lazy deletion.

    Contract: for every key whose owner still has a value v, the heap's entry for it
    (the last `push`) holds a value <= v, and a predicate `is_due` passed to `due` is
    monotone (if it holds for v it holds for every u <= v). Then `due` finds every key
    whose current value is due, popping only entries that are due themselves.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, K]] = []
        self._seq: dict[K, int] = {}
        self._pushes = 0

    def __len__(self) -> int:
        """Heap entries, stale ones included."""
        return len(self._heap)

    def push(self, key: K, value: float) -> None:
        """`key`'s entry is now `value` (an earlier one becomes stale)."""
        self._pushes += 1
        self._seq[key] = self._pushes
        heapq.heappush(self._heap, (value, self._pushes, key))

    def due(self, is_due: Callable[[float], bool], current: Callable[[K], float | None]) -> list[K]:
        """Keys whose current value (`current(key)`; None: the key is gone) is due, in
        the order of their entries. They stay in the heap: a due key not taken away by
        its owner is returned again by the next call."""
        heap, out = self._heap, []
        while heap and is_due(heap[0][0]):
            _, seq, key = heapq.heappop(heap)
            if self._seq.get(key) != seq:
                continue  # stale: a later push replaced it
            value = current(key)
            if value is None:
                del self._seq[key]
            elif is_due(value):
                out.append((key, value))
            else:
                self.push(key, value)
        for key, value in out:
            self.push(key, value)
        return [key for key, _ in out]

    def rebuild(self, items: Iterable[tuple[K, float]]) -> None:
        """Exactly one entry per (key, value) of `items` (drops stale entries)."""
        self.clear()
        for key, value in items:
            self.push(key, value)

    def clear(self) -> None:
        self._heap, self._seq = [], {}


class LeaseTable:
    """request id -> (replica id, deadline in wall-clock seconds), with `Deadlines`."""

    def __init__(self) -> None:
        self._leases: dict[int, tuple[str, float]] = {}
        self._heap: Deadlines[int] = Deadlines()

    def __len__(self) -> int:
        return len(self._leases)

    def grant(self, request_id: int, replica_id: str, deadline: float) -> None:
        self._leases[request_id] = (replica_id, deadline)
        self._heap.push(request_id, deadline)
        if len(self._heap) > 2 * len(self._leases) + _COMPACT_SLACK:
            self._heap.rebuild((r, d) for r, (_, d) in self._leases.items())

    def release(self, request_id: int) -> None:
        self._leases.pop(request_id, None)

    def renew(self, replica_id: str, live: Iterable[int], deadline: float) -> None:
        """Extend the leases of `live` requests held on `replica_id` (others are ignored:
        a replica cannot renew what it was not planned)."""
        for request in live:
            lease = self._leases.get(request)
            if lease is not None and lease[0] == replica_id:
                self._leases[request] = (replica_id, deadline)
                if deadline < lease[1]:  # a clock that stepped back: keep the heap's bound
                    self._heap.push(request, deadline)

    def renew_all(self, deadline: float) -> None:
        """A fresh deadline for every lease (after a restart, when deadlines are stale)."""
        self._leases = {r: (rid, deadline) for r, (rid, _) in self._leases.items()}
        self._heap.rebuild((r, deadline) for r in self._leases)

    def deadline(self, request_id: int) -> float | None:
        """The lease's deadline, None when `request_id` holds none."""
        lease = self._leases.get(request_id)
        return None if lease is None else lease[1]

    def expired(self, now: float, grace: float) -> list[tuple[int, str]]:
        """(request, replica) of every lease past `deadline + grace`, by request id (the
        order they were granted in); without a scan of the table (`Deadlines`)."""
        due = self._heap.due(lambda d: now > d + grace, self.deadline)
        return [(r, self._leases[r][0]) for r in sorted(due)]

    def scan_expired(self, now: float, grace: float) -> list[tuple[int, str]]:
        """What `expired` returns, by a scan of every lease (the reference it is tested
        and benchmarked against)."""
        return sorted((r, rid) for r, (rid, d) in self._leases.items() if now > d + grace)

    def drop_replica(self, replica_id: str) -> None:
        """Forget the leases of a replica whose plans are gone with its cache."""
        self._leases = {r: v for r, v in self._leases.items() if v[0] != replica_id}

    def of_replica(self, replica_id: str) -> list[list[float]]:
        """[request, deadline] pairs of one replica (for snapshots)."""
        return [[r, d] for r, (rid, d) in self._leases.items() if rid == replica_id]

    def clear(self) -> None:
        self._leases = {}
        self._heap.clear()
