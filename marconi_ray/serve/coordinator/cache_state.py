"""`CacheState`: what the coordinator's journal rebuilds, and the one `apply(op)` that
changes it, live and in replay.

The state is one `Planner` (prefix cache + bootstrap tuner) per registered replica, what
the coordinator knows of each replica (`ReplicaInfo`), the lease table, the next
request id, and what each open plan's dispatch carries to free (`carried`). Every
change goes through `apply` with a typed operation (`protocol.ops`); the coordinator
journals the operation after applying it, and a
restarted coordinator applies the same operations to the last snapshot
(`to_record`/`from_record`), so both paths run the same code.

Who frees a plan's evictions (`Planned.release`, carried by its dispatch): the replica,
when it starts the order; otherwise the coordinator, when the plan ends without a start
(lease expiry, abandon, an abort the replica sends for a dispatch it never started).
`carried` holds the release of every open plan whose start the coordinator has not
heard of; `mark_started` (heartbeats, and aborts of started requests) takes it out,
and an `Abort` of a plan still in it returns that release with the plan's own, so it is
freed exactly once whoever closes the plan. A commit takes it out (the request ran).

Invariants (checked by `check_invariants`): one lease per open plan; every replica with a
planner has its info and vice versa; each cache's radix tree is well formed and
`bytes_used + reserved <= capacity`; `carried` names open plans only.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.invariants import check_cache_tiers
from marconi_ray.core.tuner import TuneJob
from marconi_ray.core.wire import decode_array, encode_array
from marconi_ray.protocol.ops import Abort, Adopt, Commit, Op, Plan, Register, Unregister
from marconi_ray.protocol.orders import Finished, Move, PrefillOrder, Release
from marconi_ray.protocol.planner import Planner
from marconi_ray.serve.coordinator.leases import LeaseTable
from marconi_ray.serve.coordinator.route_state import RouteState
from marconi_ray.serve.settings import ServeSettings

log = logging.getLogger(__name__)

SendJob = Callable[[str, TuneJob], None]


@dataclass
class ReplicaInfo:
    """What the coordinator knows of one registered replica besides its planner.

    `confirmed`: its store matches its tree (a replica restored from the journal is not,
    until it reconciles, and gets no traffic); set it with `CacheState.set_confirmed`
    (routing reads a copy). `last_seen`: its last heartbeat.
    """

    kv_bytes_per_token: int
    state_bytes: int
    generation: int
    confirmed: bool
    last_seen: float


@dataclass(frozen=True)
class Planned:
    """The result of applying a `Plan`: the order for the replica, what planning evicted
    (the replica must free it), and the lease deadline."""

    order: PrefillOrder
    release: Release
    deadline: float


class CacheState:
    """The journalled state of the coordinator (see the module docstring).

    Args:
        settings: the deployment (system, cache sizes per tier, alpha, tuner, lease_s).
        flops: (linear, quadratic) prefill FLOP coefficients of the model.
        max_position: the model's context limit.
        clock: wall-clock seconds (lease deadlines).
        send_job: called with (replica id, job) when a replica's tuner wants a grid
            search; never during replay (`replaying`).
    """

    def __init__(
        self,
        settings: ServeSettings,
        flops: tuple[float, float],
        max_position: int,
        clock: Callable[[], float],
        send_job: SendJob,
    ) -> None:
        self.settings = settings
        self.flops = flops
        self.max_position = max_position
        self.clock = clock
        self._send_job = send_job
        self.planners: dict[str, Planner] = {}
        self.replicas: dict[str, ReplicaInfo] = {}
        self.leases = LeaseTable()
        self.routing = RouteState()
        self.carried: dict[int, tuple[str, Release]] = {}
        self.next_request = 0
        self.replaying = False
        self._handlers: dict[type, Callable[[Any], Any]] = {
            Register: self._register,
            Unregister: self._unregister,
            Plan: self._plan,
            Commit: self._commit,
            Abort: self._abort,
            Adopt: self._adopt,
        }

    # ------------------------------------------------------------------ apply
    def apply(self, op: Op) -> Any:
        """Apply one operation: `Plan` -> `Planned`, `Commit`/`Abort` -> `Release`,
        `Adopt` -> whether the replica took it, others -> None. The routing state
        follows every operation (`serve.coordinator.route_state`)."""
        return self.routing.follow(self, op, self._handlers[type(op)])

    def set_confirmed(self, replica_id: str, confirmed: bool) -> None:
        """Whether a registered replica gets traffic (its `ReplicaInfo.confirmed`)."""
        self.replicas[replica_id].confirmed = confirmed
        self.routing.set_confirmed(replica_id, confirmed)

    def _on_job(self, replica_id: str, job: TuneJob) -> None:
        """Hand a finished window to the tuner. Never raises: the hand-off must not touch
        the commit it follows (a job that could not be sent is sent again later, see
        `CacheCoordinator.resend_jobs`)."""
        if self.replaying:
            return
        try:
            self._send_job(replica_id, job)
        except Exception:
            log.exception("sending replica %s's tuning job failed: it is sent again", replica_id)

    def _register(self, op: Register) -> None:
        s = self.settings
        self.planners[op.replica] = Planner.for_system(
            s.system,
            self.flops,
            op.kv_bytes_per_token,
            op.state_bytes,
            s.cache_bytes,
            self.max_position,
            s.alpha,
            s.tuner,
            on_tune_job=functools.partial(self._on_job, op.replica),
            host=s.host_tier,
        )
        self.replicas[op.replica] = ReplicaInfo(
            op.kv_bytes_per_token, op.state_bytes, op.generation, True, self.clock()
        )

    def _unregister(self, op: Unregister) -> None:
        self.planners.pop(op.replica, None)
        self.replicas.pop(op.replica, None)
        self.leases.drop_replica(op.replica)
        self.carried = {r: c for r, c in self.carried.items() if c[0] != op.replica}

    def _plan(self, op: Plan) -> Planned:
        order, release = self.planners[op.replica].order(
            op.request, op.prompt, op.params, op.submitted
        )
        deadline = self.clock() + self.settings.lease_s
        self.leases.grant(op.request, op.replica, deadline)
        if len(release.states) or len(release.slots):
            self.carried[op.request] = (op.replica, release)
        self.next_request = max(self.next_request, op.request + 1)
        return Planned(order, release, deadline)

    def _commit(self, op: Commit) -> Release:
        planner = self.planners[op.replica]
        self.leases.release(op.done.request_id)
        self.carried.pop(op.done.request_id, None)  # it ran: the replica freed it
        try:
            return planner.commit(op.done)
        except (RuntimeError, ValueError) as exc:
            log.warning(
                "commit of request %d on replica %s refused (%s): aborted, nothing cached",
                op.done.request_id,
                op.replica,
                exc,
            )
            return planner.abort(op.done.request_id, op.done)

    def _abort(self, op: Abort) -> Release:
        self.leases.release(op.request)
        release = self.planners[op.replica].abort(op.request, op.done)
        carried = self.carried.pop(op.request, None)
        return release if carried is None else release + carried[1]

    def _adopt(self, op: Adopt) -> bool:
        planner = self.planners.get(op.replica)
        if planner is None or planner.tuner is None or not planner.tuner.expects(op.result):
            return False
        planner.adopt(op.result)
        return True

    def mark_started(self, replica_id: str, requests: list[int]) -> None:
        """The replica started these requests' orders (and freed what their dispatches
        carried): nothing is left for the coordinator to free on their behalf."""
        for request in requests:
            carried = self.carried.get(request)
            if carried is not None and carried[0] == replica_id:
                del self.carried[request]

    def carried_by(self, replica_id: str) -> Release:
        """What the dispatches of a replica's open, unstarted plans carry (its store holds
        it until the replica starts them or the coordinator frees it for them)."""
        release = Release()
        for rid, carried in self.carried.values():
            if rid == replica_id:
                release = release + carried
        return release

    # ------------------------------------------------------------------ queries
    def is_planned(self, replica_id: str, request_id: int) -> bool:
        planner = self.planners.get(replica_id)
        return planner is not None and planner.is_planned(request_id)

    def orphan_release(self, replica_id: str, done: Finished) -> Release:
        """What a request this state no longer plans stored, less what a tree refers to."""
        if replica_id not in self.planners:
            return done.stored()
        states, slots = self.planners[replica_id].cache.referenced()
        return done.stored().without(states, slots)

    def node_count(self) -> int:
        return sum(p.cache.node_count() for p in self.planners.values())

    def cost(self, replica_id: str) -> CostModel:
        return self.planners[replica_id].cache.cost

    def check_invariants(self) -> int:
        """Full-scan check (see the module docstring), and of the routing state against
        the trees and replicas (`RouteState.check`); AssertionError on a violation.
        Returns the number of nodes checked."""
        assert set(self.planners) == set(self.replicas), (set(self.planners), set(self.replicas))
        assert len(self.leases) == sum(p.open_requests for p in self.planners.values())
        for request, (rid, _) in self.carried.items():
            assert self.is_planned(rid, request), (request, rid)
        for planner in self.planners.values():
            check_cache_tiers(planner.cache)
        self.routing.check(self)
        return self.node_count()

    # ------------------------------------------------------------------ records
    def to_record(self) -> dict[str, Any]:
        """The state as a plain structure (`core.wire` conventions) for a snapshot."""
        return {
            "next_request": self.next_request,
            "replicas": [
                {
                    "id": rid,
                    "kv_bytes_per_token": info.kv_bytes_per_token,
                    "state_bytes": info.state_bytes,
                    "generation": info.generation,
                    "planner": self.planners[rid].to_record(),
                    "leases": self.leases.of_replica(rid),
                    "carried": [
                        [
                            request,
                            [int(x) for x in c.states],
                            encode_array(c.slots, "<i8"),
                            [
                                [
                                    m.to_host,
                                    [int(x) for x in m.states],
                                    encode_array(m.slots, "<i8"),
                                ]
                                for m in c.moves
                            ],
                        ]
                        for request, (owner, c) in self.carried.items()
                        if owner == rid
                    ],
                }
                for rid, info in self.replicas.items()
            ],
        }

    def restore(self, record: Mapping[str, Any]) -> None:
        """Replace the state with a `to_record` structure; replicas come back unconfirmed.
        ValueError / KeyError when it is malformed."""
        self.clear()
        self.next_request = int(record["next_request"])
        for entry in record["replicas"]:
            rid = str(entry["id"])
            self.planners[rid] = Planner.from_record(
                entry["planner"], on_tune_job=functools.partial(self._on_job, rid)
            )
            self.replicas[rid] = ReplicaInfo(
                int(entry["kv_bytes_per_token"]),
                int(entry["state_bytes"]),
                int(entry["generation"]),
                False,
                0.0,
            )
            for request, deadline in entry["leases"]:
                self.leases.grant(int(request), rid, float(deadline))
            for request, states, slots, *tiers in entry.get("carried", []):  # older: no key
                where = f"carried of request {request}"
                kv = decode_array(slots, "<i8", where)
                moves = tuple(
                    Move(bool(to_host), tuple(int(x) for x in ids), decode_array(ms, "<i8", where))
                    for to_host, ids, ms in (tiers[0] if tiers else ())  # older: no moves
                )
                self.carried[int(request)] = (
                    rid,
                    Release(tuple(int(s) for s in states), kv, moves),
                )
        self.routing.rebuild(self)

    def clear(self) -> None:
        """No replicas, no leases (the request counter is kept)."""
        self.planners, self.replicas = {}, {}
        self.leases.clear()
        self.routing.clear()
        self.carried = {}
