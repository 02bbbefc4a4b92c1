"""`ModelReplica`: a Ray Serve deployment whose every replica is one model instance: with
`tp` 1 the worker runs in the replica's own process (no hop per step), with `tp` > 1 it is
made of `tp` shard actors in the replica's placement group (one CPU, or one GPU, each).

The replica registers with the coordinator under its Serve replica id, then runs one
continuous-batching loop whose every iteration is ONE call to the shards (`advance`: free
what the cache released, start the new dispatches, apply stops, one decode step plus a
chunk of a long prefill, hand back the finished requests) and, when requests finished,
ONE `commit_many` call to the coordinator; what it releases is freed at the next step.
New dispatches are admitted under the step's token budget (`max_batch_tokens`), so a
burst of prompts does not stall the running decodes either.

The ingress multiplexes: `subscribe(Subscription)` is one long-lived stream per
(ingress, replica) that carries, per loop step, the new items of every request the
ingress submitted with `submit_many` (a `StepMessage`, see `replica.outbox`); the
replica-side end of a channel whose ingress stopped reading stops its requests.
`generate(dispatch)` is the same on a stream of the request's own (lists of `TokenEvent`,
then one `Completed`), for callers holding a plain handle. If the caller stops listening
(disconnect, stop string), the request is finished early and committed (or cancelled and
aborted while it still prefills). `settle(dispatch)` (`settle_many`) is the ingress's
word that the client left: a request that runs here is stopped as above; one that never
arrived is refused from now on and its plan abandoned at the coordinator, so no plan
waits for its lease to expire.

Exactly once: what the cache frees and moves reaches the store through the replica's
release log (`protocol.release_log`): every dispatch and every coordinator answer carries
the entries this replica has not acknowledged, `ReleaseCursor` takes each once and in
order, and the loop hands them to the shards with the next step, before that step's
starts. The replica is the one that knows whether an order started: it aborts the plans
of the dispatches it refuses or drops unstarted (stale ones, queued ones whose client
left), and abandons those settled before they arrived; the ingress never guesses.

Faults: the replica heartbeats the coordinator every `heartbeat_s` (renewing the leases
of the requests it runs and queues; with a host tier they also carry its rank-0 store's
tier figures for `/metrics`, read between heartbeats so a long step never delays one).
The loop reconciles the store with the tree between two steps whenever they can have
drifted: when a restarted coordinator asks, after a step failed, after the store refused
part of a release (logged with the ids, counted in `/metrics`; its valid frees still
happen) and when log entries went missing. A dispatch of another generation or past its
lease deadline is refused (`MisroutedDispatch`: the ingress plans it again). A call
meant for another replica is answered with a refusal, not an error (`WrongReplica`),
and counted. When a shard actor dies, every request in flight fails with
`ReplicaFailed` (the ingress resumes it elsewhere), the coordinator drops this
replica's cache, the TP group is rebuilt from scratch and the replica registers again
under a new generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Protocol

import ray
from ray import serve
from ray.exceptions import RayActorError

from marconi_ray.protocol.orders import Finished, PrefillOrder, Release, StepInput, TokenEvent
from marconi_ray.protocol.release_log import ReleaseCursor, Releases
from marconi_ray.protocol.results import Usage
from marconi_ray.serve.coordinator.leases import LEASE_GRACE
from marconi_ray.serve.detached import detached
from marconi_ray.serve.messages import (
    Completed,
    Dispatch,
    MisroutedDispatch,
    ReplicaFailed,
    Settlements,
    StepMessage,
    StreamItem,
    Submissions,
    Subscription,
    WrongReplica,
)
from marconi_ray.serve.placement import model_bundle_resources
from marconi_ray.serve.replica.outbox import Outbox, OutboxSink
from marconi_ray.serve.replica.receiver import Receiving
from marconi_ray.serve.replica.relayed import RelayedCommits
from marconi_ray.serve.replica.shard_group import (
    ActorShards,
    LocalShard,
    ShardGroup,
    compiled_steps,
)
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

log = logging.getLogger(__name__)


def shard_bundles(settings: ServeSettings) -> list[dict[str, float]]:
    """Placement-group bundles of one replica: the replica itself (with the device when
    tp is 1: it hosts the worker; and one unit of `model_resource` when set, see
    `serve.placement`), then one per shard actor when it has them
    (`ServeSettings.shard_actors`)."""
    device = {"CPU": 1.0, "GPU": 1.0} if settings.device == "cuda" else {"CPU": 1.0}
    model_node = model_bundle_resources(settings.model_resource)
    if not settings.shard_actors:
        return [{**device, **model_node}]
    return [{"CPU": 1.0, **model_node}] + [dict(device) for _ in range(settings.tp)]


def replica_resources(settings: ServeSettings) -> dict[str, float]:
    """The replica actor's own resources: the first bundle of `shard_bundles` (with tp 1
    it holds the GPU, so Ray makes that device visible to the replica's worker)."""
    first = shard_bundles(settings)[0]
    out = {"num_cpus": first["CPU"]}
    if "GPU" in first:
        out["num_gpus"] = first["GPU"]
    return out


class Sink(Protocol):
    """Where the loop puts one request's items (an `asyncio.Queue`, an `OutboxSink`)."""

    def put_nowait(self, item: StreamItem) -> None: ...


class ModelReplica(Receiving):
    """One model replica: its shard group driven by one continuous-batching loop (which
    also runs the moves of cache entries into it: `replica.receiver`)."""

    def __init__(self, settings: ServeSettings) -> None:
        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        settings = settings.for_coordinator(coordinator_of(settings, context))
        self.settings = settings
        self.rebuilds = 0
        self.shards: ShardGroup = self._start_shards_sync()
        self.info = self.shards.info
        log.info(
            "replica %s: kernels %s %s, warmed up in %.2f s",
            self.replica_id,
            self.info["kernels"],
            self.info["backends"],
            self.info["warm_up_s"],
        )
        self.coordinator = ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
        registered: Any = self.coordinator.register_replica.remote(
            self.replica_id, self.info["kv_bytes_per_token"], self.info["state_bytes"]
        )
        self.init_loop(int(ray.get(registered)))

    def init_loop(self, generation: int) -> None:
        """The loop's state for a replica registered under `generation`, nothing in
        flight (the constructor's second half; in-process tests build a replica around
        stand-in shards and a coordinator with it)."""
        self.generation: int = generation
        self._cursor: ReleaseCursor = ReleaseCursor(self.generation)
        """How far into its release log the replica has taken entries."""
        self._refused: int = 0
        """Releases the store refused since the last reconcile."""
        self.misrouted = 0
        """Calls meant for another replica that reached this one (refused)."""
        self._pending: list[Dispatch] = []
        self._stops: set[int] = set()
        self._cancels: set[int] = set()
        self._release: Release = Release()
        self._queues: dict[int, Sink] = {}
        """Request id -> where its items go: its own stream's queue, or its channel's
        outbox."""
        self._outboxes: dict[str, Outbox] = {}
        """Channel id -> the outbox of an ingress's multiplexed stream."""
        self._orders: dict[int, Dispatch] = {}
        self._relayed = RelayedCommits()
        """Requests whose commits went through their ingress (`replica.relayed`)."""
        self._left: set[int] = set()
        """Running requests stopped because their reader left (a settle, a closed
        stream or channel): nobody reads their ends, so they commit here."""
        self._known: dict[int, float] = {}
        """Request id -> its dispatch's deadline, for every dispatch that reached
        `generate` or was settled: such an id is never started (again). Purged past the
        deadline (a dispatch arriving after it is refused as stale anyway)."""
        self._wake: asyncio.Event = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._reconcile_due: bool = False
        self._rebuild_due: bool = False
        """A health check found a shard dead: the loop verifies and rebuilds."""
        self._beat_task: asyncio.Task[None] | None = None
        self._store_figures: dict[str, float] | None = None
        """Rank 0's `tier_stats()` as last read, sent with the next heartbeat."""
        self._figures_task: asyncio.Task[None] | None = None
        self._receives = []

    def shard_name(self, rank: int) -> str:
        """Ray actor name of a shard of the current TP group (namespace `marconi`)."""
        return f"{self.settings.app_name}-{self.replica_id}-shard{rank}-{self.rebuilds}"

    def _shard_actors(self) -> ActorShards:
        names = [self.shard_name(r) for r in range(self.settings.tp)]
        return ActorShards(self.settings, names, compiled_steps(self.settings))

    def _start_shards_sync(self) -> ShardGroup:
        if not self.settings.shard_actors:
            return LocalShard(self.settings)
        return self._shard_actors().wait()

    # ------------------------------------------------------------------ API
    async def subscribe(self, sub: Subscription) -> AsyncIterator[StepMessage]:
        """The multiplexed stream of channel `sub.channel`: one `StepMessage` per read,
        carrying the items of every request submitted for the channel since the last
        one (see `replica.outbox`). Lasts until the ingress stops reading (cancels it),
        or until it has been idle for `IDLE_END_S` with no request in flight; then every
        request of the channel still here is stopped, as a departed client's is."""
        if self._misrouted(sub.replica_id, "subscription"):
            return
        outbox = self._outbox(sub.channel)
        if outbox.subscribed:
            raise MisroutedDispatch(f"channel {sub.channel!r} already has a subscriber")
        outbox.subscribed = True
        try:
            while True:
                message = await outbox.take(IDLE_END_S)
                if message:
                    yield message
                elif not outbox.rids:
                    return  # idle: its ingress closes it sooner, unless that ingress died
        finally:
            outbox.closed = True
            self._outboxes.pop(sub.channel, None)
            self._stops.update(rid for rid in outbox.rids if rid in self._orders)
            self._wake.set()

    async def submit_many(self, batch: Submissions) -> list[MisroutedDispatch | None]:
        """Start `batch`'s dispatches here, their events to go through the stream of
        `batch.channel` (which may be subscribed to before or after). Per dispatch: None,
        or the `MisroutedDispatch` refusing it (its request was seen here already)."""
        if self._misrouted(batch.replica_id, "submission", len(batch.dispatches)):
            return [self._wrong(batch.replica_id)] * len(batch.dispatches)
        self._prune_outboxes()
        outbox = self._outbox(batch.channel)
        results: list[MisroutedDispatch | None] = []
        for dispatch, streamed in zip(batch.dispatches, batch.streamed, strict=True):
            self._take(dispatch.releases)
            refusal = self._refusal(dispatch)
            if refusal is None:
                self._accept(dispatch, outbox.sink(dispatch.order.request_id, streamed))
            results.append(refusal)
        self._ensure_loop()
        return results

    async def settle_many(self, batch: Settlements) -> list[str]:
        """`settle` for each of `batch`'s dispatches (their answers, in order)."""
        if self._misrouted(batch.replica_id, "settlement", len(batch.dispatches)):
            return ["misrouted"] * len(batch.dispatches)
        return [await self.settle(dispatch) for dispatch in batch.dispatches]

    async def generate(self, dispatch: Dispatch) -> AsyncIterator[list[TokenEvent] | Completed]:
        """Run one planned request on a stream of its own (the ingress multiplexes its
        requests instead: `subscribe`, `submit_many`); stream its tokens in batches,
        then its `Completed`."""
        if self._misrouted(dispatch.replica_id, "dispatch"):
            raise self._wrong(dispatch.replica_id)
        rid = dispatch.order.request_id
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._take(dispatch.releases)
        refusal = self._refusal(dispatch)
        if refusal is not None:
            raise refusal
        self._accept(dispatch, queue)
        self._ensure_loop()
        done = False
        try:
            while True:
                items = [await queue.get()]
                while not queue.empty():
                    items.append(queue.get_nowait())
                tokens = [e for e in items if isinstance(e, TokenEvent)]
                if tokens:
                    yield tokens
                for item in items:
                    if isinstance(item, BaseException):
                        raise item
                    if isinstance(item, Completed):
                        done = True
                        yield item
                        return
        finally:
            if not done:
                self._stops.add(rid)
                self._wake.set()

    def _misrouted(self, replica_id: str, what: str, n: int = 1) -> bool:
        """Whether a call is meant for another replica (Serve no longer lists that one,
        usually for a second or two after it died): then the coordinator is told, and it
        is counted and logged as the routine refusal it is."""
        if replica_id == self.replica_id:
            return False
        self.coordinator.report_unreachable.remote(replica_id)
        self.misrouted += n
        log.info(
            "replica %s: a %s for replica %r reached it and was refused (%d so far)",
            self.replica_id,
            what,
            replica_id,
            self.misrouted,
        )
        return True

    def _wrong(self, replica_id: str) -> WrongReplica:
        return WrongReplica(
            f"dispatch planned for replica {replica_id!r} reached {self.replica_id!r}"
        )

    def _take(self, releases: Releases) -> None:
        """Queue what `releases` brings that the store has not applied yet, for the next
        call to the shards (`ReleaseCursor.take`); a gap in the log has the loop
        reconcile. A relayed request whose plan the log says ended leaves `_relayed`;
        what it stored is freed too when the cache never took it."""
        release = self._cursor.take(releases)
        freed = self._relayed.settle(release)
        self._release = self._release + release.for_store() + freed
        if self._cursor.gap:
            log.warning("replica %s: %s: reconciling", self.replica_id, self._cursor.gap)
            self._reconcile_due = True
            self._ensure_loop()

    def _refusals(self, refused: list[str] | tuple[str, ...]) -> None:
        """The store refused part of a release (the rest was applied): log it with its
        ids, count it, and reconcile before the next step (tiers included)."""
        if not refused:
            return
        self._refused += len(refused)
        for message in refused:
            log.warning("replica %s: the store refused a release: %s", self.replica_id, message)
        self._reconcile_due = True

    async def _release_now(self, release: Release) -> None:
        """Hand `release` to the shards at once (outside a step)."""
        self._refusals(await self.shards.call("release", release))

    def _refusal(self, dispatch: Dispatch) -> MisroutedDispatch | None:
        """Why `dispatch` cannot be accepted here (None when it can): its request was
        seen here already (it ran, runs, or was settled)."""
        rid = dispatch.order.request_id
        if rid in self._known:
            return MisroutedDispatch(
                f"request {rid} already reached {self.replica_id!r} (or was settled)"
            )
        return None

    def _accept(self, dispatch: Dispatch, sink: Sink) -> None:
        """Queue `dispatch` (not refused: `_refusal`) for the loop, its items to `sink`."""
        rid = dispatch.order.request_id
        self._remember(rid, dispatch.deadline)
        self._queues[rid] = sink
        self._orders[rid] = dispatch
        self._pending.append(dispatch)

    def _outbox(self, channel: str) -> Outbox:
        outbox = self._outboxes.get(channel)
        if outbox is None:
            outbox = self._outboxes[channel] = Outbox()
        return outbox

    def _prune_outboxes(self) -> None:
        """Drop outboxes no subscriber came for (its ingress failed to subscribe, or
        died first) once their requests ended and a lease passed since the last was
        submitted: by then no subscription for them can still be on its way."""
        cutoff = time.monotonic() - self.settings.lease_s
        for channel, outbox in list(self._outboxes.items()):
            if not outbox.subscribed and not outbox.rids and outbox.touched < cutoff:
                del self._outboxes[channel]

    async def settle(self, dispatch: Dispatch) -> str:
        """The client of `dispatch` left before any of its events came back. A request
        running or queued here is stopped (committed or aborted by the loop: 'stopped');
        one that already ended is left alone ('ended'); one that never arrived is refused
        from now on and its plan abandoned at the coordinator ('abandoned'). A dispatch
        planned for another replica is not touched ('misrouted'). The answer is the
        replica's word on where the request stands: the ingress waits for it before it
        plans the request again."""
        rid = dispatch.order.request_id
        if dispatch.replica_id != self.replica_id:
            return "misrouted"
        if rid in self._orders:
            self._stops.add(rid)
            self._ensure_loop()
            return "stopped"
        if rid in self._known:
            return "ended"
        self._remember(rid, dispatch.deadline)
        await self.coordinator.abandon.remote(dispatch)
        return "abandoned"

    def _renew(self, rids: list[int], sent: float) -> None:
        """A heartbeat sent at `sent` with `rids` live was answered "ok": a dispatch still
        queued here is then not refused as stale before `sent + lease_s`.

        Only when it was sound: the heartbeat came back within half the coordinator's
        grace (`lease_s * LEASE_GRACE`; the other half covers clock skew) and the
        request's deadline here had not passed at `sent`.
        Then its lease at the coordinator (never earlier than here; aborted only past its
        deadline plus the grace) was alive when the heartbeat renewed it."""
        lease = self.settings.lease_s
        if time.time() - sent >= lease * LEASE_GRACE / 2:  # the other half: clock skew
            return
        for rid in rids:
            if self._known.get(rid, -1.0) >= sent:
                self._known[rid] = max(self._known[rid], sent + lease)

    def _remember(self, rid: int, deadline: float) -> None:
        """Add `rid` to `_known`, dropping the oldest entries past their deadline (ids
        arrive in about deadline order, so this is amortised O(1))."""
        now = time.time()
        while self._known:
            old, due = next(iter(self._known.items()))
            if due >= now or old in self._orders:
                break
            del self._known[old]
        self._known[rid] = deadline

    async def stats(self) -> dict[str, Any]:
        """Rank 0's store figures (bytes held, live states, running requests), with the
        replica's id, generation, shard actor names and TP group rebuilds."""
        result: dict[str, Any] = await self.shards.rank0("store_stats")
        result["replica_id"] = self.replica_id
        result["generation"] = self.generation
        result["rebuilds"] = self.rebuilds
        result["shards"] = list(self.shards.names)
        return result

    async def check_health(self) -> None:
        """Serve health check (periodic from the replica's start): the rank-0 shard
        answers. Also starts the heartbeats, so an idle replica keeps its registration.

        A TP group that lost a shard does not fail the check: the replica replaces the
        group itself (`_rebuild`, asked of the loop here when no step found the loss
        first). Failing it would have Serve stop routing to the replica while its
        heartbeats go on, so the coordinator would keep planning for it and every
        re-plan would be misrouted until Serve's replacement came up."""
        self._ensure_heartbeats()
        try:
            await asyncio.wait_for(self.shards.rank0("store_stats"), timeout=30)
        except RayActorError:
            if await self.shards.alive():
                raise
            self._rebuild_due = True
            self._ensure_loop()

    # ------------------------------------------------------------------ loop
    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = detached(self._run())  # serves every request: no one's context
        self._ensure_heartbeats()
        self._wake.set()

    def _ensure_heartbeats(self) -> None:
        if self._beat_task is None or self._beat_task.done():
            self._beat_task = detached(self._heartbeats())

    async def _run(self) -> None:
        while True:
            if self._idle():
                # clear before the drain's await: a dispatch arriving meanwhile sets the
                # event again, so the wait below cannot miss it (no lost wakeup)
                self._wake.clear()
                await self._drain()
                if self._idle():
                    await self._wait_for_work()
            try:
                if self._rebuild_due:
                    await self._rebuild_if_dead()
                    continue
                if self._reconcile_due:
                    await self._reconcile()
                if self._receives:
                    await self._run_receives()
                await self._step()
                await self._commit_overdue()
            except RayActorError as exc:  # an actor died: a shard, or someone else?
                if await self.shards.alive():
                    log.exception("replica %s: step failed", self.replica_id)
                    await self._fail_all(exc)
                else:
                    log.exception("replica %s: a shard died", self.replica_id)
                    await self._rebuild(exc)
            except Exception as exc:  # a step failed: fail every request in flight
                log.exception("replica %s: step failed", self.replica_id)
                await self._fail_all(exc)
            await asyncio.sleep(0)

    async def _step(self) -> None:
        """One iteration: one `advance` on the shards, one `commit_many` if any finished.
        The dispatches that will not start (stale, stopped while queued) have their plans
        aborted first; the step's release (everything taken so far, theirs and the
        started orders' entries included) is applied before its starts."""
        stops = self._take_stops()
        unqueued = self._unqueue(stops)  # before admitting: a stopped one never starts
        start, dropped = self._admit()
        for rid, error in [*unqueued, *dropped]:
            await self._abort(rid)
            self._fail(rid, error)
        step = StepInput(self._take_release(), start, tuple(stops), self._take_cancels())
        out = await self.shards.advance(step)
        self._refusals(out.refused)
        self._deliver(out.events)
        for rid, message in out.failed:
            await self._abort(rid)
            self._fail(rid, RuntimeError(message))
        for rid in out.cancelled:
            await self._abort(rid)
            self._fail(rid, ReplicaFailed(f"request {rid} was cancelled while prefilling"))
        if out.finished:
            await self._commit(list(out.finished))

    def _take_release(self) -> Release:
        release, self._release = self._release, Release()
        return release

    def _take_stops(self) -> list[int]:
        stops, self._stops = self._stops, set()
        taken = [rid for rid in stops if rid in self._orders]
        self._left.update(taken)
        return taken

    def _unqueue(self, stops: list[int]) -> list[tuple[int, BaseException]]:
        """Take the stopped requests that still queue here out of the queue (they never
        start; their plans are aborted) and out of `stops` (the worker does not know
        them); returns them with the error that ends their streams."""
        stopped = set(stops)
        queued = [d.order.request_id for d in self._pending if d.order.request_id in stopped]
        if not queued:
            return []
        gone = set(queued)
        self._pending = [d for d in self._pending if d.order.request_id not in gone]
        stops[:] = [rid for rid in stops if rid not in gone]
        return [(rid, ReplicaFailed(f"request {rid} stopped before it started")) for rid in queued]

    def _take_cancels(self) -> tuple[int, ...]:
        cancels, self._cancels = self._cancels, set()
        return tuple(cancels)

    def _admit(self) -> tuple[tuple[PrefillOrder, ...], list[tuple[int, BaseException]]]:
        """(the pending dispatches that start this step: in arrival order, while their
        prefills fit in the step's token budget, always at least one; the stale ones,
        which leave the queue and never start, with the refusal that ends each)."""
        budget = self.settings.max_batch_tokens
        orders: list[PrefillOrder] = []
        stale: list[tuple[int, BaseException]] = []
        used = 0
        while self._pending:
            dispatch = self._pending[0]
            order = dispatch.order
            why = self._stale(dispatch)
            if why:
                self._pending.pop(0)
                stale.append((order.request_id, MisroutedDispatch(why)))
                continue
            tokens = min(budget, len(order.prompt) - order.hit_len)
            if orders and used + tokens > budget:
                break
            used += tokens
            self._pending.pop(0)
            orders.append(order)
        return tuple(orders), stale

    # ------------------------------------------------------------------ liveness
    def _live(self) -> list[int]:
        """Every request queued or running here, or waiting for its relayed commit."""
        return [*self._orders, *self._relayed.ids()]

    async def _heartbeats(self) -> None:
        """Every `heartbeat_s`: renew the leases of what runs and queues here; when the
        coordinator does not know this replica, register again; when it asks (or after
        registering), have the loop reconcile the store between two steps. With a host
        tier each heartbeat carries the store figures read after the one before."""
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            self._read_store_figures()
            try:
                await self._beat()
            except Exception:
                log.exception("replica %s: heartbeat failed", self.replica_id)

    async def _beat(self) -> None:
        """One heartbeat (see `_heartbeats`): it acknowledges the release log as far as
        this replica took it."""
        live, sent = self._live(), time.time()
        status, _ = await self.coordinator.heartbeat.remote(
            self.replica_id,
            live,
            self._cursor.applied,
            self._store_figures,
            generation=self._cursor.generation,
        )
        if status == "ok":
            self._renew(live, sent)
        if status == "register":
            self.generation = await self.coordinator.register_replica.remote(
                self.replica_id, self.info["kv_bytes_per_token"], self.info["state_bytes"]
            )
            self._cursor.reset(self.generation)
        if status in ("register", "reconcile"):
            self._reconcile_due = True
            self._ensure_loop()

    def _read_store_figures(self) -> None:
        """Start reading rank 0's store figures (`tier_stats`) for a later heartbeat, in
        a task of its own, one at a time: it waits behind a step in progress, the
        heartbeats never do. Nothing to read without a host tier."""
        if not self.settings.host_cache_bytes:
            return
        if self._figures_task is None or self._figures_task.done():
            self._figures_task = detached(self._fetch_store_figures())

    async def _fetch_store_figures(self) -> None:
        try:
            self._store_figures = dict(await self.shards.rank0("tier_stats"))
        except Exception as exc:  # a shard lost: the loop rebuilds the group
            log.warning("replica %s: store figures not read (%s)", self.replica_id, exc)

    async def _reconcile(self) -> None:
        """Report what the store holds for the cache (after applying every log entry taken
        so far), and which of it is on the host; free what no tree or later log entry
        refers to. A tree that does not match is reset (new generation). Runs between
        steps, after every finished request was committed or relayed. What relayed
        requests stored is theirs until their plans end: it is reported as held (a tree
        may refer to it already, if the relay was applied), and as theirs (`owned`), so
        it is never freed directly; a reset (which ends their plans with the old tree)
        frees it here."""
        self._reconcile_due = False
        owned = self._relayed.owned()
        await self._release_now(self._take_release())
        states, slots, host_states, host_slots = await self.shards.rank0("holdings")
        cursor, refused = self._cursor, self._refused
        generation, releases = await self.coordinator.reconcile.remote(
            self.replica_id,
            states,
            slots,
            host_states,
            host_slots,
            cursor.applied,
            cursor.generation,
            refused,
            list(owned.states),
            owned.slots,
        )
        self._refused -= refused
        self.generation = generation
        cursor.reset(generation)
        self._take(releases)
        # a reset (here, or a re-registration first) ended the old tree's plans: the
        # requests waiting for their relays own what they stored, and free it here
        self._release = self._release + self._relayed.clear_other(generation)
        await self._release_now(self._take_release())
        log.warning(
            "replica %s reconciled with the coordinator: freed %d states, %d KV slots",
            self.replica_id,
            len(releases.direct.states),
            len(releases.direct.slots),
        )

    async def _rebuild_if_dead(self) -> None:
        """The health check's request: rebuild unless a step's own rebuild came first."""
        self._rebuild_due = False
        if not await self.shards.alive():
            log.warning("replica %s: a shard died (found by the health check)", self.replica_id)
            await self._rebuild(RuntimeError("a shard stopped answering the health check"))

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
        self._pending, self._stops, self._cancels = [], set(), set()
        self._release = Release()
        self._relayed.clear()  # what they stored died with the store
        self.shards.kill()
        self.rebuilds += 1
        while True:
            # the new group is in place before its set-up ends: health checks query it
            # (and wait behind its set-up) instead of failing on the dead one
            group = self._shard_actors()
            self.shards = group
            try:
                await group.ready()
                break
            except Exception:
                log.exception("replica %s: rebuilding the TP group failed", self.replica_id)
                group.kill()
                await asyncio.sleep(self.settings.heartbeat_s)
        self.info = self.shards.info
        self.generation = await self.coordinator.register_replica.remote(
            self.replica_id, self.info["kv_bytes_per_token"], self.info["state_bytes"]
        )
        self._cursor.reset(self.generation)
        self._release = Release()
        log.warning("replica %s: TP group rebuilt (%d)", self.replica_id, self.rebuilds)

    def _idle(self) -> bool:
        return not (
            self._pending
            or self._orders
            or self._stops
            or self._cancels
            or self._reconcile_due
            or self._rebuild_due
            or self._receives
        )

    async def _drain(self) -> None:
        """Free what the coordinator released on this replica's behalf (plans abandoned
        by the ingress) while the replica was busy, and what the last commit released."""
        try:
            releases = await self.coordinator.drain.remote(
                self.replica_id, self._cursor.applied, self._cursor.generation
            )
            self._take(releases)
            await self._release_now(self._take_release())
        except Exception:
            log.exception("replica %s: draining releases failed", self.replica_id)

    def _stale(self, dispatch: Dispatch) -> str:
        """Why `dispatch` must not start here ('' when it may)."""
        if dispatch.generation != self.generation:
            return (
                f"dispatch planned for generation {dispatch.generation} of replica "
                f"{self.replica_id!r}, now at {self.generation} (its cache was reset)"
            )
        if dispatch.needs > self._cursor.applied:
            return (
                f"dispatch needs release log entries up to {dispatch.needs}, the store "
                f"has {self._cursor.applied}"
            )
        rid = dispatch.order.request_id
        if time.time() > max(dispatch.deadline, self._known.get(rid, 0.0)):
            return f"dispatch of request {rid} reached past its lease"
        return ""

    def _deliver(self, events: tuple[TokenEvent, ...]) -> None:
        for event in events:
            queue = self._queues.get(event.request_id)
            if queue is not None:
                queue.put_nowait(event)

    async def _abort(self, rid: int) -> None:
        """Release a request's plan at the coordinator (it will not run, or no longer
        runs, here); what the answer brings is applied with the next step."""
        releases: Releases = await self.coordinator.abort.remote(
            self.replica_id,
            rid,
            applied=self._cursor.applied,
            generation=self._cursor.generation,
        )
        self._take(releases)

    async def _commit(self, finished: list[Finished]) -> None:
        """Commit at the coordinator and complete the requests. A request an ingress
        reads on its channel has its commit relayed (`settings.commit_relay`): it leaves
        with its `Completed`, the ingress sends it with its next coordinator call and
        answers the client once it is applied; the request waits in `_relayed` until its
        log says its plan ended. The others are committed here in one call, sent first
        (so a client's next turn, planned after it sees the answer, finds it applied:
        the coordinator takes calls in order of arrival), then the answers go out, then
        the release it returns is awaited."""
        relay = self.settings.commit_relay
        direct, now = [], time.monotonic()
        for done in finished:
            queue = self._queues.get(done.request_id)
            left = done.request_id in self._left
            self._left.discard(done.request_id)
            if relay and not left and isinstance(queue, OutboxSink) and queue.read:
                self._relayed.add(done, now, self._orders[done.request_id].generation)
            else:
                direct.append(done)
        pending: Any = None
        if direct:
            pending = self.coordinator.commit_many.remote(
                self.replica_id, direct, self._cursor.applied, self._cursor.generation
            )
        for done in finished:
            dispatch = self._orders.pop(done.request_id, None)
            queue = self._queues.pop(done.request_id, None)
            if dispatch is None or queue is None:
                continue
            order = dispatch.order
            usage = Usage(len(order.prompt), len(done.tokens), order.hit_len)
            relayed = done.request_id in self._relayed
            queue.put_nowait(
                Completed(
                    done.request_id,
                    done.finish_reason,
                    usage,
                    done.timings,
                    done.spec,
                    done if relayed else None,
                    self._cursor.applied if relayed else 0,
                )
            )
        if pending is not None:
            self._take(await pending)

    async def _commit_overdue(self) -> None:
        """Commit here every relayed request whose commit has not been applied within
        `settings.commit_relay_s` (its ingress died, its channel broke, or the relay is
        done but its log entry has not reached this replica yet: the coordinator then
        drops the repeat, `CacheCoordinator.commit_many`). Its answer settles each one:
        by a log entry, or as an orphan freed directly."""
        overdue = self._relayed.overdue(time.monotonic() - self.settings.commit_relay_s)
        if not overdue:
            return
        releases: Releases = await self.coordinator.commit_many.remote(
            self.replica_id, overdue, self._cursor.applied, self._cursor.generation, True
        )
        self._take(releases)
        self._relayed.drop(overdue)  # not settled by an entry: freed directly, or reset

    async def _wait_for_work(self) -> None:
        """Wait for the loop's next work; with relayed commits outstanding, no longer
        than until the oldest is due to be committed here."""
        due = self._relayed.next_due(self.settings.commit_relay_s)
        if due is None:
            await self._wake.wait()
            return
        wait = max(0.0, due - time.monotonic())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), wait)

    def _fail(self, rid: int, exc: BaseException) -> None:
        self._orders.pop(rid, None)
        self._left.discard(rid)
        queue = self._queues.pop(rid, None)
        if queue is not None:
            if not isinstance(exc, MisroutedDispatch | ReplicaFailed):
                exc = RuntimeError(f"request {rid} failed on replica: {exc}")
            queue.put_nowait(exc)

    async def _fail_all(self, exc: BaseException) -> None:
        """A step failed: fail every request here, running or queued. Queued dispatches
        leave the queue (they must not start after their plans were aborted). Whether the
        failed step applied its release is not known: the loop reconciles before the next
        step (what it did not free is freed then; a move it did not make resets the tree)."""
        queued = {d.order.request_id for d in self._pending}
        self._pending = []
        self._reconcile_due = True
        for rid in list(self._orders):
            try:
                if rid not in queued:
                    await self.shards.call("cancel", rid)
                await self._abort(rid)
            except Exception:
                log.exception("replica %s: cleanup of request %s failed", self.replica_id, rid)
            self._fail(rid, exc)


IDLE_END_S = 10.0
"""A channel with no request in flight and nothing to carry for this long ends here: the
backstop for an ingress that died without closing it (a live ingress closes an idle
channel after `replica_channel.IDLE_CLOSE_S`)."""

DRAIN_POLL_S = 0.25
"""How often a stopping replica (ingress or model) checks that its calls have ended."""


def coordinator_of(settings: ServeSettings, context: Any) -> int:
    """The coordinator of the group (`settings.coordinators`) a replica registers with:
    its Serve rank modulo the group (`group_replicas_by: rank`: balanced), or its node's
    rank (`node`: a node's replicas share one coordinator, so losing the node touches
    that one only). A context without ranks (an older Serve): a hash of its id."""
    k = settings.coordinators
    if k == 1:
        return 0
    rank = getattr(context, "rank", None)
    field = "node_rank" if settings.group_replicas_by == "node" else "rank"
    value = getattr(rank, field, rank if field == "rank" else None)
    if isinstance(value, int) and value >= 0:
        return value % k
    digest = hashlib.blake2b(context.replica_id.unique_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % k


def max_ongoing(settings: ServeSettings) -> int:
    """Serve's `max_ongoing_requests` of a replica: room for every request the coordinator
    may plan on it (`max_batch` running + `max_queued_requests` queued) plus control
    calls, so each planned dispatch enters `generate` (and its lease is renewed by the
    heartbeats) instead of waiting unseen in Serve's queue."""
    s = settings
    held = s.max_batch + s.max_queued_requests if s.max_queued_requests >= 0 else 100_000
    return max(64, 4 * s.max_batch, held + s.max_batch)


def replica_deployment(settings: ServeSettings) -> Any:
    """The Serve deployment of `settings.replicas` model replicas, pinned-routed."""
    from ray.serve.config import RequestRouterConfig

    router: Any = RequestRouterConfig  # its stub types request_router_class as a dict
    return serve.deployment(
        ModelReplica,
        name="ModelReplica",
        num_replicas=settings.replicas,
        ray_actor_options=replica_resources(settings),
        placement_group_bundles=shard_bundles(settings),
        placement_group_strategy="STRICT_PACK",
        max_ongoing_requests=max_ongoing(settings),
        # the first health check starts the heartbeats: well within a lease
        health_check_period_s=min(10.0, settings.lease_s / 3),
        # a stopping replica waits for its calls (the ingresses' streams, which close
        # a second after their last request): look every quarter second, not every 2 s
        graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
        request_router_config=router(
            request_router_class="marconi_ray.serve.ingress.pinned_router.PinnedReplicaRouter"
        ),
    )
