"""Helpers of the in-process coordinator tests (no Ray): a `CacheCoordinator` driven
against a real tiny-model `Worker` (real state ids and KV slots) and a real
`redis-server`."""

from __future__ import annotations

import weakref
from pathlib import Path

import numpy as np
from redis_server import RedisServer

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import Release
from marconi_ray.protocol.release_log import ReleaseCursor, Releases
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import RedisJournal
from marconi_ray.serve.messages import Dispatch
from marconi_ray.serve.settings import ServeSettings

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
LEASE = 30.0
PREFIX = "marconi:test"


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make_settings(model_dir: Path, **kw: object) -> ServeSettings:
    base: dict[str, object] = {
        "model_dir": str(model_dir),
        "model_name": "tiny",
        "cache_bytes": 3_000_000,
        "alpha": 1.0,
        "lease_s": LEASE,
    }
    return ServeSettings(**{**base, **kw})  # type: ignore[arg-type]


def make_worker(model_dir: Path) -> Worker:
    import torch

    return Worker(load_model(model_dir, TPGroup(0, 1), torch.float32, "cpu"), max_batch=8)


_CURSORS: weakref.WeakKeyDictionary[Worker, ReleaseCursor] = weakref.WeakKeyDictionary()
"""Each in-process worker's release cursor (what its `ModelReplica` keeps)."""


def apply(worker: Worker, releases: Releases | Release) -> None:
    """Apply a coordinator answer to `worker`'s store as its replica does: each release
    log entry once, in seq order (`ReleaseCursor`), then the direct frees; a plain
    `Release` is applied as it is. The cursor follows the generation the answers carry
    (these tests hand every answer over in order, across resets and restarts)."""
    if isinstance(releases, Release):
        worker.release(releases)
        return
    cursor = cursor_of(worker, releases.generation)
    if releases.generation and releases.generation != cursor.generation:
        cursor.reset(releases.generation)
    taken = cursor.take(releases)
    assert not cursor.gap, cursor.gap
    worker.release(taken)


def cursor_of(worker: Worker, generation: int) -> ReleaseCursor:
    """`worker`'s release cursor (a new one at `generation` the first time): a replica
    built around the worker in process shares it (`replica_harness.make_replica`)."""
    return _CURSORS.setdefault(worker, ReleaseCursor(generation))


def applied(worker: Worker) -> int:
    """The last log entry `worker`'s store applied (0 before any)."""
    cursor = _CURSORS.get(worker)
    return 0 if cursor is None else cursor.applied


def flat(releases: Releases) -> Release:
    """Everything an answer carries as one release: its log entries, then its direct
    frees (for assertions on what it frees)."""
    out = Release()
    for entry in releases.entries:
        out = out + entry.release
    return out + releases.direct


def redis_journal(server: RedisServer, retry_s: float = 1.0, **kw: object) -> RedisJournal:
    """The coordinator's journal on `server`, with a socket timeout that a loaded test
    machine does not trip (a stopped server refuses at once)."""
    kw = {"timeout_s": 5.0, **kw}
    return RedisJournal(server.url, PREFIX, retry_s=retry_s, **kw)  # type: ignore[arg-type]


def register(coord: CacheCoordinator, worker: Worker, rid: str = "r0") -> int:
    return coord.register_replica(rid, worker.store.kv_bytes_per_token, worker.store.state_bytes)


def run_dispatch(worker: Worker, dispatch: Dispatch) -> list:
    """Run one dispatch to completion on the worker; its `Finished`."""
    apply(worker, dispatch.releases)
    worker.start(dispatch.order)
    while worker.num_running:
        worker.step()
    return worker.take_finished()


def turn(coord: CacheCoordinator, worker: Worker, prompt: list[int]) -> tuple[list[int], int]:
    """Plan, run and commit one request: (its output tokens, its hit length)."""
    dispatch = coord.plan(np.asarray(prompt, np.int32), GREEDY)
    (done,) = run_dispatch(worker, dispatch)
    apply(worker, coord.commit(dispatch.replica_id, done, applied(worker)))
    return list(done.tokens), dispatch.order.hit_len


def sessions(coord: CacheCoordinator, worker: Worker, n: int, turns: int) -> list[list[int]]:
    """`n` multi-turn sessions of `turns` turns each; their histories."""
    rng = np.random.default_rng(3)
    histories = [rng.integers(7, 263, 24).tolist() for _ in range(n)]
    for _ in range(turns):
        for i in range(n):
            tokens, _ = turn(coord, worker, histories[i])
            histories[i] += tokens + rng.integers(7, 263, 6).tolist()
    return histories


def tree_of(coord: CacheCoordinator, rid: str = "r0") -> list[tuple]:
    """A replica's tree as comparable tuples (depth, edge, KV slots, state, lock)."""
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
