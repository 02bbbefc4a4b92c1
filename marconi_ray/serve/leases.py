"""`LeaseTable`: the deadlines of the coordinator's open plans.

A plan holds its hit (a locked tree node, a byte reservation) under a lease: granted when
the request is planned, renewed by the heartbeats of the replica that runs or queues it,
released at its commit or abort. A lease past its deadline plus a grace is expired: the
coordinator aborts the plan, so a request whose replica or ingress died never pins
states forever.

Invariant: the table holds exactly the coordinator's open plans, each under the replica
it was planned on (`CacheCoordinator` grants and releases in the same calls that open
and close plans; the coordinator tests check `len(table)` against open requests).
"""

from __future__ import annotations

from collections.abc import Iterable


class LeaseTable:
    """request id -> (replica id, deadline in wall-clock seconds)."""

    def __init__(self) -> None:
        self._leases: dict[int, tuple[str, float]] = {}

    def __len__(self) -> int:
        return len(self._leases)

    def grant(self, request_id: int, replica_id: str, deadline: float) -> None:
        self._leases[request_id] = (replica_id, deadline)

    def release(self, request_id: int) -> None:
        self._leases.pop(request_id, None)

    def renew(self, replica_id: str, live: Iterable[int], deadline: float) -> None:
        """Extend the leases of `live` requests held on `replica_id` (others are ignored:
        a replica cannot renew what it was not planned)."""
        for request in live:
            lease = self._leases.get(request)
            if lease is not None and lease[0] == replica_id:
                self._leases[request] = (replica_id, deadline)

    def renew_all(self, deadline: float) -> None:
        """A fresh deadline for every lease (after a restart, when deadlines are stale)."""
        self._leases = {r: (rid, deadline) for r, (rid, _) in self._leases.items()}

    def expired(self, now: float, grace: float) -> list[tuple[int, str]]:
        """(request, replica) of every lease past `deadline + grace`."""
        return [(r, rid) for r, (rid, d) in self._leases.items() if now > d + grace]

    def drop_replica(self, replica_id: str) -> None:
        """Forget the leases of a replica whose plans are gone with its cache."""
        self._leases = {r: v for r, v in self._leases.items() if v[0] != replica_id}

    def of_replica(self, replica_id: str) -> list[list[float]]:
        """[request, deadline] pairs of one replica (for snapshots)."""
        return [[r, d] for r, (rid, d) in self._leases.items() if rid == replica_id]

    def clear(self) -> None:
        self._leases = {}
