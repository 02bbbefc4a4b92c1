"""A model-based fuzzer of exactly once: random interleavings of plans, submissions
(some to the wrong replica), starts and steps, client departures, channel breaks,
abandons of unsent plans, lease expiries, heartbeats, drains, reconciles, coordinator
stalls and coordinator restarts from the journal, commits relayed through the ingress
(`settings.commit_relay`: delivered late, twice, or lost with an ingress), the
replicas' own commits of overdue relays, and moves of cache entries between the
replicas (`serve.coordinator.transfers`: begun, sent, arriving intact or corrupt, lost
with a source that died, or abandoned by a mover that died, its leases left to expire),
and resets of a replica's cache at the coordinator while its requests decode from hits
(what a coordinator restarted without a persistent journal does: the replica registers
again and reconciles; issue 54), across two replicas with the host tier on.
The parts are the real ones (`replica_harness`: a real `CacheCoordinator`, real
tiny-model workers, the real `ModelReplica` and `RayBackend` methods).

After every event it checks each replica's store against a reference built from the
coordinator's tree and what is still on its way to the store (log entries after the
replica's cursor, and the release the replica has taken but not yet handed over):

- the store refused nothing (a second free of an id, or a move out of order, is a
  refusal);
- the store holds exactly the ids the tree refers to plus those still to be freed;
- every id the tree refers to is in the tier the tree says, unless a move still on its
  way moves it;
- every request that ran to its length produced what an uncached run produces.

At the end every plan is closed, the log drained, and the store equals the tree exactly.
`run_case(seed, events)` is one case; the test runs a few, `benchmarks/fuzz_exactly_once.py`
many.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
from coordinator_helpers import GREEDY, LEASE, Clock, make_settings, make_worker, register
from ray.exceptions import ActorUnavailableError
from replica_harness import Handle, held, in_step, items, make_replica, refused, run_until_idle

from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import PrefillOrder, TokenEvent
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.coordinator.leases import LEASE_GRACE
from marconi_ray.serve.coordinator.stall_watch import StallWatch
from marconi_ray.serve.ingress.ray_backend import RayBackend
from marconi_ray.serve.messages import (
    Completed,
    Dispatch,
    NoReplicaAvailable,
    Overloaded,
    RelayedCommit,
    Submissions,
    WrongReplica,
)
from marconi_ray.serve.replica import deployment
from marconi_ray.serve.replica.deployment import ModelReplica
from marconi_ray.serve.replica.ticket_io import export_ticket, import_ticket
from marconi_ray.serve.transfer_messages import MoveTicket

REPLICAS = ("r0", "r1")
WEIGHTS = {
    "plan": 6,
    "submit": 6,
    "step": 16,
    "misroute": 1,
    "forget": 1,
    "settle": 1,
    "break": 1,
    "heartbeat": 2,
    "drain": 1,
    "expire": 1,
    "stall": 0.5,
    "restart": 0.5,
    "relay": 4,
    "lose": 0.5,
    "overdue": 1,
}
"""How often each event is drawn, relatively (faults rarer than traffic, so the caches
fill, evict and move between tiers in between)."""
MOVE_WEIGHTS = {
    "move": 3,
    "send": 3,
    "arrive": 3,
    "source_lost": 0.3,
    "abandon_move": 0.3,
    "reset": 0.4,
}
"""The events of moves between the replicas and of cache resets, drawn (beside the
others) only in cases run with `moves=True`: the cases without them draw the same
interleavings as before they existed."""
EVENTS = (*WEIGHTS, *MOVE_WEIGHTS)


def _draws(moves: bool) -> tuple[tuple[str, ...], np.ndarray]:
    weights = {**WEIGHTS, **(MOVE_WEIGHTS if moves else {})}
    p = np.asarray(list(weights.values())) / sum(weights.values())
    return tuple(weights), p


@dataclass
class World:
    """One case's parts and what the fake ingress knows."""

    model_dir: Path
    rng: np.random.Generator
    clock: Clock
    journal: MemoryJournal
    coord: CacheCoordinator
    workers: dict[str, Worker]
    replicas: dict[str, ModelReplica]
    unsent: list[Dispatch] = field(default_factory=list)
    sent: list[Dispatch] = field(default_factory=list)
    sessions: list[list[int]] = field(default_factory=list)
    session_of: dict[int, int] = field(default_factory=dict)
    uncached: dict[tuple[int, ...], list[int]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    checked: int = 0
    relays: list[RelayedCommit] = field(default_factory=list)
    """Commits the replicas relayed, not yet sent to the coordinator by the ingress."""
    relayed: list[RelayedCommit] = field(default_factory=list)
    """Those sent (a retry may send one again)."""
    moves: list[MoveTicket] = field(default_factory=list)
    """Moves begun at the coordinator and not yet ended here."""
    payloads: dict[int, Any] = field(default_factory=dict)
    """Import request id -> the payload its source exported (sent, not yet arrived)."""

    def backend(self, replica: ModelReplica | None = None) -> RayBackend:
        target = replica if replica is not None else _Router(self.replicas)
        return RayBackend(Handle(self.coord), Handle(target))  # type: ignore[arg-type]


class _Router:
    """The replicas' deployment handle: a pinned call reaches the replica it names."""

    def __init__(self, replicas: dict[str, ModelReplica]) -> None:
        self.replicas = replicas

    async def settle_many(self, batch: Any) -> list[str]:
        return await self.replicas[batch.replica_id].settle_many(batch)


def _check_window_rows(worker: Any) -> None:
    """A window-state model's running rows (`engine.window_rows`) are exactly those its
    running sequences hold, each once."""
    pool = worker.store.window_kv
    if pool is None:
        return
    pool.check()
    rows = [r for s in (*worker._running, *worker._prefilling) for r in s.window.rows]
    assert len(rows) == len(set(rows)) == pool.held, (len(rows), pool.held)


def make_world(model_dir: Path, seed: int) -> World:
    clock = Clock()
    clock.now = time.time()
    probe = make_worker(model_dir)
    device = 2 * (70 * probe.store.kv_bytes_per_token + 3 * probe.store.state_bytes)
    settings = make_settings(
        model_dir,
        cache_bytes=device,
        host_cache_bytes=10**8,
        host_placement="lru",
        max_batch_tokens=64,
        snapshot_every=7,
        commit_relay_s=0.0,  # `overdue` commits every relayed request not settled yet
    )
    journal = MemoryJournal()
    coord = _coordinator(settings, journal, clock)
    workers = {rid: make_worker(model_dir) for rid in REPLICAS}
    for rid, worker in workers.items():
        register(coord, worker, rid)
    replicas = {rid: make_replica(coord, workers[rid], rid) for rid in REPLICAS}
    for replica in replicas.values():  # an ingress reads channel "c": commits are relayed
        replica._outbox("c").subscribed = True
    rng = np.random.default_rng(seed)
    sessions = [rng.integers(7, 263, 20).tolist() for _ in range(4)]
    return World(model_dir, rng, clock, journal, coord, workers, replicas, sessions=sessions)


def _coordinator(settings: Any, journal: MemoryJournal, clock: Clock) -> CacheCoordinator:
    watch = StallWatch(1.0, 0.25, start=False)
    return CacheCoordinator(settings, journal=journal, clock=clock, stall_watch=watch)


# ------------------------------------------------------------------ events
async def event(world: World, kind: str) -> None:
    """Apply one event of `kind` (one that cannot apply now does nothing)."""
    world.counts[kind] = world.counts.get(kind, 0) + 1
    rng, coord = world.rng, world.coord
    if kind == "plan":
        i = int(rng.integers(len(world.sessions)))
        prompt = world.sessions[i] + rng.integers(7, 263, int(rng.integers(0, 6))).tolist()
        try:
            dispatch = coord.plan(np.asarray(prompt, np.int32), GREEDY)
        except (NoReplicaAvailable, Overloaded):  # none confirmed yet: the ingress waits
            return
        world.session_of[dispatch.order.request_id] = i
        world.unsent.append(dispatch)
    elif kind == "submit" and world.unsent:
        dispatch = world.unsent.pop(int(rng.integers(len(world.unsent))))
        replica = world.replicas[dispatch.replica_id]
        batch = Submissions(dispatch.replica_id, "c", (dispatch,), (True,))
        (answer,) = await replica.submit_many(batch)
        assert answer is None, answer
        world.sent.append(dispatch)
    elif kind == "misroute" and world.unsent:
        dispatch = world.unsent.pop(int(rng.integers(len(world.unsent))))
        other = world.replicas[next(r for r in REPLICAS if r != dispatch.replica_id)]
        batch = Submissions(dispatch.replica_id, "c", (dispatch,), (True,))
        (answer,) = await other.submit_many(batch)
        assert isinstance(answer, WrongReplica)
        await world.backend().settle_failed(dispatch, answer)
    elif kind == "forget" and world.unsent:  # a client left while its plan was unsent
        coord.abandon(world.unsent.pop(int(rng.integers(len(world.unsent)))))
    elif kind == "step":
        replica = world.replicas[REPLICAS[int(rng.integers(2))]]
        if replica._reconcile_due:
            await replica._reconcile()
        if not replica._idle():
            await replica._step()
        _collect(world, replica)
    elif kind in ("settle", "break") and world.sent:
        dispatch = world.sent[int(rng.integers(len(world.sent)))]
        replica = world.replicas[dispatch.replica_id]
        if kind == "settle":
            await replica.settle(dispatch)
        else:  # the channel broke: the ingress asks the replica before it re-plans
            cause = ActorUnavailableError("channel broke", b"\x00" * 16)
            await world.backend().settle_failed(dispatch, cause)
    elif kind == "heartbeat":
        await _heartbeat(world, REPLICAS[int(rng.integers(2))])
    elif kind == "drain":
        await world.replicas[REPLICAS[int(rng.integers(2))]]._drain()
    elif kind == "expire":  # time passes, the replicas beating: unsent plans expire
        for _ in range(5):
            world.clock.now += LEASE * (1 + LEASE_GRACE) / 4
            for rid in REPLICAS:
                await _heartbeat(world, rid)
    elif kind == "relay" and (world.relays or world.relayed):
        # the ingress's next call carries a relayed commit; now and then one sent already
        again = world.relayed and (not world.relays or rng.random() < 0.2)
        pool = world.relayed if again else world.relays
        commit = pool[int(rng.integers(len(pool)))]
        if not again:
            world.relays.remove(commit)
            world.relayed.append(commit)
        (applied,), _ = coord.step_many([commit], [])
        outcome = "relay_applied" if applied else "relay_dropped"
        world.counts[outcome] = world.counts.get(outcome, 0) + 1
    elif kind == "lose" and world.relays:  # the ingress died holding a relayed commit
        world.relays.pop(int(rng.integers(len(world.relays))))
    elif kind == "overdue":  # the replica commits what its ingress has not
        replica = world.replicas[REPLICAS[int(rng.integers(2))]]
        waiting = len(replica._relayed)
        await replica._commit_overdue()
        world.counts["overdue_commits"] = world.counts.get("overdue_commits", 0) + waiting
    elif kind == "move":
        src, dst = (REPLICAS[0], REPLICAS[1]) if rng.random() < 0.5 else REPLICAS[::-1]
        prompt = world.sessions[int(rng.integers(len(world.sessions)))]
        try:
            ticket = coord.begin_move(src, dst, np.asarray(prompt, np.int32), "remote_hit")
        except KeyError:  # a replica dropped meanwhile
            return
        if ticket is not None:
            world.moves.append(ticket)
            world.counts["begun"] = world.counts.get("begun", 0) + 1
    elif kind == "send" and world.moves:
        ticket = world.moves[int(rng.integers(len(world.moves)))]
        if ticket.import_request not in world.payloads:
            store = world.workers[ticket.source].store
            try:  # the pin held it: a source whose store lost it was reset meanwhile
                world.payloads[ticket.import_request] = export_ticket(store, ticket)
            except ValueError:
                world.payloads[ticket.import_request] = None
    elif kind == "arrive":
        sent = [t for t in world.moves if t.import_request in world.payloads]
        if sent:
            ticket = sent[int(rng.integers(len(sent)))]
            await _arrive(world, ticket, corrupt=rng.random() < 0.2)
    elif kind == "source_lost" and world.moves:  # the source died mid-move
        ticket = world.moves.pop(int(rng.integers(len(world.moves))))
        world.payloads.pop(ticket.import_request, None)
        await _finish(world, ticket, None)
    elif kind == "abandon_move" and world.moves:  # the mover died: the leases end it
        ticket = world.moves.pop(int(rng.integers(len(world.moves))))
        world.payloads.pop(ticket.import_request, None)
    elif kind == "reset":  # the coordinator forgets a replica's cache; it registers again
        rid = REPLICAS[int(rng.integers(2))]
        running = world.workers[rid].num_running
        coord.unregister_replica(rid)
        await _heartbeat(world, rid)  # "register": a new generation, a reconcile due
        world.counts["reset_while_running"] = world.counts.get("reset_while_running", 0) + (
            running > 0
        )
    elif kind == "stall":
        world.clock.now += 2 * LEASE
        watch = coord.stall_watch
        watch.tick(watch._last + 2 * LEASE)
        await _heartbeat(world, REPLICAS[int(rng.integers(2))])
    elif kind == "restart":
        world.coord = _coordinator(coord.settings, world.journal, world.clock)
        for replica in world.replicas.values():
            replica.coordinator = Handle(world.coord)
        for rid in REPLICAS:
            await _heartbeat(world, rid)


async def _arrive(world: World, ticket: MoveTicket, corrupt: bool) -> None:
    """The receiver's side of a move, in one go between two of its steps, as its loop
    runs it (`replica.receiver`): import the payload, end the move at the coordinator,
    free what the coordinator hands back."""
    world.moves.remove(ticket)
    payload = world.payloads.pop(ticket.import_request)
    replica = world.replicas[ticket.receiver]
    if payload is not None and corrupt:
        key = next(iter(payload.tensors))
        payload.tensors[key][-1] += 1.0
    if ticket.receiver_generation != replica.generation:  # reset meanwhile: refused
        result = None
        world.counts["stale"] = world.counts.get("stale", 0) + 1
    else:
        result = import_ticket(world.workers[ticket.receiver].store, payload, ticket)
        outcome = "arrived" if result.ok else "refused"
        world.counts[outcome] = world.counts.get(outcome, 0) + 1
    await _finish(world, ticket, result)


async def _finish(world: World, ticket: MoveTicket, result: Any) -> None:
    direct = world.coord.finish_move(ticket, result)
    if direct.states or len(direct.slots):
        await world.replicas[ticket.receiver]._release_now(direct)


async def _heartbeat(world: World, rid: str) -> None:
    """One of the replica's heartbeats (`ModelReplica._beat`)."""
    await world.replicas[rid]._beat()


def _collect(world: World, replica: ModelReplica) -> None:
    """Check every request that completed at its length against an uncached run, and
    carry the session on with its output."""
    outbox = replica._outboxes.get("c")
    if outbox is None:
        return
    for rid in list(outbox._items):
        got = items(replica, rid)
        if not got or not isinstance(got[-1], Completed):
            if got and isinstance(got[-1], BaseException):
                del outbox._items[rid]
            continue
        del outbox._items[rid]
        tokens = [e.token for e in got if isinstance(e, TokenEvent)]
        dispatch = next((d for d in world.sent if d.order.request_id == rid), None)
        end = got[-1]
        if end.commit is not None and dispatch is not None:
            world.relays.append(
                RelayedCommit(dispatch.replica_id, dispatch.generation, end.commit, end.applied)
            )
        if dispatch is None or got[-1].finish_reason != "length":
            continue
        prompt = dispatch.order.prompt
        assert tokens == _uncached(world, prompt), f"request {rid}: a wrong output"
        session = world.session_of.get(rid)
        if session is not None:
            tail = world.rng.integers(7, 263, 3).tolist()
            world.sessions[session] = [*prompt.tolist(), *tokens, *tail][-120:]


def _uncached(world: World, prompt: np.ndarray) -> list[int]:
    key = tuple(int(t) for t in prompt)
    if key not in world.uncached:
        worker = make_worker(world.model_dir)
        worker.start(PrefillOrder(1, np.asarray(prompt, np.int32), GREEDY, GREEDY.max_tokens))
        while worker.num_running:
            worker.step()
        (done,) = worker.take_finished()
        world.uncached[key] = list(done.tokens)
    return world.uncached[key]


# ------------------------------------------------------------------ the reference
def check(world: World) -> None:
    """The checks after every event (see the module docstring)."""
    world.checked += 1
    for rid in REPLICAS:
        replica, worker = world.replicas[rid], world.workers[rid]
        assert refused(replica) == [], f"replica {rid}: {refused(replica)}"
        if rid not in world.coord.planners or replica._reconcile_due:
            continue  # dropped or awaiting a reconcile: compared after it
        release_log = world.coord.state.log_of(rid)
        if release_log.generation != replica._cursor.generation:
            continue  # reset: the replica learns of it at its next call
        pending = release_log.pending(replica._cursor.applied) + replica._release
        pending = pending + replica._relayed.owned()  # the relayed requests' own, held
        states, slots, host_states, host_slots = held(worker)
        _check_window_rows(worker)
        cache = world.coord.planners[rid].cache
        tree_states, tree_slots = cache.referenced()
        freed_states = set(pending.states)
        freed_slots = set(np.asarray(pending.slots).tolist())
        assert states == tree_states | freed_states, (rid, "states", world.counts)
        assert slots == tree_slots | freed_slots, (rid, "slots", world.counts)
        moving_states = {s for m in pending.moves for s in m.states}
        moving_slots = {s for m in pending.moves for s in np.asarray(m.slots).tolist()}
        tree_host_states, tree_host_slots = cache.referenced_on_host()
        assert not ((host_states ^ tree_host_states) & tree_states) - moving_states, rid
        assert not ((host_slots ^ tree_host_slots) & tree_slots) - moving_slots, rid


async def settle_all(world: World) -> None:
    """Close every plan (unsent ones abandoned), run both replicas to idle, reconcile."""
    for dispatch in world.unsent:
        world.coord.abandon(dispatch)
    world.unsent = []
    for ticket in list(world.moves):  # moves still on their way end (their sources lost)
        world.moves.remove(ticket)
        world.payloads.pop(ticket.import_request, None)
        await _finish(world, ticket, None)
    for rid in REPLICAS:
        await _heartbeat(world, rid)
        await run_until_idle(world.replicas[rid])
        _collect(world, world.replicas[rid])
    await event(world, "expire")  # plans sent to nobody expire
    for rid in REPLICAS:
        await run_until_idle(world.replicas[rid])
        _collect(world, world.replicas[rid])
    world.coord.step_many(world.relays, [])  # the ingress sends what it still holds
    world.relays = []
    for rid in REPLICAS:
        await world.replicas[rid]._commit_overdue()
        await world.replicas[rid]._drain()
        assert len(world.replicas[rid]._relayed) == 0, rid


class WorldTime:
    """The replicas' `time` module in a case: wall-clock seconds are the world's (the
    coordinator's `Clock`, which `expire` and `stall` move), monotonic ones are real.

    Deadlines are wall-clock times compared on both sides: the coordinator aborts a lease
    past its deadline plus a grace, a replica refuses a dispatch past its deadline
    (`ModelReplica._stale`, `_renew`). With the replicas on the real clock, a dispatch
    whose plan an `expire` had already aborted (its hit unlocked) could still start, and
    read a hit the cache then demoted or freed under it: a wrong output no deployment
    can produce."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def time(self) -> float:
        return self.clock.now

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()


def world_time(world: World) -> Any:
    """A context in which the replicas' wall clock is `world.clock` (`WorldTime`)."""
    return mock.patch.object(deployment, "time", WorldTime(world.clock))


def run_case(model_dir: Path, seed: int, events: int, moves: bool = False) -> dict[str, int]:
    """One case: `events` random events (with `moves`, moves and resets among them),
    checked after each; then everything closed and each store compared with its tree
    exactly. Returns how often each event ran."""
    world = make_world(model_dir, seed)
    kinds, p = _draws(moves)

    async def main() -> None:
        for _ in range(events):
            await event(world, str(world.rng.choice(kinds, p=p)))
            check(world)
        await settle_all(world)
        check(world)

    with world_time(world):
        asyncio.run(main())
    for rid in REPLICAS:
        assert refused(world.replicas[rid]) == []
        assert world.coord.planners[rid].open_requests == 0
        in_step(world.coord, world.workers[rid], rid)
    assert len(world.coord.leases) == 0
    return {**world.counts, "checks": world.checked}
