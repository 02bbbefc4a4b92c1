"""The coordinator says at start what the cache's setting makes it not do for the served
model (`core.cache.findings`): once in its log, in `/health` and as
`marconi_cache_finding{code}` in `/metrics`; a restarted coordinator says it again. Real
coordinators over a tiny model's config (the replica's prices as it registers them)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from coordinator_helpers import make_settings
from replica_harness import Handle

from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.ingress.metrics import IngressMetrics, render_metrics
from marconi_ray.serve.ingress.ray_backend import RayBackend
from marconi_ray.serve.messages import ReplicaStats
from marconi_ray.serve.settings import TunerSettings

KV, STATE = 512, 33_792  # the tiny preset's prices


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("findings") / "tiny")


def _codes(coord: CacheCoordinator) -> list[str]:
    return [f["code"] for f in coord.health()["findings"]]


def test_a_host_tier_flop_aware_placement_never_uses_is_said_once_and_again_after_a_restart(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The issue's case: `tiny` with a 4 MB host tier under FLOP-aware placement drops
    every victim."""
    settings = make_settings(model_dir, host_cache_bytes=4_000_000, host_placement="flop_aware")
    journal = MemoryJournal()
    with caplog.at_level(logging.WARNING, logger="marconi_ray.serve.coordinator.actor"):
        coord = CacheCoordinator(settings, journal=journal)
        assert _codes(coord) == []  # no replica priced yet
        coord.register_replica("r0", KV, STATE)
        coord.register_replica("r1", KV, STATE)
    said = [r.message for r in caplog.records if "host_tier_unused" in r.message]
    assert len(said) == 1 and "host_placement lru" in said[0]
    assert _codes(coord) == ["host_tier_unused"]
    assert _codes(CacheCoordinator(settings, journal=journal)) == ["host_tier_unused"]
    lru = make_settings(model_dir, host_cache_bytes=4_000_000, host_placement="lru")
    quiet = CacheCoordinator(lru, journal=MemoryJournal())
    quiet.register_replica("r0", KV, STATE)
    assert _codes(quiet) == []


def test_settings_that_do_nothing_are_named(model_dir: Path) -> None:
    """`host_placement: lru` with no host budget, and tuner options beside a fixed alpha,
    are said to be ignored; the same settings where they work are not."""
    settings = make_settings(model_dir, host_placement="lru", alpha=1.0)
    tuned = make_settings(model_dir, host_cache_bytes=4_000_000, host_placement="lru")
    for s, want in ((settings, ["host_settings_ignored"]), (tuned, [])):
        coord = CacheCoordinator(s, journal=MemoryJournal())
        coord.register_replica("r0", KV, STATE)
        assert _codes(coord) == want
    grid = replace(settings, tuner=TunerSettings(grid=(0.0, 1.0)))
    coord = CacheCoordinator(grid, journal=MemoryJournal())
    coord.register_replica("r0", KV, STATE)
    assert _codes(coord) == ["host_settings_ignored", "tuner_ignored"]
    assert "alpha is fixed at 1.0" in coord.health()["findings"][1]["message"]


def test_findings_reach_health_and_metrics_across_a_group(model_dir: Path) -> None:
    small = make_settings(model_dir, cache_bytes=20_000, coordinators=2, system="vllm+", alpha=1.0)
    coords = [CacheCoordinator(s, journal=MemoryJournal()) for s in small.group()]
    coords[0].register_replica("r0", KV, STATE)
    coords[1].register_replica("r1", KV, STATE)
    backend = RayBackend([Handle(c) for c in coords], None)  # type: ignore[arg-type]
    health = asyncio.run(backend.health())
    codes = sorted(f["code"] for f in health["findings"])
    assert codes == ["alpha_ignored", "budget_below_one_entry"], "each once for the group"
    body = render_metrics(IngressMetrics(), [], 0, health["journal"], codes).decode()
    assert 'marconi_cache_finding{code="budget_below_one_entry"} 1.0' in body
    assert 'marconi_cache_finding{code="host_tier_unused"} 0.0' in body


def test_misses_for_want_of_a_state_reach_metrics() -> None:
    """A request that found 60 cached tokens and no state at their end is counted, with
    its share of the requests, per replica."""
    cache = PrefixCache(CostModel(1e3, 1.0, 10, 100), CacheConfig(10**9, "marconi", "flop_aware"))
    base = np.arange(7, 107, dtype=np.int32)
    for prompt in (base, np.concatenate([base[:60], np.arange(500, 540, dtype=np.int32)])):
        plan = cache.plan(prompt)
        cache.commit(plan, np.concatenate([prompt, np.arange(900, 904, dtype=np.int32)]))
    stats = [ReplicaStats.of("r0", cache, 0, 0)]
    body = render_metrics(IngressMetrics(), stats, 0).decode()
    assert 'marconi_cache_stateless_misses_total{replica="r0"} 1.0' in body
    assert 'marconi_cache_stateless_miss_tokens_total{replica="r0"} 60.0' in body
    assert 'marconi_cache_stateless_miss_share{replica="r0"} 0.5' in body


def test_a_coordinator_prices_sliding_windows(tmp_path: Path) -> None:
    """The coordinator's planners price a windowed model's attention by its window
    (`ModelSpec.window_terms` through `CacheState`), as the engine's cache does."""
    rgemma = make_model("tiny", "recurrent_gemma", tmp_path / "rgemma")
    coord = CacheCoordinator(make_settings(rgemma), journal=MemoryJournal())
    coord.register_replica("r0", KV, STATE)
    cost = coord.state.planners["r0"].cache.cost
    assert cost.windows and cost.flops_quadratic == 0.0
    assert cost.prefill_flops(1, 10_000) == cost.prefill_flops(1, 20_000)
