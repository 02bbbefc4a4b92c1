"""`RouteState`: what routing reads besides the trees, kept in step with `CacheState` by
its one `apply` (so live operations and journal replay run the same code).

It sees the coordinator's state only through `Fleet` (each replica's planner and
`ReplicaStatus`), which `CacheState` is; it never imports `cache_state`.

It holds the `RoutingIndex` (every replica's states in one trie), the `ReplicaTable`
(open requests and confirmed flags by registration slot) and the replicas' silence
deadlines (`leases.Deadlines` over `ReplicaInfo.last_seen`).

`follow(fleet, op, run)` applies an operation through `run` with its hook around it:
- `Register`: a table row, no index entries, a silence entry;
- `Unregister`: its row and index entries go;
- `Plan`, `Pin`, `Import`, `Abort`: the state ids the returned `Release` lists leave
  the index (what planning evicted; what the abort freed);
- `Commit`: the release's state ids leave the index, then every state the request stored
  that the release does not free enters it at the depth it was taken (the states the
  commit admitted or refilled, or a failed commit kept; no tree walk);
- every operation: the replica's open requests in the table.
`rebuild` makes all of it again from the fleet (after `CacheState.restore`); `check`
compares it with a full scan of the fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from marconi_ray.protocol.ops import Abort, Commit, Import, Op, Pin, Plan, Register, Unregister
from marconi_ray.protocol.orders import Finished, Release
from marconi_ray.protocol.planner import Planner
from marconi_ray.serve.coordinator.leases import Deadlines
from marconi_ray.serve.coordinator.routing.prefix_index import RoutingIndex, tree_states
from marconi_ray.serve.coordinator.routing.replica_table import ReplicaTable


class ReplicaStatus(Protocol):
    """What routing reads of a registered replica besides its planner
    (`cache_state.ReplicaInfo` is one)."""

    @property
    def confirmed(self) -> bool: ...

    @property
    def last_seen(self) -> float: ...


class Fleet(Protocol):
    """What the routing state reads of the coordinator's state (`CacheState` is one): the
    planner and the status of every registered replica, in registration order."""

    @property
    def planners(self) -> Mapping[str, Planner]: ...

    @property
    def replicas(self) -> Mapping[str, ReplicaStatus]: ...


Run = Callable[[Any], Any]
Hook = Callable[[Fleet, Any, Run], Any]


class RouteState:
    """The index, the table and the silence deadlines (see the module docstring)."""

    def __init__(self) -> None:
        self.index = RoutingIndex()
        self.table = ReplicaTable()
        self._silence: Deadlines[str] = Deadlines()
        self._hooks: dict[type, Hook] = {
            Register: self._register,
            Unregister: self._unregister,
            Plan: self._plan,
            Commit: self._commit,
            Abort: self._abort,
            Pin: self._plan,
            Import: self._plan,
        }

    # ------------------------------------------------------------------ operations
    def follow(self, fleet: Fleet, op: Op, run: Run) -> Any:
        """`run(op)` with `op`'s hook around it; returns what `run` returns. The hooks read
        `fleet` after (and, for a commit, before) `run` changes it."""
        hook = self._hooks.get(type(op))
        result = run(op) if hook is None else hook(fleet, op, run)
        planner = fleet.planners.get(op.replica)
        if planner is not None:
            self.table.set_open(op.replica, planner.open_requests)
        return result

    def _register(self, fleet: Fleet, op: Register, run: Run) -> Any:
        result = run(op)
        info = fleet.replicas[op.replica]
        self.index.drop_replica(op.replica)
        self.table.add(op.replica, info.confirmed)
        self._silence.push(op.replica, info.last_seen)
        return result

    def _unregister(self, fleet: Fleet, op: Unregister, run: Run) -> Any:
        result = run(op)
        self.table.remove(op.replica)
        self.index.drop_replica(op.replica)
        return result

    def _plan(self, fleet: Fleet, op: Plan | Pin, run: Run) -> Any:
        planned = run(op)
        self.index.remove(op.replica, planned.release.states)
        return planned

    def _abort(self, fleet: Fleet, op: Abort, run: Run) -> Any:
        release: Release = run(op)
        self.index.remove(op.replica, release.states)
        return release

    def _commit(self, fleet: Fleet, op: Commit, run: Run) -> Any:
        planner = fleet.planners.get(op.replica)
        prompt = None if planner is None else planner.prompt_of(op.done.request_id)
        release: Release = run(op)
        self.index.remove(op.replica, release.states)
        if prompt is not None and op.replica in fleet.planners:
            self._index_kept(op.replica, prompt, op.done, release)
        return release

    def _index_kept(
        self, replica: str, prompt: np.ndarray, done: Finished, release: Release
    ) -> None:
        """Index the states of `done` the tree kept: every one it stored but those the
        commit's release frees (rejected, superseded, unused; on a failed commit, all
        but those the tree took). No tree walk: a state's depth is where it was taken."""
        index, freed = self.index, set(release.states)
        new = [
            (depth, sid)
            for depth, sid in sorted(done.state_ids.items())
            if sid not in freed and (replica, sid) not in index
        ]
        if new:
            tokens = np.asarray(done.tokens, dtype=np.int32)
            full = np.concatenate([prompt, tokens]) if len(tokens) else prompt
            index.insert_path(replica, full, new)

    # ------------------------------------------------------------------ replicas
    def set_confirmed(self, replica_id: str, confirmed: bool) -> None:
        self.table.set_confirmed(replica_id, confirmed)

    def silent(
        self, replicas: Mapping[str, ReplicaStatus], now: float, lease_s: float
    ) -> list[str]:
        """Replicas not heard from for more than `lease_s` (`now - last_seen > lease_s`),
        in registration order; without a scan of every replica. (`last_seen` only moves
        forward but at a restore; a wall clock stepping back delays a drop by the step.)"""

        def last_seen(rid: str) -> float | None:
            info = replicas.get(rid)
            return None if info is None else info.last_seen

        due = self._silence.due(lambda seen: now - seen > lease_s, last_seen)
        return sorted(due, key=self.table.slot)

    # ------------------------------------------------------------------ whole state
    def rebuild(self, fleet: Fleet) -> None:
        """Make the index, table and deadlines again from `fleet`."""
        self.clear()
        for rid, planner in fleet.planners.items():
            info = fleet.replicas[rid]
            self.table.add(rid, info.confirmed, planner.open_requests)
            self.index.add_tree(rid, planner.cache.tree)
            self._silence.push(rid, info.last_seen)

    def clear(self) -> None:
        self.index.clear()
        self.table.clear()
        self._silence.clear()

    def check(self, fleet: Fleet) -> None:
        """Full-scan check against `fleet`; AssertionError on a violation: the table's
        rows are the replicas in registration order with their open requests and
        confirmed flags, and the index holds exactly the (replica, state id, path) of
        every state in the trees."""
        rows = [
            (rid, planner.open_requests, fleet.replicas[rid].confirmed)
            for rid, planner in fleet.planners.items()
        ]
        assert list(self.table.rows()) == rows, (list(self.table.rows()), rows)
        self.index.check()
        want = {
            (rid, sid, path)
            for rid, planner in fleet.planners.items()
            for sid, path in tree_states(planner.cache.tree)
        }
        have = set(self.index.entries())
        assert have == want, (
            f"routing index: {len(have - want)} stale entries, {len(want - have)} missing"
        )
