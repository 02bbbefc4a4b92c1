"""Load shedding (issue: no admission control): a replica holds at most `max_batch +
max_queued_requests` planned requests; when every replica is full the coordinator sheds
the request before planning anything (HTTP 429 with Retry-After); a dispatch queued at a
replica keeps its lease while heartbeats renew it. The coordinator and replica logic are
the real ones, in process; the HTTP path over Ray is measured by benchmarks/hostile.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from coordinator_helpers import GREEDY, apply, make_settings, make_worker, register, run_dispatch
from fastapi.testclient import TestClient

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.orders import PrefillOrder
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.messages import Dispatch, Overloaded
from marconi_ray.serve.replica.deployment import ModelReplica, max_ongoing
from marconi_ray.serve.settings import ServeSettings

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("shed") / "tiny")


def test_a_full_replica_set_sheds_before_planning(model_dir: Path) -> None:
    settings = make_settings(model_dir, max_batch=2, max_queued_requests=1)
    coord = CacheCoordinator(settings, journal=MemoryJournal())
    worker = make_worker(model_dir)
    register(coord, worker)
    prompts = [np.arange(10 + i, 40 + i, dtype=np.int32) for i in range(4)]
    held = [coord.plan(p, GREEDY) for p in prompts[:3]]  # 2 running + 1 queued
    (stats,) = coord.stats()
    before = (stats.in_flight, stats.reserved, stats.bytes_used, len(coord.leases))
    with pytest.raises(Overloaded, match=r"all 1 replicas are full \(2 running \+ 1 queued"):
        coord.plan(prompts[3], GREEDY)
    (stats,) = coord.stats()
    assert (stats.in_flight, stats.reserved, stats.bytes_used, len(coord.leases)) == before
    shed = coord.plan_many([(prompts[3], GREEDY, 0.0)])
    assert isinstance(shed[0], Overloaded)
    (done,) = run_dispatch(worker, held[0])
    apply(worker, coord.commit(held[0].replica_id, done))
    assert coord.plan(prompts[3], GREEDY).order.prompt.shape == (30,)  # room again
    unlimited = make_settings(model_dir, max_batch=2, max_queued_requests=-1)
    free = CacheCoordinator(unlimited, journal=MemoryJournal())
    register(free, worker)
    assert all(isinstance(free.plan(p, GREEDY), Dispatch) for p in prompts * 2)


class ShedBackend(LocalBackend):
    """The in-process backend whose plans meet a full coordinator (as above)."""

    async def plan(self, prompt: Any, params: Any, submitted: float) -> Dispatch:
        raise Overloaded("all 2 replicas are full (8 running + 256 queued requests each)")


def test_a_shed_request_gets_429_with_retry_after(model_dir: Path) -> None:
    engine = Engine(model_dir, system="marconi", cache_bytes=10_000_000)
    app = build_app(ShedBackend(engine), ServedModel.load(model_dir, "tiny"))
    with TestClient(app) as client:
        r = client.post("/v1/completions", json={"model": "tiny", "prompt": "hi"})
    assert r.status_code == 429 and r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert err["code"] == "overloaded" and "replicas are full" in err["message"]


def _replica(lease_s: float = 30.0) -> ModelReplica:
    replica = object.__new__(ModelReplica)
    replica.replica_id = "r0"
    replica.settings = ServeSettings(model_dir="unused", model_name="tiny", lease_s=lease_s)
    replica.init_loop(0)
    return replica


def _dispatch(rid: int, deadline: float) -> Dispatch:
    order = PrefillOrder(rid, np.arange(7, 12, dtype=np.int32), GREEDY, 1)
    return Dispatch("r0", order, deadline=deadline)


def test_a_queued_dispatch_keeps_its_lease_while_heartbeats_renew_it() -> None:
    replica, now = _replica(), time.time()
    for rid in (1, 2, 3):
        replica._remember(rid, now + 0.2)
    replica._remember(4, now - 1.0)  # already past its deadline when the heartbeat left
    replica._renew([1, 2, 4], sent=now)
    time.sleep(0.3)  # every original deadline has passed
    assert replica._stale(_dispatch(1, now + 0.2)) == ""  # renewed: admitted
    assert replica._stale(_dispatch(2, now + 0.2)) == ""
    assert "past its lease" in replica._stale(_dispatch(3, now + 0.2))  # not in the beat
    assert "past its lease" in replica._stale(_dispatch(4, now - 1.0))  # unsound to renew
    late, now = _replica(), time.time()
    late._remember(5, now + 5)
    late._renew([5], sent=now - 20)  # answered after half the grace: not trusted
    assert late._known[5] == now + 5  # (trusted, it would be now + 10)


def test_every_request_the_coordinator_may_plan_fits_in_the_replica() -> None:
    s = ServeSettings(model_dir="unused", model_name="tiny", max_batch=8, max_queued_requests=256)
    assert max_ongoing(s) >= 8 + 256
    unbounded = ServeSettings(model_dir="u", model_name="t", max_queued_requests=-1)
    assert max_ongoing(unbounded) >= 10**5
