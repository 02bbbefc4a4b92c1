"""Choosing the replica of a request: who may take it, then the router's pick.

A replica may take a request when it is confirmed and, with `max_queued_requests >= 0`,
holds fewer than `max_batch + max_queued_requests` open requests. None confirmed is
`NoReplicaAvailable`; all confirmed but full is `Overloaded`.

`choose_replica` is what the coordinator runs: the eligible replicas are a mask over the
`ReplicaTable`'s columns, the routing index names those that may hold a usable hit, and
the router `pick`s from the named ones and the least loaded of the others (see
`routers`); its cost grows with the replicas the prompt's path touches, not with all
replicas. `choose_replica_reference` is the former way, kept as the reference the
tests and `benchmarks/bench_cluster.py` compare it with: the view of every eligible
replica (a walk of each tree) and the router's `route`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
import numpy.typing as npt

from marconi_ray.protocol.planner import Planner
from marconi_ray.serve.coordinator.routing.prefix_index import RoutingIndex
from marconi_ray.serve.coordinator.routing.replica_table import Mask, ReplicaTable
from marconi_ray.serve.coordinator.routing.routers import Contender, Router
from marconi_ray.serve.coordinator.routing.state import Fleet, RouteState
from marconi_ray.serve.messages import NoReplicaAvailable, Overloaded, ReplicasUnconfirmed
from marconi_ray.serve.settings import ServeSettings


class RoutedFleet(Fleet, Protocol):
    """A `Fleet` with the `RouteState` that follows it (`CacheState` is one)."""

    @property
    def routing(self) -> RouteState: ...


def max_open(settings: ServeSettings) -> int | None:
    """Open requests a replica must stay under to take one more (None: no limit)."""
    if settings.max_queued_requests < 0:
        return None
    return settings.max_batch + settings.max_queued_requests


def _overloaded(settings: ServeSettings, confirmed: int) -> Overloaded:
    return Overloaded(
        f"all {confirmed} replicas are full ({settings.max_batch} running + "
        f"{settings.max_queued_requests} queued requests each); retry later"
    )


class IndexedEligible:
    """`routers.Eligible` over a `ReplicaTable` mask and a `RoutingIndex` walk (the walk
    and the shortlist are made on first use)."""

    def __init__(
        self,
        table: ReplicaTable,
        mask: Mask,
        count: int,
        index: RoutingIndex,
        planners: Mapping[str, Planner],
        prompt: npt.NDArray[np.int32],
    ) -> None:
        self._table, self._mask, self._count, self._index = table, mask, count, index
        self._planners, self._prompt = planners, prompt

    def __len__(self) -> int:
        return self._count

    def nth(self, k: int) -> str:
        return self._table.id_at(int(np.flatnonzero(self._mask)[k]))

    def shortlist(self) -> list[Contender]:
        table, mask = self._table, self._mask
        if self._count == 1:  # the only one: its exact view, no walk of the index
            slot = int(mask.argmax())
            rid = table.id_at(slot)
            return [Contender(rid, self._planners[rid].cache, int(table.open[slot]), True)]
        named = sorted(s for s in map(table.slot, self._index.candidates(self._prompt)) if mask[s])
        cold = table.least_loaded(mask, named)
        slots = named if cold is None else sorted([*named, cold])
        out = []
        for slot in slots:
            rid = table.id_at(slot)
            cache = self._planners[rid].cache
            out.append(Contender(rid, cache, int(table.open[slot]), slot != cold))
        return out


def choose_replica(
    state: RoutedFleet,
    router: Router,
    settings: ServeSettings,
    prompt: npt.NDArray[np.int32],
    only: Callable[[str], bool] | None = None,
) -> str:
    """The replica `router` picks for `prompt` among those that may take it (module
    docstring), from the routing index and table: what `choose_replica_reference`
    returns, without a walk of every replica's tree. `only`: a further condition on the
    replica id (a role), checked for every eligible replica."""
    table = state.routing.table
    confirmed = table.confirmed_count()
    if not confirmed:
        raise _no_replica(state.planners)
    mask = table.eligible(max_open(settings))
    if only is not None:
        for slot in np.flatnonzero(mask):
            mask[slot] = only(table.id_at(int(slot)))
    count = int(np.count_nonzero(mask))
    if not count:
        raise _overloaded(settings, confirmed)
    routing = state.routing
    eligible = IndexedEligible(table, mask, count, routing.index, state.planners, prompt)
    return router.pick(prompt, eligible)


def choose_replica_reference(
    state: Fleet, router: Router, settings: ServeSettings, prompt: npt.NDArray[np.int32]
) -> str:
    """The reference: `router.route` over the view of every replica that may take the
    request (one walk of each tree, a loop over every replica)."""
    candidates = [
        (rid, planner.cache, planner.open_requests)
        for rid, planner in state.planners.items()
        if state.replicas[rid].confirmed
    ]
    if not candidates:
        raise _no_replica(state.planners)
    limit = max_open(settings)
    if limit is not None:
        room = [c for c in candidates if c[2] < limit]
        if not room:
            raise _overloaded(settings, len(candidates))
        candidates = room
    return router.route(prompt, candidates)


def _no_replica(planners: Mapping[str, Planner]) -> NoReplicaAvailable:
    """Why no replica can take a request: none registered, or none confirmed yet (the
    coordinator restored them and waits for them to reconcile: `ReplicasUnconfirmed`)."""
    if planners:
        return ReplicasUnconfirmed(
            f"no model replica is confirmed yet ({len(planners)} registered, waiting for "
            "them to reconcile)"
        )
    return NoReplicaAvailable("no model replica is registered and alive")
