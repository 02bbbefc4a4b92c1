"""Commits relayed through the ingress (`settings.commit_relay`): a request's commit
leaves the replica with its `Completed`, the ingress sends it in its next coordinator call
(`PlanBatcher` -> `step_many`), and the replica learns every plan's end from its release
log (`Release.settled`). Whatever the order of the relay, the replica's own overdue
commit, a lease expiry and a repeat, each id is freed once and the cache keeps the
request's states. No Ray: the real `CacheCoordinator`, a real tiny-model `Worker` and the
real `ModelReplica` methods (`replica_harness`); the ingress side is the real
`PlanBatcher` and `RayBackend.relay`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from coordinator_helpers import GREEDY, LEASE, Clock, make_settings, make_worker, register
from replica_harness import Handle, in_step, items, make_replica, refused, run_until_idle, submit

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.coordinator.leases import LEASE_GRACE
from marconi_ray.serve.coordinator.stall_watch import StallWatch
from marconi_ray.serve.ingress.plan_batcher import PlanBatcher
from marconi_ray.serve.messages import Completed, Dispatch, RelayedCommit
from marconi_ray.serve.replica.deployment import ModelReplica

EXPIRED = LEASE * (1 + LEASE_GRACE) + 1


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("relay") / "tiny")


def _setup(model_dir: Path, **kw: Any) -> tuple[CacheCoordinator, ModelReplica, Clock]:
    """A coordinator and one replica whose channel "c" an ingress reads."""
    clock = Clock()
    clock.now = time.time()  # replicas compare lease deadlines with their own clock
    settings = make_settings(model_dir, **{"cache_bytes": 1_500_000, **kw})
    watch = StallWatch(1.0, 0.25, start=False)
    coord = CacheCoordinator(settings, journal=MemoryJournal(), clock=clock, stall_watch=watch)
    worker = make_worker(model_dir)
    register(coord, worker)
    replica = make_replica(coord, worker)
    replica._outbox("c").subscribed = True
    return coord, replica, clock


async def _run(coord: CacheCoordinator, replica: ModelReplica, prompt: list[int]) -> Any:
    """Plan `prompt`, submit it on channel "c", step until it ends: (its dispatch, its
    Completed as the channel carries it)."""
    dispatch = coord.plan(np.asarray(prompt, np.int32), GREEDY)
    assert await submit(replica, dispatch) == [None]
    for _ in range(200):
        end = items(replica, dispatch.order.request_id)
        if end and isinstance(end[-1], Completed):
            break
        await replica._step()
    else:
        raise AssertionError("the request never completed")
    replica._outboxes["c"]._items.pop(dispatch.order.request_id)
    return dispatch, end[-1]


def _relay(dispatch: Dispatch, end: Completed) -> RelayedCommit:
    assert end.commit is not None, "the replica relays the commit of a channel's request"
    return RelayedCommit(dispatch.replica_id, dispatch.generation, end.commit, end.applied)


def _settled(coord: CacheCoordinator, replica: ModelReplica) -> None:
    """The replica drains its log; nothing waits for a relay, the store equals the tree."""
    assert len(replica._relayed) == 0
    assert refused(replica) == []
    worker = replica.shards.worker  # type: ignore[attr-defined]
    in_step(coord, worker)


def test_a_relayed_commit_is_applied_and_the_next_turn_hits_it(model_dir):
    """The ingress sends the commit with its next call (a plan of another request in the
    same `step_many`): the commit is applied first, the replica settles it from the log,
    and the session's next turn hits the whole previous turn."""
    coord, replica, _ = _setup(model_dir)
    prompt = list(range(7, 47))

    async def main() -> None:
        dispatch, end = await _run(coord, replica, prompt)
        assert coord.state.is_planned("r0", dispatch.order.request_id)
        assert replica._live() == [dispatch.order.request_id], "its lease stays renewed"
        batcher = PlanBatcher(Handle(coord))
        turn2 = [*prompt, *end.commit.tokens, 300, 301]
        applied, planned = await asyncio.gather(
            batcher.commit(_relay(dispatch, end)),
            batcher.plan(np.asarray(turn2, np.int32), GREEDY, 0.0),
        )
        assert applied is True and batcher.calls == 1 and batcher.commits == 1
        assert planned.order.hit_len == len(prompt) + len(end.commit.tokens)
        coord.abandon(planned)
        await replica._drain()
        _settled(coord, replica)

    asyncio.run(main())


def test_a_lost_relay_is_committed_by_the_replica_and_a_late_one_is_dropped(model_dir):
    """The ingress died holding the commit: the replica commits it after commit_relay_s;
    the relay arriving after that is dropped, and nothing is freed twice."""
    coord, replica, _ = _setup(model_dir, commit_relay_s=0.0)
    prompt = list(range(9, 60))

    async def main() -> None:
        dispatch, end = await _run(coord, replica, prompt)
        await replica._commit_overdue()
        assert not coord.state.is_planned("r0", dispatch.order.request_id)
        assert coord.relayed_commit(_relay(dispatch, end)) is False
        await run_until_idle(replica)
        _settled(coord, replica)
        again = coord.plan(np.asarray([*prompt, *end.commit.tokens, 5], np.int32), GREEDY)
        assert again.order.hit_len == len(prompt) + len(end.commit.tokens)
        coord.abandon(again)

    asyncio.run(main())


def test_a_relay_applied_while_the_replica_commits_it_too_is_freed_once(model_dir):
    """The relay lands, then the replica's own overdue commit of the same request (it
    had not read the log entry yet): the coordinator drops the repeat, the entry settles
    the request, each id the cache did not keep is freed once."""
    coord, replica, _ = _setup(model_dir, commit_relay_s=0.0, cache_bytes=60_000)

    async def main() -> None:
        for k in range(4):  # smaller than one request: its commit frees some of its own ids
            dispatch, end = await _run(coord, replica, list(range(11 + k, 80 + 7 * k)))
            assert coord.relayed_commit(_relay(dispatch, end)) is True
            await replica._commit_overdue()
            assert coord.relayed_commit(_relay(dispatch, end)) is False, "a repeat"
            await run_until_idle(replica)
            _settled(coord, replica)

    asyncio.run(main())


def test_a_plan_whose_lease_expired_before_the_relay_frees_what_it_stored_once(model_dir):
    """The relay comes after the lease expired (its abort names the request with nothing
    taken): the relay is dropped and the replica frees what the request stored itself,
    when it reads that entry."""
    coord, replica, clock = _setup(model_dir)

    async def main() -> None:
        dispatch, end = await _run(coord, replica, list(range(13, 70)))
        worker = replica.shards.worker  # type: ignore[attr-defined]
        stored = set(end.commit.state_ids.values())
        states, _ = worker.holdings()
        assert stored and stored <= set(states), "the request's states wait in the store"
        clock.now += EXPIRED
        coord.heartbeat("r0", [])  # the replica went quiet: no renewal
        assert not coord.state.is_planned("r0", dispatch.order.request_id)
        assert coord.relayed_commit(_relay(dispatch, end)) is False
        await replica._drain()
        _settled(coord, replica)
        states, _ = worker.holdings()
        assert not stored & set(states)

    asyncio.run(main())


def test_a_request_whose_client_left_is_committed_by_the_replica(model_dir):
    """A stopped request (its reader left) is never relayed: nobody reads its end."""
    coord, replica, _ = _setup(model_dir)

    async def main() -> None:
        params = GREEDY.__class__(max_tokens=30, temperature=0.0, ignore_eos=True)
        dispatch = coord.plan(np.arange(7, 40, dtype=np.int32), params)
        assert await submit(replica, dispatch) == [None]
        await replica._step()
        assert await replica.settle(dispatch) == "stopped"
        await run_until_idle(replica)
        end = items(replica, dispatch.order.request_id)[-1]
        assert isinstance(end, Completed) and end.commit is None
        assert not coord.state.is_planned("r0", dispatch.order.request_id)
        _settled(coord, replica)

    asyncio.run(main())


def test_with_commit_relay_off_the_replica_commits_in_its_step(model_dir):
    coord, replica, _ = _setup(model_dir, commit_relay=False)

    async def main() -> None:
        dispatch, end = await _run(coord, replica, list(range(7, 30)))
        assert end.commit is None and len(replica._relayed) == 0
        assert not coord.state.is_planned("r0", dispatch.order.request_id)
        await replica._drain()
        _settled(coord, replica)

    asyncio.run(main())


def test_a_reconcile_while_a_relay_is_applied_but_not_yet_settled_keeps_everything(model_dir):
    """The relay was applied (the tree refers to what the request stored) and the replica
    has not read the entry yet when it reconciles: what the request stored is held and
    its own, so nothing is reset and nothing freed twice."""
    coord, replica, _ = _setup(model_dir)

    async def main() -> None:
        dispatch, end = await _run(coord, replica, list(range(17, 80)))
        generation = replica.generation
        assert coord.relayed_commit(_relay(dispatch, end)) is True
        assert len(replica._relayed) == 1
        await replica._reconcile()
        assert replica.generation == generation, "no reset"
        await replica._drain()
        _settled(coord, replica)

    asyncio.run(main())


def test_a_reset_frees_what_waiting_relayed_requests_stored_once(model_dir):
    """The coordinator dropped the replica's cache while a request waits for its relay
    (it registers again, under a new generation): that plan ended with the old tree, so
    the replica frees what the request stored, once, and the late relay is dropped."""
    coord, replica, _ = _setup(model_dir)

    async def main() -> None:
        dispatch, end = await _run(coord, replica, list(range(200, 260)))
        worker = replica.shards.worker  # type: ignore[attr-defined]
        stored = set(end.commit.state_ids.values())
        assert stored <= set(worker.holdings()[0])
        generation = replica.generation
        coord.unregister_replica("r0")
        await replica._beat()  # "register": a new generation, then a reconcile
        assert replica.generation != generation and replica._reconcile_due
        await replica._reconcile()
        assert len(replica._relayed) == 0
        assert coord.relayed_commit(_relay(dispatch, end)) is False
        await run_until_idle(replica)
        assert not stored & set(worker.holdings()[0])
        _settled(coord, replica)

    asyncio.run(main())
