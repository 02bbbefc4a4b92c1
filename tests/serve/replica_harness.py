"""A real `ModelReplica` loop in process, without Ray: its real methods (`submit_many`,
`settle`, `_step`, `_drain`, `_reconcile`, ...) driven one call at a time against a real
`CacheCoordinator` and a real tiny-model `Worker` (real state ids, KV slots and tiers),
so a test can stage any interleaving of starts, settles, abandons, lease expiries,
commits, drains and reconciles and check what each side holds after every event.

Nothing here records calls instead of making them: the handles only turn a Ray call
(`obj.method.remote(...)`) into a coroutine of the real method.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from coordinator_helpers import cursor_of

from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import StepInput, StepOutput
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.messages import Dispatch, Submissions
from marconi_ray.serve.replica.deployment import ModelReplica


class Remote:
    """`obj.method.remote(*args, **kw)` -> awaitable, as a Ray actor method is called:
    the call starts at once, whether or not its caller awaits it."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kw: Any) -> Any:
        async def call() -> Any:
            out = self.fn(*args, **kw)
            return await out if asyncio.iscoroutine(out) else out

        return asyncio.ensure_future(call())


class Handle:
    """Actor-style (or deployment-handle-style) method handles on a real object."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Remote:
        return Remote(getattr(self.target, name))


class WorkerShards:
    """The real worker as a tp-1 shard group; every refusal of its store is kept."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.names: list[str] = []
        self.info: dict[str, Any] = {}
        self.refused: list[str] = []

    async def advance(self, step: StepInput) -> StepOutput:
        out = self.worker.advance(step)
        self.refused += out.refused
        return out

    async def call(self, method: str, *args: Any) -> Any:
        if method == "release":
            refused = self.worker.apply_release(*args)
            self.refused += refused
            return refused
        return getattr(self.worker, method)(*args)

    async def rank0(self, method: str, *args: Any) -> Any:
        if method == "holdings":
            return (*self.worker.holdings(), *self.worker.host_holdings())
        return getattr(self.worker, method)(*args)

    async def alive(self) -> bool:
        return True


def make_replica(coord: CacheCoordinator, worker: Worker, rid: str = "r0") -> ModelReplica:
    """A replica named `rid` (registered at `coord`) around `worker`, its loop idle, its
    release cursor the one the tests' own `apply` moves (`cursor_of`)."""
    replica = object.__new__(ModelReplica)
    replica.replica_id = rid
    replica.settings = coord.settings
    replica.rebuilds = 0
    replica.info = {
        "kv_bytes_per_token": worker.store.kv_bytes_per_token,
        "state_bytes": worker.store.state_bytes,
    }
    replica.shards = WorkerShards(worker)  # type: ignore[assignment]
    replica.coordinator = Handle(coord)
    generation = coord.replica_info[rid].generation
    replica.init_loop(generation)
    replica._cursor = cursor_of(worker, generation)  # shared with the tests' own `apply`
    replica._ensure_loop = lambda: None  # type: ignore[method-assign]  # tests drive it
    return replica


def refused(replica: ModelReplica) -> list[str]:
    """Everything the replica's store refused so far."""
    shards: WorkerShards = replica.shards  # type: ignore[assignment]
    return shards.refused


async def submit(replica: ModelReplica, *dispatches: Dispatch) -> list[Any]:
    """The ingress's `submit_many` of `dispatches` on channel "c" (streamed)."""
    batch = Submissions(replica.replica_id, "c", dispatches, (True,) * len(dispatches))
    return await replica.submit_many(batch)


def items(replica: ModelReplica, rid: int) -> list[Any]:
    """What channel "c" carries for request `rid` and has not been read yet."""
    outbox = replica._outboxes.get("c")
    return [] if outbox is None else list(outbox._items.get(rid, []))


async def run_until_idle(replica: ModelReplica, limit: int = 400) -> None:
    """Steps (and reconciles, when due) until nothing runs or queues, then a drain."""
    for _ in range(limit):
        if replica._reconcile_due:
            await replica._reconcile()
        if replica._idle():
            break
        await replica._step()
    else:
        raise AssertionError("the replica never went idle")
    await replica._drain()
    if replica._reconcile_due:
        await replica._reconcile()


def held(worker: Worker) -> tuple[set[int], set[int], set[int], set[int]]:
    """(states, KV slots) the store holds for the cache, and which of them are on the host."""
    states, slots = worker.holdings()
    host_states, host_slots = worker.host_holdings()
    return (
        set(states),
        set(np.asarray(slots).tolist()),
        set(host_states),
        set(np.asarray(host_slots).tolist()),
    )


def in_step(coord: CacheCoordinator, worker: Worker, rid: str = "r0") -> None:
    """AssertionError unless the store holds exactly what the replica's tree refers to,
    each id in the tier the tree says (call it when every log entry was applied)."""
    states, slots, host_states, host_slots = held(worker)
    cache = coord.planners[rid].cache
    tree_states, tree_slots = cache.referenced()
    tree_host_states, tree_host_slots = cache.referenced_on_host()
    assert states == tree_states, (sorted(states - tree_states), sorted(tree_states - states))
    assert slots == tree_slots, (sorted(slots - tree_slots)[:16], sorted(tree_slots - slots)[:16])
    assert host_states == tree_host_states and host_slots == tree_host_slots, "tiers differ"
    coord.check_invariants()
