"""The hand-off of a tuning window to the tuner actor never touches the commit it
follows (an error in the hand-off cannot fail the commit), and a lost job is sent again:
a real in-process `CacheCoordinator` and tiny-model `Worker`, a real local Ray with the
real tuner actor started late."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import ray
from coordinator_helpers import (
    GREEDY,
    Clock,
    applied,
    apply,
    flat,
    make_settings,
    make_worker,
    register,
    run_dispatch,
)
from serve_helpers import local_ray

from marconi_ray.core.cache.tuner import run_grid
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.coordinator.tuner_actor import start_tuner
from marconi_ray.serve.settings import NAMESPACE, TunerSettings

pytestmark = [pytest.mark.ray]

RETRY_S = 30.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("handoff") / "tiny")


def _wait_runs(tuner: ray.actor.ActorHandle, n: int) -> None:
    deadline = time.monotonic() + 90
    while ray.get(tuner.runs.remote()) < n:
        assert time.monotonic() < deadline, f"the tuner did not finish {n} searches"
        time.sleep(0.2)


def test_a_missing_tuner_leaves_the_commit_whole_and_the_job_is_sent_again(model_dir):
    tuning = TunerSettings(multiplier=1, grid=(0.0, 1.0), workers=1, retry_s=RETRY_S)
    settings = make_settings(
        model_dir, alpha=None, cache_bytes=1_500_000, app_name="handoff", tuner=tuning
    )
    clock = Clock()
    with local_ray():
        coord = CacheCoordinator(settings, journal=MemoryJournal(), clock=clock)
        worker = make_worker(model_dir)
        register(coord, worker)
        planner = coord.planners["r0"]
        assert planner.tuner is not None
        rng = np.random.default_rng(5)
        for _ in range(300):  # until a commit completes the window (no tuner actor yet)
            dispatch = coord.plan(rng.integers(7, 263, 40).astype(np.int32), GREEDY)
            (done,) = run_dispatch(worker, dispatch)
            answer = coord.commit("r0", done, applied(worker))
            release = flat(answer)
            if planner.tuner.pending:
                break
            apply(worker, answer)
        else:
            raise AssertionError("the tuning window never completed")
        # the commit that handed the job over was applied, not turned into an abort
        tree_states, tree_slots = planner.cache.referenced()
        assert set(done.state_ids.values()) & tree_states, "the commit cached nothing"
        assert not set(release.states) & tree_states
        assert not set(np.asarray(release.slots).tolist()) & tree_slots
        apply(worker, answer)
        states, slots = worker.holdings()
        assert set(states) == tree_states and set(np.asarray(slots).tolist()) == tree_slots
        assert coord.heartbeat("r0", [])[0] == "ok"  # no tuner yet: sent again later

        tuner = start_tuner(tuning, "no-coordinator", name=settings.tuner_name)
        ray.get(tuner.runs.remote())
        coord.heartbeat("r0", [])  # the job goes now
        _wait_runs(tuner, 1)
        coord.heartbeat("r0", [])  # its result is not back: not sent again before retry_s
        clock.now += RETRY_S + 1
        coord.heartbeat("r0", [])  # the tuner died mid-search, say: sent again
        _wait_runs(tuner, 2)
        (record, again) = ray.get(tuner.history.remote())
        assert record["start_request"] == again["start_request"]

        job = planner.tuner.pending_job(planner.cache)
        assert job is not None
        result = run_grid(job)
        coord.adopt("r0", result)
        coord.adopt("r0", result)  # the second copy's result: ignored
        assert len(planner.tuner.history) == 1 and not planner.tuner.pending
        assert coord.resend_jobs() == 0
        ray.kill(ray.get_actor(settings.tuner_name, namespace=NAMESPACE))
