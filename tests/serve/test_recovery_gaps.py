"""The coordinator when Redis loses records or stays away: a hole in the seqs found at
replay or at catch-up is named, only what is trusted is kept, and a snapshot follows at
once; a long outage keeps the journal's memory within its bytes. In-process (no Ray),
against a real tiny-model `Worker` and a real `redis-server`."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from coordinator_helpers import (
    GREEDY,
    PREFIX,
    apply,
    flat,
    make_settings,
    make_worker,
    redis_journal,
    register,
    sessions,
    tree_of,
    turn,
)
from redis_server import RedisServer

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import decode_record, decode_snapshot

STREAM, SNAPSHOT = f"{PREFIX}:journal", f"{PREFIX}:snapshot"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("gaps") / "tiny")


def _delete_records(server: RedisServer, seqs: set[int]) -> None:
    """XDEL the stream entries of these seqs (Redis lost them)."""
    client = server.client()
    ids = [eid for eid, f in client.xrange(STREAM) if decode_record(bytes(f[b"r"]))[0] in seqs]
    assert len(ids) == len(seqs), (ids, seqs)
    client.xdel(STREAM, *ids)


def _redis_snapshot_seq(server: RedisServer) -> int:
    data = server.client().get(SNAPSHOT)
    assert data is not None
    return decode_snapshot(data)[0]


def test_replay_gap_is_named_trees_are_reset_and_a_snapshot_follows(
    model_dir, redis_server, caplog
):
    """Records S+1 and S+2 are missing after snapshot S: the recovery says so, keeps
    the snapshot (registrations), resets the trees it cannot trust (new generation, the
    replica frees what it holds when it reconciles) and writes a snapshot at once; the
    next restart is clean."""
    worker = make_worker(model_dir)
    a = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    generation = register(a, worker)
    histories = sessions(a, worker, n=2, turns=1)
    assert a.snapshot()
    snap = a.journal_status()["seq"]
    for h in histories:
        turn(a, worker, h)  # records snap+1 .. snap+4
    _delete_records(redis_server, {snap + 1, snap + 2})

    with caplog.at_level(logging.ERROR, logger="marconi_ray.serve.coordinator.recovery"):
        b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    named = f"missing records {snap + 1}-{snap + 2} after snapshot {snap}"
    assert not b.recovery["ok"] and named in b.recovery["error"]
    assert named in caplog.text and "starting empty" not in caplog.text
    assert b.recovery["gap"] == {
        "snapshot": snap,
        "after": snap,
        "first_missing": snap + 1,
        "last_missing": snap + 2,
        "unapplied": 2,
        "reset_replicas": ["r0"],
    }
    assert b.replicas() == ["r0"] and len(tree_of(b)) == 1, "kept, with an empty tree"
    new_generation = b.replica_info["r0"].generation
    assert new_generation != generation
    assert b.heartbeat("r0", []) == ("reconcile", new_generation)
    # the snapshot replaced the journal at once
    client = redis_server.client()
    assert client.xlen(STREAM) == 0 and _redis_snapshot_seq(redis_server) == snap
    health = b.journal_health()
    assert health["state"] == "ok" and health["last_snapshot_age_s"] is not None
    # the replica frees everything it holds: no tree claims it
    states, slots = worker.holdings()
    # it reconciles as of the generation the heartbeat named, none of whose log it applied
    got, answer = b.reconcile("r0", states, slots, applied=0, generation=new_generation)
    release = flat(answer)
    assert got == new_generation
    assert sorted(release.states) == sorted(states) and len(release.slots) == len(slots)
    apply(worker, answer)
    _, hit = turn(b, worker, histories[0])
    assert hit == 0 and b.check_invariants() > 0
    c = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert c.recovery["ok"] and c.recovery["gap"] is None
    assert c.replica_info["r0"].generation == new_generation
    assert tree_of(c) == tree_of(b)


def test_replay_keeps_the_continuous_records_before_the_gap(model_dir, redis_server):
    """A gap after some records: those before it are applied (a replica registered by
    one is kept), those after it are not (a replica registered after the gap is not),
    and the snapshot written at once is at the last continuous seq."""
    worker = make_worker(model_dir)
    a = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    register(a, worker, "r0")
    assert a.snapshot()
    snap = a.journal_status()["seq"]
    register(a, worker, "r1")  # snap+1
    dispatch = a.plan(np.arange(7, 40, dtype=np.int32), GREEDY)  # snap+2
    a.abort(dispatch.replica_id, dispatch.order.request_id)  # snap+3
    register(a, worker, "r2")  # snap+4
    _delete_records(redis_server, {snap + 2})

    b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    named = f"missing records {snap + 2} after record {snap + 1} (snapshot {snap})"
    assert named in b.recovery["error"]
    assert b.recovery["records"] == 1 and b.recovery["gap"]["unapplied"] == 2
    assert b.replicas() == ["r0", "r1"] and b.recovery["gap"]["reset_replicas"] == ["r0", "r1"]
    assert b.journal_status()["seq"] == snap + 1 == _redis_snapshot_seq(redis_server)
    assert len(b.leases) == 0
    b.check_invariants()


def test_catch_up_hole_is_replaced_by_a_snapshot_at_once(model_dir, redis_server, caplog):
    """Redis restarts from older persistence during an outage (it lost acknowledged
    records): the coordinator names them and writes a snapshot with that very operation
    instead of appending on top of the hole; a restart from Redis equals it."""
    worker = make_worker(model_dir)
    a = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server, retry_s=0.0))
    register(a, worker)
    histories = sessions(a, worker, n=2, turns=1)
    older = redis_server.workdir.parent / "older-aof"
    shutil.copytree(redis_server.workdir / "appendonlydir", older)
    held = a.journal_status()["seq"]
    for h in histories:
        turn(a, worker, h)
    acked = a.journal_status()["seq"]
    redis_server.stop()
    turn(a, worker, histories[0] + [9, 9])
    assert not a.journal_status()["healthy"]
    shutil.rmtree(redis_server.workdir / "appendonlydir")
    shutil.copytree(older, redis_server.workdir / "appendonlydir")
    redis_server.start()
    with caplog.at_level(logging.ERROR, logger="marconi_ray.serve.coordinator.journal"):
        turn(a, worker, histories[1] + [9, 9])
    client = redis_server.client()
    assert client.xlen(STREAM) <= 1, "a snapshot replaced the stream (then the commit)"
    assert _redis_snapshot_seq(redis_server) >= acked + 1
    assert f"records {held + 1}-{acked} missing" in caplog.text
    assert f"up to seq {held}" in caplog.text
    assert a.journal_health()["state"] == "ok"
    b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert b.recovery["ok"] and tree_of(b) == tree_of(a)


def test_long_outage_keeps_the_journal_within_its_bytes(model_dir, redis_server):
    """Redis away while 3k-token prompts are planned: the journal goes degraded, then
    lost once its bytes would pass the bound, and queues nothing after that; Redis back,
    the next operation writes a snapshot, the journal is ok and a restart from Redis has
    every open plan."""
    bound = 64 << 10
    settings = make_settings(model_dir, cache_bytes=1 << 30)
    journal = redis_journal(redis_server, retry_s=0.0, max_backlog_bytes=bound)
    a = CacheCoordinator(settings, journal=journal)
    worker = make_worker(model_dir)
    register(a, worker)
    rng = np.random.default_rng(5)
    redis_server.stop()
    states = []
    for _ in range(16):
        a.plan(rng.integers(7, 263, 3000).astype(np.int32), GREEDY)
        health = a.journal_health()
        assert health["backlog_bytes"] <= bound
        states.append(health["state"])
    assert states[0] == "degraded" and states[-1] == "lost"
    assert states.index("lost") >= 4, "about five 12 KB records fit in 64 KiB"
    assert a.journal_health()["backlog_records"] == 0
    assert a.journal_health()["lost_records"] == 16, "every record since the outage"
    redis_server.start()
    a.plan(rng.integers(7, 263, 3000).astype(np.int32), GREEDY)
    health = a.journal_health()
    assert health["state"] == "ok" and health["lost_records"] == 0
    assert _redis_snapshot_seq(redis_server) == a.journal_status()["seq"]
    b = CacheCoordinator(settings, journal=redis_journal(redis_server))
    assert b.recovery["ok"] and b.recovery["open_plans"] == len(a.leases) == 17


def test_repeated_records_are_skipped_not_a_gap(model_dir, redis_server):
    """A flush cut short and retried writes some records twice: replay skips the
    repeats, finds no gap and restores the same tree."""
    worker = make_worker(model_dir)
    a = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    register(a, worker)
    sessions(a, worker, n=2, turns=1)
    client = redis_server.client()
    entries = client.xrange(STREAM)
    for _, fields in entries[-3:]:
        client.xadd(STREAM, fields)
    b = CacheCoordinator(make_settings(model_dir), journal=redis_journal(redis_server))
    assert b.recovery["ok"] and b.recovery["gap"] is None
    assert b.recovery["records"] == len(entries)
    assert tree_of(b) == tree_of(a)
