"""Bootstrap alpha tuner: phases, window size, grid evaluation, parallel maps agree."""

from __future__ import annotations

import itertools
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest
from core_helpers import SMALL_COST, cache, chat_requests

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.tuner import (
    BootstrapTuner,
    TuneJob,
    TunerConfig,
    default_grid,
    pick_best,
    run_grid,
)
from marconi_ray.core.sim.replay import RunConfig, run_replay


def test_default_grid_is_0_to_2_step_0_1() -> None:
    grid = default_grid()
    assert len(grid) == 21 and grid[0] == 0.0 and grid[-1] == 2.0 and grid[1] == 0.1


def test_window_is_multiplier_times_requests_before_first_eviction() -> None:
    reqs = chat_requests(8, 10, seed=2)
    c = cache(capacity=1200)
    tuner = BootstrapTuner(TunerConfig(multiplier=3))
    job = None
    first_eviction_at = None
    for i, r in enumerate(reqs):
        c.serve(r.input_tokens, r.output_tokens)
        if first_eviction_at is None and c.stats.evictions:
            first_eviction_at = i + 1
        job = tuner.after_request(c, r)
        if job is not None:
            break
    assert first_eviction_at is not None and job is not None
    assert len(job.window) == 3 * first_eviction_at
    assert job.start_request == first_eviction_at
    assert tuner.phase == "tuning"
    result = run_grid(job)
    tuner.adopt(result, c)
    assert c.alpha == result.best_alpha and tuner.phase == "done"
    assert len(result.scores) == 21


def test_ties_go_to_the_smallest_alpha_and_best_score_wins() -> None:
    assert pick_best([0.0, 0.5, 1.0], [0.2, 0.4, 0.4]) == 0.5
    assert pick_best([0.0, 0.5, 1.0], [0.9, 0.4, 0.4]) == 0.0


def test_process_pool_and_serial_grids_agree() -> None:
    reqs = chat_requests(8, 10, seed=4)
    c = cache(capacity=1200)
    tuner = BootstrapTuner(TunerConfig(multiplier=2, grid=(0.0, 0.5, 1.0, 2.0)))
    job = None
    for r in reqs:
        c.serve(r.input_tokens, r.output_tokens)
        job = job or tuner.after_request(c, r)
    assert job is not None
    serial = run_grid(job)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
        parallel = run_grid(job, pool.map)
        shared = run_grid(job, pool.map, n_tasks=2)
    assert serial.scores == parallel.scores == shared.scores
    assert serial.best_alpha == parallel.best_alpha == shared.best_alpha


def test_grid_shares_interleave_and_cover_every_alpha() -> None:
    reqs = chat_requests(3, 2, seed=7)
    c = cache(capacity=10**6)
    for r in reqs:
        c.serve(r.input_tokens, r.output_tokens)
    pairs = tuple((r.input_tokens, r.output_tokens) for r in reqs)
    job = TuneJob(cache_codec.snapshot(c), pairs, (0.0, 0.1, 0.2, 0.3, 0.4), "token_hit_rate", 0)
    assert [t.alphas for t in job.tasks(2)] == [(0.0, 0.2, 0.4), (0.1, 0.3)]
    assert len(job.tasks()) == 5 and len(job.tasks(99)) == 5 and len(job.tasks(0)) == 1


def test_retuning_runs_on_every_window() -> None:
    reqs = chat_requests(8, 12, seed=5)
    cfg = RunConfig("marconi", 1200, tuner=TunerConfig(multiplier=1, retune_every=10))
    result = run_replay(reqs, SMALL_COST, cfg)
    assert len(result.alpha_history) >= 3
    starts = [s for s, _ in result.alpha_history]
    assert all(b - a == 10 for a, b in itertools.pairwise(starts[1:]))


def test_tuned_alpha_never_loses_to_lru_on_its_own_window() -> None:
    reqs = chat_requests(10, 10, seed=6)
    c = cache(capacity=1500)
    tuner = BootstrapTuner(TunerConfig(multiplier=2))
    job = None
    for r in reqs:
        c.serve(r.input_tokens, r.output_tokens)
        job = job or tuner.after_request(c, r)
    assert job is not None
    scores = dict(run_grid(job).scores)
    assert max(scores.values()) >= scores[0.0]


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"grid": ()}, "empty"),
        ({"multiplier": 0}, "multiplier"),
        ({"objective": "speed"}, "speed"),
        ({"grid": (0.0, -1.0)}, "grid"),
        ({"retune_every": 0}, "retune_every"),
    ],
)
def test_bad_tuner_settings_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TunerConfig(**kwargs)  # type: ignore[arg-type]
