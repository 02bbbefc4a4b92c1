"""`ModelReplica`: a Ray Serve deployment whose every replica is one model instance made
of `tp` shard actors in the replica's placement group (one CPU, or one GPU, each).

The replica registers with the coordinator under its Serve replica id, then runs one
continuous-batching loop: new dispatches are prefilled as they arrive (each joins the
running batch at the next step), the batch decodes one token per step, finished requests
are committed at the coordinator and what it returns is freed on every shard. All calls
go to every shard in the same order (lockstep); rank 0's results are used.

`generate(dispatch)` streams `TokenEvent`s and ends with one `Completed`. If the caller
stops listening (disconnect, stop string), the request is finished early and committed.

Faults: the replica heartbeats the coordinator every `heartbeat_s` (renewing the leases
of the requests it runs and queues); when a restarted coordinator asks, the loop
reconciles the store with the restored tree between two steps. A dispatch of another
generation or past its lease deadline is refused (`MisroutedDispatch`: the ingress plans
it again). When a shard dies, every request in flight fails with `ReplicaFailed` (the
ingress resumes it elsewhere), the coordinator drops this replica's cache, the TP group
is rebuilt from scratch and the replica registers again under a new generation.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import ray
from ray import serve
from ray.exceptions import RayActorError

from marconi_ray.protocol.orders import Finished, Release, TokenEvent
from marconi_ray.protocol.results import Usage
from marconi_ray.serve.messages import Completed, Dispatch, MisroutedDispatch, ReplicaFailed
from marconi_ray.serve.settings import NAMESPACE, ServeSettings
from marconi_ray.serve.shard import ShardActor

log = logging.getLogger(__name__)

SHARD_PING_S: Final = 30.0
"""How long every shard gets to answer before the TP group is declared broken."""


def shard_bundles(settings: ServeSettings) -> list[dict[str, float]]:
    """Placement-group bundles of one replica: the replica itself, then one per shard."""
    shard = {"CPU": 1.0, "GPU": 1.0} if settings.device == "cuda" else {"CPU": 1.0}
    return [{"CPU": 1.0}] + [dict(shard) for _ in range(settings.tp)]


class ModelReplica:
    """One model replica: `tp` shard actors driven in lockstep."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.rebuilds = 0
        self.shards: list[Any] = []
        self.info = ray.get(self._start_shards())
        log.info(
            "replica %s: kernels %s %s, warmed up in %.2f s",
            self.replica_id, self.info["kernels"], self.info["backends"], self.info["warm_up_s"],
        )
        self.coordinator = ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
        registered: Any = self.coordinator.register_replica.remote(
            self.replica_id, self.info["kv_bytes_per_token"], self.info["state_bytes"]
        )
        self.generation: int = int(ray.get(registered))
        self._pending: list[Dispatch] = []
        self._stops: set[int] = set()
        self._queues: dict[int, asyncio.Queue[Any]] = {}
        self._orders: dict[int, Dispatch] = {}
        self._wake: asyncio.Event = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._reconcile_due: bool = False
        self._beat_task: asyncio.Task[None] | None = None

    def shard_name(self, rank: int) -> str:
        """Ray actor name of a shard of the current TP group (namespace `marconi`)."""
        return f"{self.settings.app_name}-{self.replica_id}-shard{rank}-{self.rebuilds}"

    def _start_shards(self) -> Any:
        """Create and set up a fresh TP group; an ObjectRef of rank 0's store info."""
        s = self.settings
        gpu = 1 if s.device == "cuda" else 0
        actor = ray.remote(num_cpus=1, num_gpus=gpu, max_restarts=0)(ShardActor)
        self.shards = [
            actor.options(name=self.shard_name(rank), namespace=NAMESPACE).remote(rank, s.tp)
            for rank in range(s.tp)
        ]
        address = ray.get(self.shards[0].address.remote())
        infos = [
            shard.setup.remote(
                s.model_dir, address, s.dtype, s.device, s.max_batch, s.kernels,
                s.max_batch_tokens,
            )
            for shard in self.shards
        ]
        return infos[0]

    # ------------------------------------------------------------------ API
    async def generate(self, dispatch: Dispatch) -> AsyncIterator[TokenEvent | Completed]:
        """Run one planned request; stream its tokens, then its `Completed`."""
        if dispatch.replica_id != self.replica_id:
            self.coordinator.report_unreachable.remote(dispatch.replica_id)
            raise MisroutedDispatch(
                f"dispatch planned for replica {dispatch.replica_id!r} reached {self.replica_id!r}"
            )
        rid = dispatch.order.request_id
        if rid in self._queues:
            raise MisroutedDispatch(f"request {rid} is already running on {self.replica_id!r}")
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
        """Rank 0's store figures (bytes held, live states, running requests), with the
        replica's id, generation, shard actor names and TP group rebuilds."""
        result: dict[str, Any] = await self.shards[0].store_stats.remote()
        result["replica_id"] = self.replica_id
        result["generation"] = self.generation
        result["rebuilds"] = self.rebuilds
        result["shards"] = [self.shard_name(rank) for rank in range(len(self.shards))]
        return result

    async def check_health(self) -> None:
        """Serve health check (periodic from the replica's start): the rank-0 shard
        answers. Also starts the heartbeats, so an idle replica keeps its registration."""
        self._ensure_heartbeats()
        await asyncio.wait_for(self.shards[0].store_stats.remote(), timeout=30)

    # ------------------------------------------------------------------ loop
    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
        self._ensure_heartbeats()
        self._wake.set()

    def _ensure_heartbeats(self) -> None:
        if self._beat_task is None or self._beat_task.done():
            self._beat_task = asyncio.get_running_loop().create_task(self._heartbeats())

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
                if self._reconcile_due:
                    await self._reconcile()
                await self._admit()
                await self._stop_requested()
                if self._orders:
                    self._deliver(await self._all("step"))
                await self._commit(await self._all("take_finished"))
            except RayActorError as exc:  # an actor died: a shard, or someone else?
                if await self._shards_alive():
                    log.exception("replica %s: step failed", self.replica_id)
                    await self._fail_all(exc)
                else:
                    log.exception("replica %s: a shard died", self.replica_id)
                    await self._rebuild(exc)
            except Exception as exc:  # a step failed: fail every request in flight
                log.exception("replica %s: step failed", self.replica_id)
                await self._fail_all(exc)
            await asyncio.sleep(0)

    # ------------------------------------------------------------------ liveness
    def _live(self) -> list[int]:
        return [d.order.request_id for d in self._pending] + list(self._orders)

    async def _heartbeats(self) -> None:
        """Every `heartbeat_s`: renew the leases of what runs and queues here; when the
        coordinator does not know this replica, register again; when it asks (or after
        registering), have the loop reconcile the store between two steps."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                status, _ = await self.coordinator.heartbeat.remote(self.replica_id, self._live())
                if status == "register":
                    self.generation = await self.coordinator.register_replica.remote(
                        self.replica_id, self.info["kv_bytes_per_token"], self.info["state_bytes"]
                    )
            except Exception:
                log.exception("replica %s: heartbeat failed", self.replica_id)
                continue
            if status in ("register", "reconcile"):
                self._reconcile_due = True
                self._ensure_loop()

    async def _reconcile(self) -> None:
        """Report what the store holds for the cache; free what no tree refers to. Runs
        between steps, after every finished request was committed."""
        states, slots = await self.shards[0].holdings.remote()
        generation, release = await self.coordinator.reconcile.remote(
            self.replica_id, states, slots
        )
        await self._all("release", release)
        self.generation = generation
        self._reconcile_due = False
        log.warning(
            "replica %s reconciled with the coordinator: freed %d states, %d KV slots",
            self.replica_id,
            len(release.states),
            len(release.slots),
        )

    async def _shards_alive(self) -> bool:
        """Does every shard of the current TP group answer?"""
        try:
            await asyncio.wait_for(
                asyncio.gather(*(s.store_stats.remote() for s in self.shards)), SHARD_PING_S
            )
        except (RayActorError, TimeoutError):
            return False
        return True

    async def _rebuild(self, exc: BaseException) -> None:
        """A shard died: fail what runs, drop this replica's cache at the coordinator,
        replace the whole TP group and register again (new generation)."""
        # unregister first: requests failed below are re-planned on other replicas
        await self.coordinator.unregister_replica.remote(self.replica_id)
        failure = ReplicaFailed(f"replica {self.replica_id} lost a shard: {exc}")
        for rid in list(self._orders):
            self._fail(rid, failure)
        for dispatch in self._pending:
            self._fail(dispatch.order.request_id, failure)
        self._pending, self._stops = [], set()
        for shard in self.shards:
            ray.kill(shard, no_restart=True)
        self.rebuilds += 1
        while True:
            try:
                self.info = await self._start_shards()
                break
            except Exception:
                log.exception("replica %s: rebuilding the TP group failed", self.replica_id)
                for shard in self.shards:
                    ray.kill(shard, no_restart=True)
                await asyncio.sleep(self.settings.heartbeat_s)
        self.generation = await self.coordinator.register_replica.remote(
            self.replica_id, self.info["kv_bytes_per_token"], self.info["state_bytes"]
        )
        log.warning("replica %s: TP group rebuilt (%d)", self.replica_id, self.rebuilds)

    def _idle(self) -> bool:
        return not (self._pending or self._orders or self._stops or self._reconcile_due)

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
            stale = self._stale(dispatch)
            if stale:
                self._fail(rid, MisroutedDispatch(stale))
                continue
            try:
                self._deliver(await self._all("start", dispatch.order, dispatch.release))
            except Exception as exc:
                release = await self.coordinator.abort.remote(self.replica_id, rid)
                await self._all("release", release)
                self._fail(rid, exc)

    def _stale(self, dispatch: Dispatch) -> str:
        """Why `dispatch` must not start here ('' when it may)."""
        if dispatch.generation != self.generation:
            return (
                f"dispatch planned for generation {dispatch.generation} of replica "
                f"{self.replica_id!r}, now at {self.generation} (its cache was reset)"
            )
        if time.time() > dispatch.deadline:
            return f"dispatch of request {dispatch.order.request_id} reached past its lease"
        return ""

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
            if not isinstance(exc, MisroutedDispatch | ReplicaFailed):
                exc = RuntimeError(f"request {rid} failed on replica: {exc}")
            queue.put_nowait(exc)

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
        # the first health check starts the heartbeats: well within a lease
        health_check_period_s=min(10.0, settings.lease_s / 3),
        request_router_config=router(
            request_router_class="marconi_ray.serve.pinned_router.PinnedReplicaRouter"
        ),
    )
