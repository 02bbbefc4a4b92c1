"""`CacheState`: what the coordinator's journal rebuilds, and the one `apply(op)` that
changes it, live and in replay.

The state is one `Planner` (prefix cache + bootstrap tuner) per registered replica, what
the coordinator knows of each replica (`ReplicaInfo`), the lease table, the next
request id, and each replica's release log (`logs`). Every change goes through `apply`
with a typed operation (`protocol.ops`); the coordinator journals the operation after
applying it, and a restarted coordinator applies the same operations to the last
snapshot (`to_record`/`from_record`), so both paths run the same code.

Exactly once: the release of every journalled plan, commit and abort (what it evicted,
moved or let go of) is appended to its replica's `ReleaseLog` (`protocol.release_log`),
which the replica applies in seq order, each entry once, whoever carries it. A plan's
release is in the log whether or not its dispatch ever starts, so nobody has to guess
which: the coordinator never frees anything "on behalf" of a dispatch. Replaying the
journal appends the same entries under the same seqs (the ops are the same), so the
log survives a restart; acknowledgements are not journalled (a snapshot keeps the last
one), so a restarted coordinator may send entries again, which the replica skips.

Invariants (checked by `check_invariants`): one lease per open plan; every replica with a
planner has its info and its log, and vice versa; each cache's radix tree is well formed
and `bytes_used + reserved <= capacity`; each log's seqs are consecutive.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.invariants import check_cache_tiers
from marconi_ray.core.cache.tuner import TuneJob
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.window_term import WindowTerm
from marconi_ray.core.wire import decode_array, encode_array
from marconi_ray.protocol.ops import (
    Abort,
    Adopt,
    Commit,
    Import,
    Op,
    Pin,
    Plan,
    Register,
    Unregister,
)
from marconi_ray.protocol.orders import Finished, Move, PrefillOrder, Release
from marconi_ray.protocol.planner import Planner
from marconi_ray.protocol.release_log import LogEntry, ReleaseLog
from marconi_ray.serve.coordinator.leases import LeaseTable
from marconi_ray.serve.coordinator.routing.state import RouteState
from marconi_ray.serve.disagg import assign_role, rebalance_roles
from marconi_ray.serve.settings import ServeSettings

log = logging.getLogger(__name__)

SendJob = Callable[[str, TuneJob], None]


@dataclass
class ReplicaInfo:
    """What the coordinator knows of one registered replica besides its planner.

    `confirmed`: its store matches its tree (a replica restored from the journal is not,
    until it reconciles, and gets no traffic); set it with `CacheState.set_confirmed`
    (routing reads a copy). `last_seen`: its last heartbeat. `role`: `mixed`, `prefill`
    or `decode`, given at registration (`serve.disagg.assign_role`; a replay of the same
    registrations gives the same roles).
    """

    kv_bytes_per_token: int
    state_bytes: int
    generation: int
    confirmed: bool
    last_seen: float
    role: str = "mixed"


@dataclass(frozen=True)
class Planned:
    """The result of applying a `Plan`: the order for the replica, what planning evicted
    or moved (logged: the replica applies it), the lease deadline, and `needs`: the
    replica's log seq up to which the store must have applied before the order starts."""

    order: PrefillOrder
    release: Release
    deadline: float
    needs: int


@dataclass(frozen=True)
class Held:
    """The result of applying a `Pin` or an `Import`: `depth` (a pin: the entry's depth,
    0 when the replica holds none; an import: the receiver's own hit, where the copied KV
    starts), `state_id` (a pin: the entry's state; an import: -1), `slots` (the KV slots
    of the tokens up to `depth`), what planning evicted or moved (logged), the lease
    deadline, and the log seq the replica's store must have applied first."""

    depth: int
    state_id: int
    slots: npt.NDArray[np.int64]
    release: Release
    deadline: float
    needs: int


class CacheState:
    """The journalled state of the coordinator (see the module docstring).

    Args:
        settings: the deployment (system, cache sizes per tier, alpha, tuner, lease_s).
        flops: (linear, quadratic) prefill FLOP coefficients of the model.
        windows: its sliding-window attention FLOP terms (`ModelSpec.window_terms`).
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
        windows: tuple[WindowTerm, ...] = (),
    ) -> None:
        self.settings = settings
        self.flops = flops
        self.windows = windows
        self.max_position = max_position
        self.clock = clock
        self._send_job = send_job
        self.planners: dict[str, Planner] = {}
        self.replicas: dict[str, ReplicaInfo] = {}
        self.leases = LeaseTable()
        self.routing = RouteState()
        self.logs: dict[str, ReleaseLog] = {}
        self.next_request = 0
        self.replaying = False
        self._handlers: dict[type, Callable[[Any], Any]] = {
            Register: self._register,
            Unregister: self._unregister,
            Plan: self._plan,
            Commit: self._commit,
            Abort: self._abort,
            Adopt: self._adopt,
            Pin: self._pin,
            Import: self._import,
        }

    # ------------------------------------------------------------------ apply
    def apply(self, op: Op) -> Any:
        """Apply one operation: `Plan` -> `Planned`, `Commit`/`Abort` -> `Release`,
        `Adopt` -> whether the replica took it, others -> None. The routing state
        follows every operation (`serve.coordinator.routing.state`)."""
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
            windows=self.windows,
        )
        taken = (info.role for rid, info in self.replicas.items() if rid != op.replica)
        self.replicas[op.replica] = ReplicaInfo(
            op.kv_bytes_per_token,
            op.state_bytes,
            op.generation,
            True,
            self.clock(),
            assign_role(s.disagg, taken),
        )
        self.logs[op.replica] = ReleaseLog(op.generation)

    def _unregister(self, op: Unregister) -> None:
        self.planners.pop(op.replica, None)
        self.replicas.pop(op.replica, None)
        self.logs.pop(op.replica, None)
        self.leases.drop_replica(op.replica)
        roles = [(rid, info.role) for rid, info in self.replicas.items()]
        for rid, role in rebalance_roles(self.settings.disagg, roles).items():
            log.warning("replica %s takes the %s role (replica %s left)", rid, role, op.replica)
            self.replicas[rid].role = role

    def _plan(self, op: Plan) -> Planned:
        order, release = self.planners[op.replica].order(
            op.request, op.prompt, op.params, op.submitted
        )
        deadline = self.clock() + self.settings.lease_s
        self.leases.grant(op.request, op.replica, deadline)
        needs = self.logs[op.replica].append(release)
        self.next_request = max(self.next_request, op.request + 1)
        return Planned(order, release, deadline, needs)

    def _pin(self, op: Pin) -> Held:
        planner = self.planners[op.replica]
        depth, state_id, slots = planner.pin(op.request, op.tokens)
        return self._held(op, depth, state_id, slots, planner.pin_release(op.request))

    def _import(self, op: Import) -> Held:
        hit, slots, release = self.planners[op.replica].plan_import(op.request, op.tokens)
        return self._held(op, hit, -1, slots, release)

    def _held(
        self, op: Pin, depth: int, state_id: int, slots: npt.NDArray[np.int64], release: Release
    ) -> Held:
        deadline = self.clock() + self.settings.lease_s
        self.leases.grant(op.request, op.replica, deadline)
        needs = self.logs[op.replica].append(release)
        self.next_request = max(self.next_request, op.request + 1)
        return Held(depth, state_id, slots, release, deadline, needs)

    def _commit(self, op: Commit) -> Release:
        planner = self.planners[op.replica]
        self.leases.release(op.done.request_id)
        try:
            release = planner.commit(op.done)
        except (RuntimeError, ValueError) as exc:
            log.warning(
                "commit of request %d on replica %s refused (%s): aborted, nothing cached",
                op.done.request_id,
                op.replica,
                exc,
            )
            release = planner.abort(op.done.request_id, op.done)
        release = release.settling(op.done.request_id, True)
        self.logs[op.replica].append(release)
        return release

    def _abort(self, op: Abort) -> Release:
        """Close a plan: its release is logged. An abort of a request that holds no plan
        (never journalled) only returns what it stored, for the caller to free directly."""
        self.leases.release(op.request)
        planner = self.planners[op.replica]
        planned = planner.is_planned(op.request)
        release = planner.abort(op.request, op.done)
        if planned:
            release = release.settling(op.request, op.done is not None)
            self.logs[op.replica].append(release)
        return release

    def _adopt(self, op: Adopt) -> bool:
        planner = self.planners.get(op.replica)
        if planner is None or planner.tuner is None or not planner.tuner.expects(op.result):
            return False
        planner.adopt(op.result)
        return True

    def log_of(self, replica_id: str) -> ReleaseLog:
        """The release log of a registered replica's current generation."""
        return self.logs[replica_id]

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
        assert set(self.planners) == set(self.logs), (set(self.planners), set(self.logs))
        assert len(self.leases) == sum(p.open_requests for p in self.planners.values())
        for rid, release_log in self.logs.items():
            assert release_log.generation == self.replicas[rid].generation, rid
            release_log.check()
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
                    "role": info.role,
                    "planner": self.planners[rid].to_record(),
                    "leases": self.leases.of_replica(rid),
                    "log": {
                        "acked": self.logs[rid].acked,
                        "entries": [
                            [e.seq, *_release_record(e.release)] for e in self.logs[rid].entries()
                        ],
                    },
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
                str(entry.get("role", "mixed")),  # older snapshots: mixed replicas
            )
            for request, deadline in entry["leases"]:
                self.leases.grant(int(request), rid, float(deadline))
            log_record = entry.get("log") or {"acked": 0, "entries": []}  # older: none
            release_log = ReleaseLog(int(entry["generation"]), int(log_record["acked"]))
            release_log.restore(
                LogEntry(int(seq), _release_from(rest, f"log entry {seq} of replica {rid}"))
                for seq, *rest in log_record["entries"]
            )
            self.logs[rid] = release_log
        self.routing.rebuild(self)

    def clear(self) -> None:
        """No replicas, no leases (the request counter is kept)."""
        self.planners, self.replicas = {}, {}
        self.leases.clear()
        self.routing.clear()
        self.logs = {}


def _release_record(release: Release) -> list[Any]:
    """[states, slots, moves, settled] of a release (`core.wire` conventions)."""
    return [
        [int(x) for x in release.states],
        encode_array(release.slots, "<i8"),
        [
            [m.to_host, [int(x) for x in m.states], encode_array(m.slots, "<i8")]
            for m in release.moves
        ],
        [[int(rid), bool(taken)] for rid, taken in release.settled],
    ]


def _release_from(record: list[Any], where: str) -> Release:
    """The release of a `_release_record` list (one of a snapshot written before
    `settled` existed has three items); ValueError naming `where` if malformed."""
    try:
        states, slots, moves, *rest = record
        (settled,) = rest or ([],)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected [states, slots, moves, settled]") from None
    return Release(
        tuple(int(s) for s in states),
        decode_array(slots, "<i8", where),
        tuple(
            Move(bool(to_host), tuple(int(x) for x in ids), decode_array(ms, "<i8", where))
            for to_host, ids, ms in moves
        ),
        tuple((int(rid), bool(taken)) for rid, taken in settled),
    )
