"""`ModelReplica`: a Ray Serve deployment whose every replica is one model instance made
of `tp` shard actors in the replica's placement group (one CPU, or one GPU, each).

The replica registers with the coordinator under its Serve replica id, then runs one
continuous-batching loop: new dispatches are prefilled as they arrive (each joins the
running batch at the next step), the batch decodes one token per step, finished requests
are committed at the coordinator and what it returns is freed on every shard. All calls
go to every shard in the same order (lockstep); rank 0's results are used.

`generate(dispatch)` streams `TokenEvent`s and ends with one `Completed`. If the caller
stops listening (disconnect, stop string), the request is finished early and committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from marconi_ray.engine.orders import Finished, Release, TokenEvent
from marconi_ray.engine.results import Usage
from marconi_ray.serve.messages import Completed, Dispatch, MisroutedDispatch
from marconi_ray.serve.settings import NAMESPACE, ServeSettings
from marconi_ray.serve.shard import ShardActor

log = logging.getLogger(__name__)


def shard_bundles(settings: ServeSettings) -> list[dict[str, float]]:
    """Placement-group bundles of one replica: the replica itself, then one per shard."""
    shard = {"CPU": 1.0, "GPU": 1.0} if settings.device == "cuda" else {"CPU": 1.0}
    return [{"CPU": 1.0}] + [dict(shard) for _ in range(settings.tp)]


class ModelReplica:
    """One model replica: `tp` shard actors driven in lockstep."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        gpu = 1 if settings.device == "cuda" else 0
        actor = ray.remote(num_cpus=1, num_gpus=gpu)(ShardActor)
        self.shards: list[Any] = [actor.remote(rank, settings.tp) for rank in range(settings.tp)]
        address = ray.get(self.shards[0].address.remote())
        infos = ray.get(
            [
                s.setup.remote(
                    settings.model_dir, address, settings.dtype, settings.device, settings.max_batch
                )
                for s in self.shards
            ]
        )
        self.info = infos[0]
        self.coordinator = ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
        ray.get(
            self.coordinator.register_replica.remote(
                self.replica_id, self.info["kv_bytes_per_token"], self.info["state_bytes"]
            )
        )
        self._pending: list[Dispatch] = []
        self._stops: set[int] = set()
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        self._orders: dict[int, Dispatch] = {}
        self._wake: asyncio.Event = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ API
    async def generate(self, dispatch: Dispatch) -> AsyncIterator[TokenEvent | Completed]:
        """Run one planned request; stream its tokens, then its `Completed`."""
        if dispatch.replica_id != self.replica_id:
            raise MisroutedDispatch(
                f"dispatch planned for replica {dispatch.replica_id!r} reached {self.replica_id!r}"
            )
        rid = dispatch.order.request_id
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[rid] = queue
        self._orders[rid] = dispatch
        self._pending.append(dispatch)
        self._ensure_loop()
        done = False
        try:
            while True:
                event = await queue.get()
                if isinstance(event, BaseException):
                    raise event
                yield event
                if isinstance(event, Completed):
                    done = True
                    return
        finally:
            if not done:
                self._stops.add(rid)
                self._wake.set()

    async def stats(self) -> dict[str, Any]:
        """Rank 0's store figures (bytes held, live states, running requests)."""
        result: dict[str, Any] = await self.shards[0].store_stats.remote()
        result["replica_id"] = self.replica_id
        return result

    def check_health(self) -> None:
        """Serve health check: the rank-0 shard answers."""
        ray.get(self.shards[0].store_stats.remote(), timeout=30)

    # ------------------------------------------------------------------ loop
    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self._wake.set()

    async def _all(self, method: str, *args: Any) -> Any:
        """Call `method` on every shard (same order everywhere); rank 0's result."""
        results = await asyncio.gather(*(getattr(s, method).remote(*args) for s in self.shards))
        return results[0]

    async def _run(self) -> None:
        while True:
            if self._idle():
                # clear before the drain's await: a dispatch arriving meanwhile sets the
                # event again, so the wait below cannot miss it (no lost wakeup)
                self._wake.clear()
                await self._drain()
                if self._idle():
                    await self._wake.wait()
            try:
                await self._admit()
                await self._stop_requested()
                if self._orders:
                    self._deliver(await self._all("step"))
                await self._commit(await self._all("take_finished"))
            except Exception as exc:  # a shard failed: fail every request in flight
                log.exception("replica %s: step failed", self.replica_id)
                await self._fail_all(exc)
            await asyncio.sleep(0)

    def _idle(self) -> bool:
        return not self._pending and not self._orders and not self._stops

    async def _drain(self) -> None:
        """Free what the coordinator released on this replica's behalf (plans abandoned
        by the ingress) while the replica was busy."""
        try:
            release: Release = await self.coordinator.drain.remote(self.replica_id)
            await self._all("release", release)
        except Exception:
            log.exception("replica %s: draining releases failed", self.replica_id)

    async def _admit(self) -> None:
        while self._pending:
            dispatch = self._pending.pop(0)
            rid = dispatch.order.request_id
            try:
                self._deliver(await self._all("start", dispatch.order, dispatch.release))
            except Exception as exc:
                release = await self.coordinator.abort.remote(self.replica_id, rid)
                await self._all("release", release)
                self._fail(rid, exc)

    async def _stop_requested(self) -> None:
        stops, self._stops = self._stops, set()
        for rid in stops:
            if rid in self._orders:
                await self._all("stop", rid)

    def _deliver(self, events: list[TokenEvent]) -> None:
        for event in events:
            queue = self._queues.get(event.request_id)
            if queue is not None:
                queue.put_nowait(event)

    async def _commit(self, finished: list[Finished]) -> None:
        for done in finished:
            release: Release = await self.coordinator.commit.remote(self.replica_id, done)
            await self._all("release", release)
            dispatch = self._orders.pop(done.request_id, None)
            queue = self._queues.pop(done.request_id, None)
            if dispatch is None or queue is None:
                continue
            order = dispatch.order
            usage = Usage(len(order.prompt), len(done.tokens), order.hit_len)
            queue.put_nowait(Completed(done.request_id, done.finish_reason, usage, done.timings))

    def _fail(self, rid: int, exc: BaseException) -> None:
        self._orders.pop(rid, None)
        queue = self._queues.pop(rid, None)
        if queue is not None:
            queue.put_nowait(RuntimeError(f"request {rid} failed on replica: {exc}"))

    async def _fail_all(self, exc: BaseException) -> None:
        for rid in list(self._orders):
            try:
                await self._all("cancel", rid)
                release = await self.coordinator.abort.remote(self.replica_id, rid)
                await self._all("release", release)
            except Exception:
                log.exception("replica %s: cleanup of request %s failed", self.replica_id, rid)
            self._fail(rid, exc)


def replica_deployment(settings: ServeSettings) -> Any:
    """The Serve deployment of `settings.replicas` model replicas, pinned-routed."""
    from ray.serve.config import RequestRouterConfig

    router: Any = RequestRouterConfig  # its stub types request_router_class as a dict
    return serve.deployment(
        ModelReplica,
        name="ModelReplica",
        num_replicas=settings.replicas,
        ray_actor_options={"num_cpus": 1},
        placement_group_bundles=shard_bundles(settings),
        placement_group_strategy="STRICT_PACK",
        max_ongoing_requests=max(64, 4 * settings.max_batch),
        request_router_config=router(
            request_router_class="marconi_ray.serve.router.PinnedReplicaRouter"
        ),
    )
