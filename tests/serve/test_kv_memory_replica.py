"""A replica whose device KV pool is sized once from a byte budget (`kv_memory_bytes`),
driven by the real `ModelReplica` loop against a real `CacheCoordinator` (no Ray,
`replica_harness`): a burst of long prompts, later turns hitting the cache, waits for rows
(a finished request's kept rows are free again only once the coordinator's release frees
them), ends with the tokens of an unbounded worker, and never grows the pool; the store
holds exactly what the tree refers to."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from coordinator_helpers import GREEDY, make_settings, make_worker, register
from replica_harness import in_step, items, make_replica, refused, run_until_idle, submit

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.kv_memory import STATES_PER_REQUEST, planned_store
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.kv_memory import KVMemory
from marconi_ray.protocol.orders import TokenEvent
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.coordinator.stall_watch import StallWatch
from marconi_ray.serve.messages import Completed

CACHE = 1_500_000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("kv_memory") / "tiny")


def test_a_burst_on_a_sized_pool_waits_for_rows_and_never_grows_it(model_dir):
    model = load_model(model_dir, TPGroup(0, 1), torch.float32, "cpu")
    probe = make_worker(model_dir).store
    per_request = 48 + GREEDY.max_tokens
    budget = CACHE + STATES_PER_REQUEST * 8 * probe.state_bytes
    budget += 3 * per_request * probe.kv_bytes_per_token
    store, plan = planned_store(model, KVMemory(bytes=budget), CACHE, 8)
    worker = Worker(model, 8, store=store, max_running_tokens=plan.max_running_tokens)
    settings = make_settings(model_dir, cache_bytes=CACHE, kv_memory_bytes=budget)
    coord = CacheCoordinator(
        settings, journal=MemoryJournal(), stall_watch=StallWatch(1.0, 0.25, start=False)
    )
    register(coord, worker)
    replica = make_replica(coord, worker)
    seen = {"waited": 0, "running": 0}
    advance = worker.advance

    def watched(step):
        out = advance(step)
        seen["waited"] += bool(worker._waiting)
        seen["running"] = max(seen["running"], len(worker._running) + len(worker._prefilling))
        assert worker.reserved_rows <= plan.max_running_tokens
        return out

    worker.advance = watched
    reference = Engine(model_dir, "vanilla")
    rng = np.random.default_rng(9)
    histories = [rng.integers(7, 263, 48).tolist() for _ in range(8)]

    async def burst() -> tuple[list[list[int]], int]:
        dispatches = [coord.plan(np.asarray(h, np.int32), GREEDY) for h in histories]
        await submit(replica, *dispatches)
        await run_until_idle(replica)
        outputs = []
        for d in dispatches:
            got = items(replica, d.order.request_id)
            assert isinstance(got[-1], Completed), got[-1]
            outputs.append([e.token for e in got if isinstance(e, TokenEvent)])
        return outputs, sum(d.order.hit_len > 0 for d in dispatches)

    for turn in range(2):  # the second turn's prompts start with cached states
        outputs, hits = asyncio.run(burst())
        for history, output in zip(histories, outputs, strict=True):
            assert output == list(reference.generate(history, GREEDY).tokens)
        assert hits > 0 if turn else hits == 0
        histories = [
            h + o + rng.integers(7, 263, 20).tolist()
            for h, o in zip(histories, outputs, strict=True)
        ]
    # rows for three first turns at a time: the burst waited, and still batched
    assert seen["waited"] > 0 and seen["running"] > 1
    assert store.device_kv.capacity == plan.pool_rows and store.device_kv.growths == 0
    assert worker.reserved_rows == 0 and refused(replica) == []
    in_step(coord, worker)
