"""The coordinator's journal, recovery, leases and reconciliation, without Ray: the
`CacheCoordinator` class driven in-process against a real tiny-model `Worker` (real
state ids and KV slots) and a real `redis-server`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from redis_server import RedisServer

from marconi_ray.engine.factory import make_model
from marconi_ray.engine.loader import load_model
from marconi_ray.engine.parallel import TPGroup
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator import CacheCoordinator
from marconi_ray.serve.journal import MemoryJournal, RedisJournal
from marconi_ray.serve.messages import Dispatch
from marconi_ray.serve.settings import ServeSettings

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
LEASE = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("recovery") / "tiny")


def _settings(model_dir: Path, **kw: object) -> ServeSettings:
    base: dict[str, object] = {
        "model_dir": str(model_dir),
        "model_name": "tiny",
        "cache_bytes": 3_000_000,
        "alpha": 1.0,
        "lease_s": LEASE,
    }
    return ServeSettings(**{**base, **kw})  # type: ignore[arg-type]


def _worker(model_dir: Path) -> Worker:
    import torch

    return Worker(load_model(model_dir, TPGroup(0, 1), torch.float32, "cpu"), max_batch=8)


def _journal(server: RedisServer, retry_s: float = 1.0) -> RedisJournal:
    return RedisJournal(server.url, "marconi:test", retry_s=retry_s)


def _register(coord: CacheCoordinator, worker: Worker, rid: str = "r0") -> int:
    return coord.register_replica(rid, worker.store.kv_bytes_per_token, worker.store.state_bytes)


def _run(worker: Worker, dispatch: Dispatch) -> list:
    """Run one dispatch to completion on the worker; its `Finished`."""
    worker.release(dispatch.release)
    worker.start(dispatch.order)
    while worker.num_running:
        worker.step()
    return worker.take_finished()


def _turn(coord: CacheCoordinator, worker: Worker, prompt: list[int]) -> tuple[list[int], int]:
    dispatch = coord.plan(np.asarray(prompt, np.int32), GREEDY)
    (done,) = _run(worker, dispatch)
    worker.release(coord.commit(dispatch.replica_id, done))
    return list(done.tokens), dispatch.order.hit_len


def _sessions(coord: CacheCoordinator, worker: Worker, n: int, turns: int) -> list[list[int]]:
    rng = np.random.default_rng(3)
    histories = [rng.integers(7, 263, 24).tolist() for _ in range(n)]
    for _ in range(turns):
        for i in range(n):
            tokens, _ = _turn(coord, worker, histories[i])
            histories[i] += tokens + rng.integers(7, 263, 6).tolist()
    return histories


def _tree(coord: CacheCoordinator, rid: str = "r0") -> list[tuple]:
    return [
        (
            n.depth,
            n.edge.tobytes(),
            None if n.kv is None else np.asarray(n.kv).tobytes(),
            n.state,
            n.lock,
        )
        for n in coord.planners[rid].cache.tree.iter_nodes()
    ]


def test_restart_replays_the_redis_journal_exactly(model_dir, redis_server):
    """A second coordinator on the same Redis journal has the same trees, stats, alpha and
    open plan; after reconciling (nothing to free) the next turn hits and the open plan
    commits."""
    worker = _worker(model_dir)
    a = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    generation = _register(a, worker)
    histories = _sessions(a, worker, n=4, turns=2)
    open_dispatch = a.plan(np.asarray(histories[0], np.int32), GREEDY)
    (open_done,) = _run(worker, open_dispatch)

    b = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    assert b.recovery["ok"] and b.recovery["records"] > 8 and not b.recovery["snapshot"]
    assert _tree(b) == _tree(a)
    assert b.planners["r0"].cache.stats == a.planners["r0"].cache.stats
    assert b.planners["r0"].cache.reserved == a.planners["r0"].cache.reserved > 0
    assert b.stats()[0].in_flight == 1
    # restored replicas are not routed to until they reconcile
    assert b.heartbeat("r0", [open_dispatch.order.request_id]) == ("reconcile", generation)
    with pytest.raises(RuntimeError, match="no model replica"):
        b.route(np.asarray(histories[1], np.int32))
    # (a replica commits what finished before it reconciles: one loop does both)
    worker.release(b.commit("r0", open_done))
    assert b.locked_nodes("r0") == 0 and b.planners["r0"].cache.reserved == 0
    states, slots = worker.holdings()
    got_generation, release = b.reconcile("r0", states, slots)
    assert got_generation == generation and not release.states and not len(release.slots)
    _, hit = _turn(b, worker, histories[1])
    assert hit > 0
    assert b.check_invariants() > 0


def test_snapshots_compact_the_stream(model_dir, redis_server):
    """With `snapshot_every=5`, Redis keeps one snapshot and fewer than 5 records, and a
    restart from them equals the live coordinator."""
    worker = _worker(model_dir)
    settings = _settings(model_dir, snapshot_every=5)
    a = CacheCoordinator(settings, journal=_journal(redis_server))
    _register(a, worker)
    _sessions(a, worker, n=3, turns=2)
    client = redis_server.client()
    assert client.exists("marconi:test:snapshot")
    assert client.xlen("marconi:test:journal") < 5
    b = CacheCoordinator(settings, journal=_journal(redis_server))
    assert b.recovery["snapshot"]
    assert _tree(b) == _tree(a)
    assert b.planners["r0"].cache.clock == a.planners["r0"].cache.clock


def test_expired_lease_releases_the_hit_and_a_late_commit_frees_only_orphans(model_dir):
    clock = Clock()
    worker = _worker(model_dir)
    coord = CacheCoordinator(_settings(model_dir), journal=MemoryJournal(), clock=clock)
    _register(coord, worker)
    histories = _sessions(coord, worker, n=2, turns=1)
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
    before = _tree(coord)
    (done,) = _run(worker, dispatch)  # the replica ran it anyway, late
    release = coord.commit("r0", done)
    assert set(release.states) == set(done.state_ids.values())
    assert sorted(release.slots) == sorted(done.kv_slots)
    assert _tree(coord) == before


def test_heartbeats_renew_leases_and_silent_replicas_are_dropped(model_dir):
    clock = Clock()
    worker = _worker(model_dir)
    coord = CacheCoordinator(_settings(model_dir), journal=MemoryJournal(), clock=clock)
    _register(coord, worker, "a")
    _register(coord, worker, "b")
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
    worker = _worker(model_dir)
    a = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    generation = _register(a, worker)
    _sessions(a, worker, n=2, turns=1)
    fresh = _worker(model_dir)  # a replica that lost everything
    b = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    states, slots = fresh.holdings()
    new_generation, release = b.reconcile("r0", states, slots)
    assert new_generation != generation
    assert len(b.planners["r0"].cache.tree.iter_nodes()) == 1  # just the root
    assert not release.states
    c = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    assert c.replica_info["r0"].generation == new_generation, "the reset was journalled"
    states, slots = worker.holdings()  # holds the old states, unknown to the reset tree
    _, release = c.reconcile("r0", states, slots)
    assert sorted(release.states) == sorted(states) and len(release.slots) == len(slots)


def test_memory_journal_restart_asks_replicas_to_register(model_dir):
    worker = _worker(model_dir)
    coord = CacheCoordinator(_settings(model_dir), journal=MemoryJournal())
    _register(coord, worker)
    again = CacheCoordinator(_settings(model_dir), journal=MemoryJournal())
    assert again.heartbeat("r0", []) == ("register", 0)
    assert not again.journal_status()["persistent"]


def test_redis_outage_degrades_then_catches_up(model_dir, redis_server):
    """Redis killed: operations keep succeeding, records queue; Redis back: they are
    flushed in order, and a restart from Redis equals the live coordinator."""
    worker = _worker(model_dir)
    a = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server, retry_s=0.0))
    _register(a, worker)
    histories = _sessions(a, worker, n=2, turns=1)
    redis_server.stop()
    for h in histories:
        _turn(a, worker, h)
    status = a.journal_status()
    assert not status["healthy"] and status["backlog"] >= 4 and status["outages"] == 1
    redis_server.start()
    _turn(a, worker, histories[0] + [9, 9, 9])
    status = a.journal_status()
    assert status["healthy"] and status["backlog"] == 0
    b = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    assert _tree(b) == _tree(a)


def test_backlog_overflow_is_replaced_by_a_snapshot(model_dir, redis_server):
    worker = _worker(model_dir)
    journal = RedisJournal(redis_server.url, "marconi:test", max_backlog=3, retry_s=0.0)
    a = CacheCoordinator(_settings(model_dir), journal=journal)
    _register(a, worker)
    redis_server.stop()
    histories = _sessions(a, worker, n=3, turns=1)
    assert a.journal_status()["lost"] > 0
    redis_server.start()
    _turn(a, worker, histories[0])
    assert a.journal_status()["lost"] == 0 and journal.snapshots == 1
    b = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    assert _tree(b) == _tree(a)


def test_unusable_journal_starts_empty_and_is_replaced_by_a_snapshot(model_dir, redis_server):
    """A corrupt journal: start empty; the first operation writes a snapshot that replaces
    the stale snapshot and records (never appending new records after stale ones)."""
    worker = _worker(model_dir)
    a = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    _register(a, worker, "stale")
    client = redis_server.client()
    client.set("marconi:test:snapshot", b"\xc1 not msgpack")
    b = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    assert not b.recovery["ok"] and "msgpack" in b.recovery["error"]
    assert b.replicas() == [] and b.recovery["seconds"] >= 0
    _register(b, worker, "fresh")
    assert client.xlen("marconi:test:journal") == 0, "the snapshot replaced the stream"
    _sessions(b, worker, n=1, turns=1)
    c = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    assert c.recovery["ok"] and c.replicas() == ["fresh"]
    assert _tree(c, "fresh") == _tree(b, "fresh")


def test_unreachable_redis_at_start_starts_empty(model_dir, redis_server):
    redis_server.stop()
    coord = CacheCoordinator(_settings(model_dir), journal=_journal(redis_server))
    assert not coord.recovery["ok"] and "unreadable" in coord.recovery["error"]
    worker = _worker(model_dir)
    _register(coord, worker)  # serving goes on; the snapshot waits for Redis
    assert coord.replicas() == ["r0"]


def test_unreachable_replica_is_dropped_once_its_heartbeats_stop(model_dir):
    clock = Clock()
    worker = _worker(model_dir)
    coord = CacheCoordinator(
        _settings(model_dir, heartbeat_s=1.0), journal=MemoryJournal(), clock=clock
    )
    _register(coord, worker, "gone")
    _register(coord, worker, "alive")
    clock.now += 1.5
    coord.heartbeat("alive", [])
    assert not coord.report_unreachable("alive")
    assert not coord.report_unreachable("gone"), "1.5 s of silence is within 2 heartbeats"
    clock.now += 1.0
    assert coord.report_unreachable("gone") and coord.replicas() == ["alive"]


def test_lease_table_tracks_exactly_the_open_plans(model_dir):
    clock = Clock()
    worker = _worker(model_dir)
    coord = CacheCoordinator(_settings(model_dir), journal=MemoryJournal(), clock=clock)
    _register(coord, worker, "a")
    _register(coord, worker, "b")
    dispatches = [coord.plan(np.arange(7, 30 + i, dtype=np.int32), GREEDY) for i in range(4)]
    assert len(coord.leases) == 4 and coord.check_invariants() > 0
    (done,) = _run(worker, dispatches[0])
    coord.commit(dispatches[0].replica_id, done)
    coord.abort(dispatches[1].replica_id, dispatches[1].order.request_id)
    assert len(coord.leases) == 2 and coord.check_invariants() > 0
    coord.unregister_replica(dispatches[2].replica_id)
    assert len(coord.leases) == sum(st.in_flight for st in coord.stats())
    assert coord.check_invariants() > 0
