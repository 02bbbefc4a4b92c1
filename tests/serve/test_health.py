"""`/health` counts the replicas that can serve now: confirmed (a replica restored from
the journal is not, until it reconciles) and heard from within a lease; it fails when
there is none. The coordinator is the real one, in process (no Ray); `/health` is the
real app over an in-process engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from coordinator_helpers import LEASE, Clock, applied, make_settings, make_worker, register
from fastapi.testclient import TestClient

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("health") / "tiny")


def test_restored_and_silent_replicas_are_not_counted(model_dir: Path) -> None:
    clock, journal = Clock(), MemoryJournal()
    coord = CacheCoordinator(make_settings(model_dir), journal=journal, clock=clock)
    worker = make_worker(model_dir)
    register(coord, worker, "r0")
    register(coord, worker, "r1")
    assert (coord.health()["replicas"], coord.health()["registered"]) == (2, 2)
    assert coord.health()["journal"]["state"] == "ok"
    # a restart: both come back from the journal, unconfirmed until they reconcile
    again = CacheCoordinator(make_settings(model_dir), journal=journal, clock=clock)
    assert (again.health()["replicas"], again.health()["registered"]) == (0, 2)
    assert again.heartbeat("r0", [])[0] == "reconcile"
    states, slots = worker.holdings()
    again.reconcile("r0", states, slots, applied=applied(worker))
    assert again.health()["replicas"] == 1
    clock.now += LEASE + 1  # r0 goes silent for a lease: it no longer counts
    assert again.health()["replicas"] == 0


class NoReplicaBackend(LocalBackend):
    """The in-process backend, reporting what a coordinator with only restored (not yet
    reconciled) replicas reports."""

    async def health(self) -> dict[str, Any]:
        return {"replicas": 0, "registered": 2, "journal": {"state": "ok"}}


def test_health_fails_when_no_replica_can_serve(model_dir: Path) -> None:
    engine = Engine(model_dir, system="marconi", cache_bytes=10_000_000)
    served = ServedModel.load(model_dir, "tiny")
    with TestClient(build_app(LocalBackend(engine), served)) as client:
        ok = client.get("/health")
        assert ok.status_code == 200 and ok.json()["replicas"] == 1
    with TestClient(build_app(NoReplicaBackend(engine), served)) as client:
        down = client.get("/health")
        assert down.status_code == 503
        assert "2 registered, none live" in down.json()["error"]["message"]
