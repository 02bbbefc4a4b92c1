"""The tuner actor on a real local Ray: same answer as the in-process grid, history, push."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import ray
from ray import cloudpickle
from ray_session import local_ray as shared_ray

from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.cache.tuner import BootstrapTuner, TuneJob, TunerConfig, TuneResult, run_grid
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.serve.coordinator.tuner_actor import start_tuner, stop_tuner
from marconi_ray.serve.settings import TunerSettings

pytestmark = pytest.mark.ray

NAMESPACE = "marconi-test-tuner"
COST = CostModel(flops_linear=1000.0, flops_quadratic=1.0, kv_bytes_per_token=10, state_bytes=100)
GRID = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0)


class RecordingCoordinator:
    """Test double of the coordinator's receiving end: records `adopt` calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, TuneResult]] = []

    def adopt(self, replica_id: str, result: TuneResult) -> None:
        self.calls.append((replica_id, result))

    def adopted(self) -> list[tuple[str, TuneResult]]:
        return self.calls


class _Req:
    def __init__(self, inp: np.ndarray, out: np.ndarray) -> None:
        self.input_tokens = inp
        self.output_tokens = out


def _chat_requests(n_sessions: int, turns: int, seed: int) -> list[_Req]:
    """Interleaved multi-turn sessions sharing a system prompt."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 50, 6).astype(np.int32)
    history = [prompt.copy() for _ in range(n_sessions)]
    out = []
    for _ in range(turns):
        for s in range(n_sessions):
            user = rng.integers(0, 50, int(rng.integers(1, 12))).astype(np.int32)
            inp = np.concatenate([history[s], user])
            reply = rng.integers(0, 50, int(rng.integers(1, 8))).astype(np.int32)
            out.append(_Req(inp, reply))
            history[s] = np.concatenate([inp, reply])
    return out


def _job(seed: int) -> TuneJob:
    """Serve chat sessions through a real cache + bootstrap tuner until a job is emitted."""
    cache = PrefixCache(COST, CacheConfig(1200, "marconi", "flop_aware", 0.0, "timestamp"))
    tuner = BootstrapTuner(TunerConfig(multiplier=2, grid=GRID))
    for req in _chat_requests(8, 10, seed):
        cache.serve(req.input_tokens, req.output_tokens)
        job = tuner.after_request(cache, req)
        if job is not None:
            return job
    raise AssertionError("no tuning job emitted")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    # the coordinator double is defined here, and Ray workers cannot import test modules
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with shared_ray():
        yield


@pytest.fixture()
def coordinator(local_ray: None) -> Iterator[tuple[str, Any]]:
    name = f"test-coordinator-{time.monotonic_ns()}"
    handle = ray.remote(RecordingCoordinator).options(name=name, namespace=NAMESPACE).remote()
    ray.get(handle.adopted.remote())  # wait until it is up
    yield name, handle
    ray.kill(handle)


@pytest.mark.parametrize("workers", [1, 2])
def test_tune_matches_in_process_grid_and_pushes(
    workers: int, coordinator: tuple[str, Any]
) -> None:
    coordinator_name, recorder = coordinator
    tuner_name = f"test-tuner-{workers}"
    tuner = start_tuner(
        TunerSettings(grid=GRID, workers=workers),
        coordinator_name,
        name=tuner_name,
        namespace=NAMESPACE,
        detached=False,
    )
    try:
        assert ray.get(tuner.runs.remote()) == 0
        jobs = [_job(seed=3), _job(seed=5)]
        for i, job in enumerate(jobs):
            expected = run_grid(job)
            result = ray.get(tuner.tune.remote(f"replica-{i}", job))
            assert result.best_alpha == expected.best_alpha
            assert result.scores == expected.scores
            assert (result.window_requests, result.start_request) == (
                len(job.window),
                job.start_request,
            )
            assert ray.get(tuner.runs.remote()) == i + 1

        history = ray.get(tuner.history.remote())
        assert [h["replica_id"] for h in history] == ["replica-0", "replica-1"]
        for h, job in zip(history, jobs, strict=True):
            expected = run_grid(job)
            assert h["best_alpha"] == expected.best_alpha
            assert [tuple(p) for p in h["scores"]] == list(expected.scores)
            assert (h["start_request"], h["window_requests"]) == (
                job.start_request,
                len(job.window),
            )
            assert h["workers"] == workers and h["pushed"] is True and h["wall_s"] > 0
            # each grid task reports its node: here, the one node of the local Ray
            assert h["nodes"] == [ray.get_runtime_context().get_node_id()] * workers

        deadline = time.monotonic() + 30
        while len(ray.get(recorder.adopted.remote())) < 2:
            assert time.monotonic() < deadline, "the coordinator never received the results"
            time.sleep(0.05)
        calls = ray.get(recorder.adopted.remote())
        assert [rid for rid, _ in calls] == ["replica-0", "replica-1"]
        assert [r.best_alpha for _, r in calls] == [run_grid(j).best_alpha for j in jobs]
        # the same named actor comes back while it lives
        again = start_tuner(TunerSettings(), name=tuner_name, namespace=NAMESPACE, detached=False)
        assert ray.get(again.runs.remote()) == 2
    finally:
        assert stop_tuner(tuner_name, NAMESPACE)


def test_without_coordinator_result_is_returned_not_pushed(local_ray: None) -> None:
    tuner = start_tuner(
        TunerSettings(grid=GRID, workers=2),
        "no-such-coordinator",
        name="test-tuner-lonely",
        namespace=NAMESPACE,
        detached=False,
    )
    try:
        job = _job(seed=7)
        result = ray.get(tuner.tune.remote("r0", job))
        assert result.best_alpha == run_grid(job).best_alpha
        assert ray.get(tuner.history.remote())[0]["pushed"] is False
        with pytest.raises(ray.exceptions.RayTaskError, match="replica_id"):
            ray.get(tuner.tune.remote("", job))
    finally:
        assert stop_tuner("test-tuner-lonely", NAMESPACE)
    assert not stop_tuner("test-tuner-lonely", NAMESPACE)
