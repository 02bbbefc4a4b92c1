"""Every state and KV slot the cache lets go of is freed exactly once, and every tier move
applied once and in the order the cache decided, whoever ends a plan and in whatever
order the carriers of its release arrive. No Ray: a real `CacheCoordinator`, a real
tiny-model `Worker` (real ids and tiers) and, where the replica's side matters, the real
`ModelReplica` methods (`replica_harness`).

Each test ends with the store holding exactly what the tree refers to, in the tier the
tree says, and nothing refused (a second free of an id is a refusal of the store).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coordinator_helpers import (
    GREEDY,
    LEASE,
    Clock,
    applied,
    apply,
    make_settings,
    make_worker,
    register,
    sessions,
    turn,
)
from ray.exceptions import ActorUnavailableError
from replica_harness import Handle, in_step, items, make_replica, refused, run_until_idle, submit

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import Move, PrefillOrder, Release, TokenEvent
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.coordinator.leases import LEASE_GRACE
from marconi_ray.serve.coordinator.stall_watch import StallWatch
from marconi_ray.serve.ingress.ray_backend import RayBackend
from marconi_ray.serve.messages import Dispatch, MisroutedDispatch, ReplicaFailed, WrongReplica

EXPIRED = LEASE * (1 + LEASE_GRACE) + 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("exactly_once") / "tiny")


def _setup(
    model_dir: Path, tiers: bool = False, **kw: Any
) -> tuple[CacheCoordinator, Worker, Clock]:
    """A coordinator (a small device cache; with `tiers` a host tier, LRU placement) and
    its replica's worker, after a few sessions."""
    clock = Clock()
    clock.now = time.time()  # replicas compare lease deadlines with their own clock
    if tiers:
        probe = make_worker(model_dir).store
        kw = {
            "cache_bytes": 2 * (70 * probe.kv_bytes_per_token + 3 * probe.state_bytes),
            "host_cache_bytes": 10**8,
            "host_placement": "lru",
            **kw,
        }
    settings = make_settings(model_dir, **{"cache_bytes": 1_500_000, **kw})
    watch = StallWatch(1.0, 0.25, start=False)
    coord = CacheCoordinator(settings, journal=MemoryJournal(), clock=clock, stall_watch=watch)
    worker = make_worker(model_dir)
    register(coord, worker)
    sessions(coord, worker, n=3, turns=2)
    return coord, worker, clock


def _plans(coord: CacheCoordinator, worker: Worker, want: str, n: int = 1) -> list[Dispatch]:
    """Serve new prompts (planned, run, committed) until `n` plans free (`want` "frees")
    or move (`want` "moves") something; those dispatches, not run."""
    rng = np.random.default_rng(11)
    found: list[Dispatch] = []
    for _ in range(300):
        before = coord.state.log_of("r0").last
        dispatch = coord.plan(rng.integers(7, 263, 40).astype(np.int32), GREEDY)
        own = dispatch.releases.entries[-1].release if dispatch.needs > before else Release()
        if (want == "frees" and (own.states or len(own.slots))) or (want == "moves" and own.moves):
            found.append(dispatch)
            if len(found) == n:
                return found
            continue
        if found:  # the ones found stay consecutive: this one never starts either
            coord.abandon(dispatch)
            continue
        apply(worker, dispatch.releases)
        worker.start(dispatch.order)
        while worker.num_running:
            worker.step()
        (done,) = worker.take_finished()
        apply(worker, coord.commit(dispatch.replica_id, done, applied(worker)))
    raise AssertionError(f"no plan {want} anything")


def _finish(coord: CacheCoordinator, worker: Worker) -> None:
    """Apply what is left of the log and check the store against the tree."""
    apply(worker, coord.drain("r0", applied(worker)))
    in_step(coord, worker)


def _uncached(model_dir: Path, prompt: np.ndarray, max_tokens: int) -> list[int]:
    """Greedy tokens of `prompt` on a fresh worker, no cache."""
    worker = make_worker(model_dir)
    params = GREEDY.__class__(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    worker.start(PrefillOrder(1, prompt, params, max_tokens))
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    return list(done.tokens)


# ------------------------------------------------------------------ plans ended unstarted
def test_a_dispatch_that_never_arrives_has_its_evictions_freed_at_lease_expiry(model_dir):
    """The ingress died after the plan: the lease expires and the plan's evictions reach
    the store with the log (the next drain), once."""
    coord, worker, clock = _setup(model_dir)
    (dispatch,) = _plans(coord, worker, "frees")
    clock.now += EXPIRED
    coord.heartbeat("r0", [], applied(worker))
    drained = coord.drain("r0", applied(worker))
    assert dispatch.releases.entries[-1] in drained.entries
    _finish(coord, worker)


def test_a_started_request_whose_lease_expires_is_not_freed_twice(model_dir):
    """The replica started the order (applying its entries); its lease then expires (the
    replica went quiet): the late commit frees only what the request stored, once."""
    coord, worker, clock = _setup(model_dir)
    (dispatch,) = _plans(coord, worker, "frees")
    apply(worker, dispatch.releases)
    worker.start(dispatch.order)
    clock.now += EXPIRED
    coord.heartbeat("r0", [], applied(worker))
    apply(worker, coord.drain("r0", applied(worker)))
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    apply(worker, coord.commit("r0", done, applied(worker)))  # an orphan commit now
    _finish(coord, worker)


def test_abandon_after_expiry_and_a_repeated_abandon_free_nothing_twice(model_dir):
    coord, worker, clock = _setup(model_dir)
    (dispatch,) = _plans(coord, worker, "frees")
    clock.now += EXPIRED
    coord.heartbeat("r0", [], applied(worker))
    coord.abandon(dispatch)
    coord.abandon(dispatch)
    _finish(coord, worker)


def test_reconcile_after_a_restart_keeps_what_the_log_still_frees(model_dir):
    """A coordinator restart, then an abandon, then the replica reconciles: reconcile does
    not free what the log frees (the log does, once)."""
    coord, worker, _ = _setup(model_dir)
    (dispatch,) = _plans(coord, worker, "frees")
    restarted = CacheCoordinator(coord.settings, journal=coord.journal, clock=coord.clock)
    restarted.abandon(dispatch)
    states, slots = worker.holdings()
    _, answer = restarted.reconcile("r0", states, slots, applied=applied(worker))
    assert not set(answer.direct.states) & set(dispatch.releases.entries[-1].release.states)
    apply(worker, answer)
    _finish(restarted, worker)


def test_a_dispatch_planned_before_a_restart_starts_after_the_reconcile(model_dir):
    """A dispatch planned before a coordinator restart arrives after the replica
    reconciled: what it frees was left to it, it brings it, and the request commits."""
    coord, worker, _ = _setup(model_dir)
    (dispatch,) = _plans(coord, worker, "frees")
    restarted = CacheCoordinator(coord.settings, journal=coord.journal, clock=coord.clock)
    states, slots = worker.holdings()
    _, answer = restarted.reconcile("r0", states, slots, applied=applied(worker))
    apply(worker, answer)
    apply(worker, dispatch.releases)
    worker.start(dispatch.order)
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    apply(worker, restarted.commit("r0", done, applied(worker)))
    _finish(restarted, worker)


# ------------------------------------------------------------------ the findings
def test_an_ingress_fault_on_a_started_request_frees_nothing_twice_and_answers_right(model_dir):
    """Finding 1: the channel broke (`ActorUnavailableError`) after the replica started
    the order. The ingress used to abandon the plan at once, so what the dispatch carried
    was freed again; now it asks the replica, which stops the request and commits it. The
    next turn of the session, cached, answers as an uncached run does."""
    coord, worker, _ = _setup(model_dir)
    (dispatch,) = _plans(coord, worker, "frees")
    replica = make_replica(coord, worker)
    backend = RayBackend(Handle(coord), Handle(replica))  # type: ignore[arg-type]

    async def main() -> list[int]:
        assert await submit(replica, dispatch) == [None]
        await replica._step()  # it starts: its entries are applied
        await backend.settle_failed(dispatch, ActorUnavailableError("gone", b"\x00" * 16))
        await run_until_idle(replica)
        return [e.token for e in items(replica, rid) if isinstance(e, TokenEvent)]

    rid = dispatch.order.request_id
    output = asyncio.run(main())
    assert refused(replica) == [] and not coord.state.is_planned("r0", dispatch.order.request_id)
    in_step(coord, worker)
    turn = np.asarray([*output, 30, 31, 32, 33], dtype=np.int32)
    follow = np.concatenate([dispatch.order.prompt, turn])
    again = coord.plan(follow, GREEDY)
    assert again.order.hit_len > len(dispatch.order.prompt)  # its own last state
    apply(worker, again.releases)
    worker.start(again.order)
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    assert list(done.tokens) == _uncached(model_dir, follow, GREEDY.max_tokens)


def test_a_release_that_only_moves_reaches_the_store_when_its_plan_ends_unstarted(model_dir):
    """Finding 2: a plan whose release only promotes or demotes, abandoned unstarted: the
    moves reach the store (with the log) and the tiers agree."""
    coord, worker, _ = _setup(model_dir, tiers=True)
    (dispatch,) = _plans(coord, worker, "moves")
    coord.abandon(dispatch)
    _finish(coord, worker)
    assert coord.planners["r0"].cache.referenced_on_host() != (set(), set())


def test_moves_apply_in_the_cache_order_whatever_order_the_dispatches_arrive_in(model_dir):
    """Finding 3: several plans that move ids; the later ones reach the replica first,
    the first never does (abandoned). Every move is applied once, in the cache's order:
    nothing is refused and the tiers agree."""
    coord, worker, _ = _setup(model_dir, tiers=True)
    dispatches = _plans(coord, worker, "moves", n=3)
    replica = make_replica(coord, worker)

    async def main() -> None:
        coord.abandon(dispatches[0])
        for dispatch in reversed(dispatches[1:]):
            assert await submit(replica, dispatch) == [None]
            await replica._step()
        await run_until_idle(replica)

    asyncio.run(main())
    assert refused(replica) == []
    in_step(coord, worker)


def test_an_order_starts_after_its_own_release(model_dir):
    """Finding 4: the step that starts an order applies that order's release first, so
    evicted ids leave the store in that step and a moved hit is where the tree says."""
    coord, worker, _ = _setup(model_dir, tiers=True)
    (dispatch,) = _plans(coord, worker, "moves")
    replica = make_replica(coord, worker)
    release = dispatch.releases.entries[-1].release

    async def main() -> None:
        await submit(replica, dispatch)
        await replica._step()  # starts it
        states, _ = worker.holdings()
        assert not set(release.states) & set(states), "evicted ids kept a step too long"
        for move in release.moves:
            on_host = set(worker.store.host_slot_ids().tolist())
            ids = set(np.asarray(move.slots).tolist())
            assert ids <= on_host if move.to_host else not ids & on_host
        await run_until_idle(replica)

    asyncio.run(main())
    assert refused(replica) == []
    in_step(coord, worker)


def test_a_stop_for_a_queued_request_is_kept_and_it_never_runs(model_dir):
    """Finding 5: the client of a dispatch queued behind the token budget leaves: it
    leaves the queue, never starts, and its plan is aborted by the replica."""
    coord, worker, _ = _setup(model_dir, max_batch_tokens=40)
    rng = np.random.default_rng(5)
    first, second = (coord.plan(rng.integers(7, 263, 40).astype(np.int32), GREEDY) for _ in "ab")
    replica = make_replica(coord, worker)
    rid = second.order.request_id

    async def main() -> None:
        await submit(replica, first, second)
        await replica._step()  # the budget admits the first only
        assert [d.order.request_id for d in replica._pending] == [rid]
        assert await replica.settle(second) == "stopped"
        await run_until_idle(replica)
        assert isinstance(items(replica, rid)[-1], ReplicaFailed)

    asyncio.run(main())
    assert not coord.state.is_planned("r0", rid) and not coord.leases.deadline(rid)
    assert rid not in worker.running_ids() and refused(replica) == []
    in_step(coord, worker)


def test_a_stale_dispatch_is_released_by_the_replica_that_refuses_it(model_dir):
    """A dispatch that reaches its replica past its lease is refused there, and that
    replica (which knows it never started) aborts its plan: the ingress guesses nothing."""
    coord, worker, _ = _setup(model_dir)
    (dispatch,) = _plans(coord, worker, "frees")
    replica = make_replica(coord, worker)
    stale = Dispatch(
        dispatch.replica_id,
        dispatch.order,
        dispatch.releases,
        dispatch.generation,
        0.0,
        dispatch.needs,
    )

    async def main() -> None:
        await submit(replica, stale)
        await run_until_idle(replica)
        assert isinstance(items(replica, stale.order.request_id)[-1], MisroutedDispatch)

    asyncio.run(main())
    assert not coord.state.is_planned("r0", dispatch.order.request_id)
    assert refused(replica) == []
    in_step(coord, worker)


def test_a_replan_whose_client_leaves_is_abandoned(model_dir):
    """Finding 8: the client leaves while its request is being planned again: the plan
    made meanwhile is abandoned (nobody sent it), not held until its lease expires."""
    coord, worker, _ = _setup(model_dir)
    backend = RayBackend(Handle(coord), Handle(None))  # type: ignore[arg-type]
    prompt = np.arange(7, 47, dtype=np.int32)

    async def main() -> None:
        task = asyncio.ensure_future(backend.plan_shielded(prompt, GREEDY, 0.0))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(20):  # the plan completes, then its abandon runs
            await asyncio.sleep(0.01)

    asyncio.run(main())
    assert len(coord.leases) == 0 and coord.planners["r0"].open_requests == 0
    _finish(coord, worker)


def test_a_call_for_another_replica_is_refused_as_such_and_its_plan_abandoned(model_dir):
    """Finding 11: a pinned call that reaches the wrong replica is answered with a
    refusal (`WrongReplica`, "misrouted"), not an error, and counted; the ingress then
    abandons the plan (its replica never received it)."""
    coord, worker, _ = _setup(model_dir)
    (dispatch,) = _plans(coord, worker, "frees")
    other = make_worker(model_dir)
    register(coord, other, "r1")
    wrong = make_replica(coord, other, "r1")
    backend = RayBackend(Handle(coord), Handle(wrong))  # type: ignore[arg-type]

    async def main() -> None:
        (answer,) = await submit_to(wrong, dispatch)
        assert isinstance(answer, WrongReplica)
        assert await wrong.settle_many(settlements(dispatch)) == ["misrouted"]
        await backend.settle_failed(dispatch, answer)

    asyncio.run(main())
    assert wrong.misrouted == 2 and not coord.state.is_planned("r0", dispatch.order.request_id)
    _finish(coord, worker)


def submit_to(replica: Any, dispatch: Dispatch) -> Any:
    from marconi_ray.serve.messages import Submissions

    return replica.submit_many(Submissions(dispatch.replica_id, "c", (dispatch,), (True,)))


def settlements(dispatch: Dispatch) -> Any:
    from marconi_ray.serve.messages import Settlements

    return Settlements(dispatch.replica_id, (dispatch,))


def test_a_refused_release_keeps_its_valid_frees_and_the_replica_reconciles(model_dir):
    """A release whose moves the store refuses (here: a slot already on the device) still
    frees what it frees; the replica logs and counts it, reconciles at once (tiers
    included) and the count reaches the coordinator's stats (`/metrics`)."""
    coord, worker, _ = _setup(model_dir, tiers=True)
    replica = make_replica(coord, worker)
    on_device = np.setdiff1d(worker.store.used_slots(), worker.store.host_slot_ids())[:1]
    spare = worker.store.alloc_slots(2)  # held by nobody the cache knows
    replica._release = Release(slots=spare, moves=(Move(False, (), on_device),))

    async def main() -> None:
        await replica._drain()
        assert replica._reconcile_due
        assert not set(spare.tolist()) & set(worker.store.used_slots().tolist())
        await replica._reconcile()

    asyncio.run(main())
    assert len(refused(replica)) == 1 and "already on" in refused(replica)[0]
    assert coord.stats()[0].refused_releases == 1
    in_step(coord, worker)


def test_a_running_request_keeps_its_hit_kv_on_the_device(model_dir):
    """A running request reads its hit's KV in place, in the device rows of its slots. Its
    plan locks the hit node only; its ancestors, unlocked, are eviction candidates while
    it runs, and with a host tier a victim is demoted: its edge's KV moves to the host and
    its device rows are reused by the next prefill, under the running request's reads. So
    the KV on the path of an open plan's hit stays on the device (an ancestor may give up
    its state only): here a third turn, whose hit spans the node of the first turn, runs
    while new prompts evict everything else, and answers as an uncached run does."""
    coord, worker, _ = _setup(model_dir, tiers=True)
    rng = np.random.default_rng(17)
    first = rng.integers(7, 263, 30).tolist()
    out, _ = turn(coord, worker, first)
    second = [*first, *out, *rng.integers(7, 263, 6).tolist()]
    out, _ = turn(coord, worker, second)
    third = np.asarray([*second, *out, *rng.integers(7, 263, 6).tolist()], dtype=np.int32)
    long = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    running = coord.plan(third, long)
    assert running.order.hit_len == len(second) + GREEDY.max_tokens  # two nodes deep
    apply(worker, running.releases)
    worker.start(running.order)  # its hit is read in place from now on
    hit = set(running.order.hit_slots.tolist())
    others = [coord.plan(rng.integers(7, 263, 40).astype(np.int32), GREEDY) for _ in range(4)]
    moved = {  # by the log entries after the running one started
        s
        for entry in coord.drain("r0", applied(worker)).entries
        if entry.seq > running.needs
        for move in entry.release.moves
        if move.to_host
        for s in np.asarray(move.slots).tolist()
    }
    assert not moved & hit, "the KV of a running request's hit was demoted"
    outputs: dict[int, list[int]] = {}
    apply(worker, others[-1].releases)  # the moves, then the new prefills reuse rows
    for dispatch in others:
        worker.start(dispatch.order)
    while worker.num_running:
        worker.step()
        for done in worker.take_finished():
            outputs[done.request_id] = list(done.tokens)
            apply(worker, coord.commit("r0", done, applied(worker)))
    got = outputs[running.order.request_id]
    assert got == _uncached(model_dir, third, long.max_tokens)
    _finish(coord, worker)


# ------------------------------------------------------------------ a paused coordinator
def test_a_paused_coordinator_drops_no_replica_whose_beats_waited_in_its_queue(model_dir):
    """Finding 10: the coordinator stood still for longer than a lease; the first call it
    serves after is one replica's heartbeat. The other replica, whose heartbeat still
    waits in the queue, is not dropped, nor any lease expired; silence is then judged
    from the resume on."""
    coord, worker, clock = _setup(model_dir)
    register(coord, make_worker(model_dir), "r1")
    dispatch = coord.plan(np.arange(7, 47, dtype=np.int32), GREEDY)
    rid = dispatch.order.request_id
    clock.now += 3 * LEASE  # the pause, on the wall clock ...
    coord.stall_watch.tick(coord.stall_watch._last + 3 * LEASE)  # ... seen by its thread
    coord.heartbeat("r0", [], applied(worker))
    assert set(coord.planners) == {"r0", "r1"} and coord.state.is_planned(dispatch.replica_id, rid)
    assert coord.stall_watch.stalls == 1
    clock.now += LEASE + 1  # r1 stays silent after the resume: now it is dropped
    coord.heartbeat("r0", [], applied(worker))
    assert set(coord.planners) == {"r0"}
