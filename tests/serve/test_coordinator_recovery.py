"""The coordinator's journal, recovery, leases and reconciliation, without Ray: the
`CacheCoordinator` class driven in-process against a real tiny-model `Worker` (real
state ids and KV slots) and a real `redis-server`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from coordinator_helpers import (
    GREEDY,
    LEASE,
    Clock,
    applied,
    apply,
    flat,
    make_settings,
    make_worker,
    redis_journal,
    register,
    run_dispatch,
    sessions,
    tree_of,
    turn,
)

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.orders import Move, Release
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal, RedisJournal


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("recovery") / "tiny")


def test_restart_replays_the_redis_journal_exactly(model_dir, redis_server):
    """A second coordinator on the same Redis journal has the same trees, stats, alpha and
    open plan; after reconciling (nothing to free) the next turn hits and the open plan
    commits."""
    worker = make_worker(model_dir)
    a = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    generation = register(a, worker)
    histories = sessions(a, worker, n=4, turns=2)
    open_dispatch = a.plan(np.asarray(histories[0], np.int32), GREEDY)
    (open_done,) = run_dispatch(worker, open_dispatch)

    b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert b.recovery["ok"] and b.recovery["records"] > 8 and not b.recovery["snapshot"]
    assert tree_of(b) == tree_of(a)
    assert b.planners["r0"].cache.stats == a.planners["r0"].cache.stats
    assert b.planners["r0"].cache.reserved == a.planners["r0"].cache.reserved > 0
    assert b.stats()[0].in_flight == 1
    # restored replicas are not routed to until they reconcile
    assert b.heartbeat("r0", [open_dispatch.order.request_id]) == ("reconcile", generation)
    with pytest.raises(RuntimeError, match="no model replica"):
        b.route(np.asarray(histories[1], np.int32))
    # (a replica commits what finished before it reconciles: one loop does both)
    apply(worker, b.commit("r0", open_done))
    assert b.locked_nodes("r0") == 0 and b.planners["r0"].cache.reserved == 0
    states, slots = worker.holdings()
    got_generation, answer = b.reconcile("r0", states, slots, applied=applied(worker))
    release = answer.direct
    assert got_generation == generation and not release.states and not len(release.slots)
    _, hit = turn(b, worker, histories[1])
    assert hit > 0
    assert b.check_invariants() > 0


def test_snapshots_compact_the_stream(model_dir, redis_server):
    """With `snapshot_every=5`, Redis keeps one snapshot and fewer than 5 records, and a
    restart from them equals the live coordinator."""
    worker = make_worker(model_dir)
    settings = make_settings(model_dir, snapshot_every=5)
    a = CacheCoordinator(settings, journal=redis_journal(redis_server))
    register(a, worker)
    sessions(a, worker, n=3, turns=2)
    client = redis_server.client()
    assert client.exists("marconi:test:snapshot")
    assert client.xlen("marconi:test:journal") < 5
    b = CacheCoordinator(settings, journal=redis_journal(redis_server))
    assert b.recovery["snapshot"]
    assert tree_of(b) == tree_of(a)
    assert b.planners["r0"].cache.clock == a.planners["r0"].cache.clock


def test_expired_lease_releases_the_hit_and_a_late_commit_frees_only_orphans(model_dir):
    clock = Clock()
    worker = make_worker(model_dir)
    coord = CacheCoordinator(make_settings(model_dir), journal=MemoryJournal(), clock=clock)
    register(coord, worker)
    histories = sessions(coord, worker, n=2, turns=1)
    dispatch = coord.plan(np.asarray(histories[0], np.int32), GREEDY)
    assert dispatch.order.hit_len > 0 and coord.locked_nodes("r0") > 0
    assert dispatch.deadline == clock.now + LEASE
    clock.now += LEASE * 1.2  # past the deadline, within the grace: kept
    coord.heartbeat("r0", [])
    assert coord.stats()[0].in_flight == 1
    clock.now += LEASE * 0.4  # past deadline + grace: aborted
    coord.heartbeat("r0", [])
    assert coord.stats()[0].in_flight == 0 and coord.locked_nodes("r0") == 0
    assert coord.planners["r0"].cache.reserved == 0
    before = tree_of(coord)
    (done,) = run_dispatch(worker, dispatch)  # the replica ran it anyway, late
    release = flat(coord.commit("r0", done))
    assert set(release.states) == set(done.state_ids.values())
    assert sorted(release.slots) == sorted(done.kv_slots)
    assert tree_of(coord) == before


def test_heartbeats_renew_leases_and_silent_replicas_are_dropped(model_dir):
    clock = Clock()
    worker = make_worker(model_dir)
    coord = CacheCoordinator(make_settings(model_dir), journal=MemoryJournal(), clock=clock)
    register(coord, worker, "a")
    register(coord, worker, "b")
    dispatch = coord.plan(np.arange(7, 40, dtype=np.int32), GREEDY)
    rid, other = dispatch.replica_id, ({"a", "b"} - {dispatch.replica_id}).pop()
    for _ in range(4):
        clock.now += LEASE * 0.5
        coord.heartbeat(rid, [dispatch.order.request_id])
    assert sum(st.in_flight for st in coord.stats()) == 1, "the lease was renewed"
    assert coord.replicas() == [rid], f"{other} was silent for {LEASE * 2} s"


def test_reconcile_resets_a_tree_the_store_cannot_back_and_frees_unknowns(model_dir, redis_server):
    """A restored tree whose states the replica lost is reset under a new generation; a
    store holding what no tree refers to is told to free it."""
    worker = make_worker(model_dir)
    a = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    generation = register(a, worker)
    sessions(a, worker, n=2, turns=1)
    fresh = make_worker(model_dir)  # a replica that lost everything
    b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    states, slots = fresh.holdings()
    new_generation, answer = b.reconcile("r0", states, slots, applied=applied(worker))
    release = answer.direct
    assert new_generation != generation
    assert len(b.planners["r0"].cache.tree.iter_nodes()) == 1  # just the root
    assert not release.states
    c = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert c.replica_info["r0"].generation == new_generation, "the reset was journalled"
    states, slots = worker.holdings()  # holds the old states, unknown to the reset tree
    _, answer = c.reconcile("r0", states, slots, applied=applied(worker))
    release = answer.direct
    assert sorted(release.states) == sorted(states) and len(release.slots) == len(slots)


def test_memory_journal_restart_asks_replicas_toregister(model_dir):
    worker = make_worker(model_dir)
    coord = CacheCoordinator(make_settings(model_dir), journal=MemoryJournal())
    register(coord, worker)
    again = CacheCoordinator(make_settings(model_dir), journal=MemoryJournal())
    assert again.heartbeat("r0", []) == ("register", 0)
    assert not again.journal_status()["persistent"]


def test_redis_outage_degrades_then_catches_up(model_dir, redis_server):
    """Redis killed: operations keep succeeding, records queue; Redis back: they are
    flushed in order, and a restart from Redis equals the live coordinator."""
    worker = make_worker(model_dir)
    a = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server, retry_s=0.0))
    register(a, worker)
    histories = sessions(a, worker, n=2, turns=1)
    redis_server.stop()
    for h in histories:
        turn(a, worker, h)
    status = a.journal_status()
    assert not status["healthy"] and status["backlog"] >= 4 and status["outages"] == 1
    redis_server.start()
    turn(a, worker, histories[0] + [9, 9, 9])
    status = a.journal_status()
    assert status["healthy"] and status["backlog"] == 0
    b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert tree_of(b) == tree_of(a)


def test_backlog_overflow_is_replaced_by_a_snapshot(model_dir, redis_server):
    worker = make_worker(model_dir)
    journal = RedisJournal(redis_server.url, "marconi:test", max_backlog_bytes=1000, retry_s=0.0)
    a = CacheCoordinator(make_settings(model_dir), journal=journal)
    register(a, worker)
    redis_server.stop()
    histories = sessions(a, worker, n=3, turns=1)
    assert a.journal_status()["lost"] > 0
    redis_server.start()
    turn(a, worker, histories[0])
    assert a.journal_status()["lost"] == 0 and journal.snapshots == 1
    b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert tree_of(b) == tree_of(a)


def test_unusable_journal_starts_empty_and_is_replaced_by_a_snapshot(model_dir, redis_server):
    """A corrupt journal: start empty; a snapshot written at start replaces the stale
    snapshot and records (new records never follow stale ones)."""
    worker = make_worker(model_dir)
    a = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    register(a, worker, "stale")
    client = redis_server.client()
    client.set("marconi:test:snapshot", b"\xc1 not msgpack")
    b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert not b.recovery["ok"] and "msgpack" in b.recovery["error"]
    assert b.replicas() == [] and b.recovery["seconds"] >= 0
    assert client.xlen("marconi:test:journal") == 0, "the snapshot replaced the stream"
    register(b, worker, "fresh")
    assert client.xlen("marconi:test:journal") == 1, "the registration, after the snapshot"
    sessions(b, worker, n=1, turns=1)
    c = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert c.recovery["ok"] and c.replicas() == ["fresh"]
    assert tree_of(c, "fresh") == tree_of(b, "fresh")


def test_unreachable_redis_at_start_starts_empty(model_dir, redis_server):
    redis_server.stop()
    coord = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert not coord.recovery["ok"] and "unreadable" in coord.recovery["error"]
    worker = make_worker(model_dir)
    register(coord, worker)  # serving goes on; the snapshot waits for Redis
    assert coord.replicas() == ["r0"]


def test_unreachable_replica_is_dropped_once_its_heartbeats_stop(model_dir):
    clock = Clock()
    worker = make_worker(model_dir)
    coord = CacheCoordinator(
        make_settings(model_dir, heartbeat_s=1.0), journal=MemoryJournal(), clock=clock
    )
    register(coord, worker, "gone")
    register(coord, worker, "alive")
    clock.now += 1.5
    coord.heartbeat("alive", [])
    assert not coord.report_unreachable("alive")
    assert not coord.report_unreachable("gone"), "1.5 s of silence is within 2 heartbeats"
    clock.now += 1.0
    assert coord.report_unreachable("gone") and coord.replicas() == ["alive"]


def test_lease_table_tracks_exactly_the_open_plans(model_dir):
    clock = Clock()
    worker = make_worker(model_dir)
    coord = CacheCoordinator(make_settings(model_dir), journal=MemoryJournal(), clock=clock)
    register(coord, worker, "a")
    register(coord, worker, "b")
    dispatches = [coord.plan(np.arange(7, 30 + i, dtype=np.int32), GREEDY) for i in range(4)]
    assert len(coord.leases) == 4 and coord.check_invariants() > 0
    (done,) = run_dispatch(worker, dispatches[0])
    coord.commit(dispatches[0].replica_id, done)
    coord.abort(dispatches[1].replica_id, dispatches[1].order.request_id)
    assert len(coord.leases) == 2 and coord.check_invariants() > 0
    coord.unregister_replica(dispatches[2].replica_id)
    assert len(coord.leases) == sum(st.in_flight for st in coord.stats())
    assert coord.check_invariants() > 0


def test_restart_replays_both_tiers_and_reconciles_them(model_dir, redis_server):
    """A coordinator with a host tier (LRU placement: the tiny model is never worth a copy
    under FLOP-aware placement) demotes and promotes while it serves; a restart from the
    journal has the same tiers, and a store whose tiers agree reconciles with nothing to
    free. A store that holds one of the tree's host ids on the device (a move it never
    got) does not: the tree is reset, as for a missing id."""
    worker = make_worker(model_dir)
    store = worker.store
    device = 2 * (70 * store.kv_bytes_per_token + 3 * store.state_bytes)
    settings = make_settings(
        model_dir, cache_bytes=device, host_cache_bytes=10**8, host_placement="lru"
    )
    a = CacheCoordinator(settings, journal=redis_journal(redis_server))
    generation = register(a, worker)
    sessions(a, worker, n=4, turns=3)
    cache = a.planners["r0"].cache
    assert cache.stats.demotions and cache.stats.promotions and cache.stats.host_hit_tokens
    host_states, host_slots = cache.referenced_on_host()
    assert host_slots and (host_states, host_slots) == (
        set(store.host_state_ids()),
        set(store.host_slot_ids().tolist()),
    )

    b = CacheCoordinator(settings, journal=redis_journal(redis_server))
    restored = b.planners["r0"].cache
    assert tree_of(b) == tree_of(a)
    assert restored.referenced_on_host() == (host_states, host_slots)
    assert restored.bytes_by_tier() == cache.bytes_by_tier()
    states, slots = worker.holdings()
    got, answer = b.reconcile("r0", states, slots, *worker.host_holdings(), applied=applied(worker))
    release = answer.direct
    assert got == generation and not release.states and not len(release.slots)

    c = CacheCoordinator(settings, journal=redis_journal(redis_server))
    one = np.asarray([min(host_slots)], dtype=np.int64)
    worker.release(Release(moves=(Move(False, (), one),)))  # the store moves it back alone
    states, slots = worker.holdings()
    got, answer = c.reconcile("r0", states, slots, *worker.host_holdings(), applied=applied(worker))
    release = answer.direct
    assert got != generation and len(c.planners["r0"].cache.tree.iter_nodes()) == 1
    assert sorted(release.states) == sorted(states) and len(release.slots) == len(slots)
