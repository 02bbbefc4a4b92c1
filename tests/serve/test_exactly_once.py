"""Every state and KV slot a plan evicts is freed exactly once, whoever ends the plan
(issue 20's bugs 2-4), without Ray: a real `CacheCoordinator` and a real tiny-model
`Worker` (real state ids and KV slots).

A plan's evictions travel with its dispatch. The replica frees them when it starts the
order; otherwise the coordinator does when the plan ends unstarted (lease expiry,
abandon, an abort of a dispatch the replica never started). Each test counts every id
the worker is told to free, and ends with the store holding exactly what the tree
refers to (nothing leaked).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coordinator_helpers import (
    GREEDY,
    LEASE,
    Clock,
    make_settings,
    make_worker,
    register,
    run_dispatch,
    sessions,
)

from marconi_ray.engine.factory import make_model
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import Release, StepInput, StepOutput
from marconi_ray.serve.coordinator.actor import LEASE_GRACE, CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.messages import Dispatch
from marconi_ray.serve.replica.deployment import ModelReplica


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("exactly_once") / "tiny")


class Frees:
    """Frees what the worker is told to, checking first that the store holds each id (a
    second free of a slot would put it in the free list twice: handed out twice)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.states: list[int] = []
        self.slots: list[int] = []

    def free(self, release: Release) -> None:
        held = set(np.asarray(self.worker.store.used_slots()).tolist())
        self.states += [s for s in release.states if not self.worker.store.has_state(s)]
        self.slots += [s for s in np.asarray(release.slots).tolist() if s not in held]
        kv = np.asarray(release.slots).tolist()
        self.slots += [s for s in set(kv) if kv.count(s) > 1]
        self.worker.release(release)

    def twice(self) -> tuple[list[int], list[int]]:
        """State ids and slots freed while not held."""
        return self.states, self.slots


def _evicting_plan(coord: CacheCoordinator, worker: Worker, frees: Frees) -> Dispatch:
    """Serve new prompts until one's plan evicts something; that dispatch, not run."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        dispatch = coord.plan(rng.integers(7, 263, 40).astype(np.int32), GREEDY)
        if dispatch.release.states or len(dispatch.release.slots):
            return dispatch
        (done,) = run_dispatch(worker, dispatch)
        frees.free(coord.commit(dispatch.replica_id, done))
    raise AssertionError("no plan evicted anything")


def _run(coord: CacheCoordinator, worker: Worker, frees: Frees, dispatch: Dispatch) -> None:
    """The replica starts `dispatch` (freeing what it carries), runs and commits it."""
    frees.free(dispatch.release)
    worker.start(dispatch.order)
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    frees.free(coord.commit(dispatch.replica_id, done))


def _no_leak(coord: CacheCoordinator, worker: Worker, frees: Frees) -> None:
    assert frees.twice() == ([], []), "an id was freed twice"
    states, slots = worker.holdings()
    tree_states, tree_slots = coord.planners["r0"].cache.referenced()
    assert set(states) == tree_states and set(np.asarray(slots).tolist()) == tree_slots
    coord.check_invariants()


def _setup(model_dir: Path, **kw: Any) -> tuple[CacheCoordinator, Worker, Frees, Clock]:
    clock = Clock()
    settings = make_settings(model_dir, cache_bytes=1_500_000, **kw)
    coord = CacheCoordinator(settings, journal=MemoryJournal(), clock=clock)
    worker = make_worker(model_dir)
    register(coord, worker)
    sessions(coord, worker, n=3, turns=2)
    return coord, worker, Frees(worker), clock


def test_a_dispatch_that_never_arrives_has_its_evictions_freed_at_lease_expiry(model_dir):
    """Bug 3: the ingress died (or its client left while re-planning) after the plan: the
    lease expires, and what planning evicted is queued for the replica's next drain."""
    coord, worker, frees, clock = _setup(model_dir)
    dispatch = _evicting_plan(coord, worker, frees)
    clock.now += LEASE * (1 + LEASE_GRACE) + 1
    coord.heartbeat("r0", [])
    drained = coord.drain("r0")
    assert set(dispatch.release.states) <= set(drained.states)
    assert set(np.asarray(dispatch.release.slots).tolist()) <= set(drained.slots.tolist())
    frees.free(drained)
    _no_leak(coord, worker, frees)


def test_a_started_request_whose_lease_expires_is_not_freed_twice(model_dir):
    """The replica started the order (freed what it carried) and said so in a heartbeat;
    its lease then expires (the replica went quiet): nothing it carried is queued again."""
    coord, worker, frees, clock = _setup(model_dir)
    dispatch = _evicting_plan(coord, worker, frees)
    frees.free(dispatch.release)
    worker.start(dispatch.order)
    rid = dispatch.order.request_id
    coord.heartbeat("r0", [rid], [rid])
    clock.now += LEASE * (1 + LEASE_GRACE) + 1
    coord.heartbeat("r0", [])
    frees.free(coord.drain("r0"))
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    frees.free(coord.commit("r0", done))  # an orphan commit now: frees what it stored
    _no_leak(coord, worker, frees)


def test_abandon_after_expiry_and_a_repeated_abandon_free_nothing_twice(model_dir):
    """The lease expired (its evictions queued), then the ingress abandons the same
    dispatch twice: each id is freed once."""
    coord, worker, frees, clock = _setup(model_dir)
    dispatch = _evicting_plan(coord, worker, frees)
    clock.now += LEASE * (1 + LEASE_GRACE) + 1
    coord.heartbeat("r0", [])
    coord.abandon(dispatch)
    coord.abandon(dispatch)
    frees.free(coord.drain("r0"))
    _no_leak(coord, worker, frees)


def test_reconcile_after_a_restart_skips_what_an_abandon_queued(model_dir):
    """Bug 2: a coordinator restart, then an abandon queues a dispatch's evictions, then
    the replica reconciles: reconcile does not free them too (the drain does, once)."""
    coord, worker, frees, _ = _setup(model_dir)
    dispatch = _evicting_plan(coord, worker, frees)
    restarted = CacheCoordinator(coord.settings, journal=coord.journal, clock=coord.clock)
    restarted.abandon(dispatch)
    states, slots = worker.holdings()
    _, release = restarted.reconcile("r0", states, slots)
    frees.free(release)
    frees.free(restarted.drain("r0"))
    _no_leak(restarted, worker, frees)


def test_reconcile_after_a_restart_leaves_what_an_open_dispatch_carries(model_dir):
    """A dispatch planned before a coordinator restart arrives after the replica
    reconciled: what it carries was not freed by the reconcile, the replica frees it
    when it starts the order (once), and the request commits."""
    coord, worker, frees, _ = _setup(model_dir)
    dispatch = _evicting_plan(coord, worker, frees)
    restarted = CacheCoordinator(coord.settings, journal=coord.journal, clock=coord.clock)
    states, slots = worker.holdings()
    _, release = restarted.reconcile("r0", states, slots)
    assert not set(release.states) & set(dispatch.release.states)
    frees.free(release)
    _run(restarted, worker, frees, dispatch)
    _no_leak(restarted, worker, frees)


class _Remote:
    """`obj.method.remote(*args, **kw)` -> awaitable, as a Ray actor method is called."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kw: Any) -> Any:
        async def call() -> Any:
            return self.fn(*args, **kw)

        return call()


class _CoordinatorHandle:
    """The real in-process coordinator behind actor-style method handles."""

    def __init__(self, coord: CacheCoordinator) -> None:
        self.coord = coord

    def __getattr__(self, name: str) -> _Remote:
        return _Remote(getattr(self.coord, name))


class _WorkerShards:
    """The real worker as a tp-1 shard group (the `ShardGroup` calls `_fail_all` makes)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.names: list[str] = []

    async def advance(self, step: StepInput) -> StepOutput:
        return self.worker.advance(step)

    async def call(self, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)


def _replica(coord: CacheCoordinator, worker: Worker) -> ModelReplica:
    replica = object.__new__(ModelReplica)
    replica.replica_id = "r0"
    replica.settings = coord.settings
    replica.generation = coord.replica_info["r0"].generation
    replica.shards = _WorkerShards(worker)  # type: ignore[assignment]
    replica.coordinator = _CoordinatorHandle(coord)
    replica._pending, replica._stops, replica._queues, replica._orders = [], set(), {}, {}
    replica._known, replica._cancels, replica._release = {}, set(), Release()
    return replica


def test_a_failed_step_takes_queued_dispatches_out_of_the_queue(model_dir):
    """Bug 4: `_fail_all` aborted the queued dispatches' plans but left them queued, so
    they started anyway (on a hit whose lock was released). Now they leave the queue,
    never start, and what they carried comes back from the abort and is freed once."""
    coord, worker, frees, _ = _setup(model_dir)
    dispatch = _evicting_plan(coord, worker, frees)
    replica = _replica(coord, worker)
    rid = dispatch.order.request_id
    replica._pending.append(dispatch)
    replica._orders[rid] = dispatch
    replica._queues[rid] = asyncio.Queue()

    async def fail_then_step() -> None:
        await replica._fail_all(RuntimeError("a step failed"))
        assert replica._pending == [] and rid not in replica._orders
        step = StepInput(replica._take_release(), replica._admit())
        assert step.start == (), "an aborted dispatch started"
        frees.free(step.release)
        worker.advance(StepInput())

    asyncio.run(fail_then_step())
    assert worker.num_running == 0 and not coord.state.is_planned("r0", rid)
    _no_leak(coord, worker, frees)
