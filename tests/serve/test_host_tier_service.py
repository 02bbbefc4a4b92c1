"""The host tier through the service, in process (no Ray): the real coordinator keeps
what replicas' heartbeats report of their stores and `/metrics` renders it with the
caches' per-tier figures; with a real worker the two sides agree."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import torch
from coordinator_helpers import Clock, applied, make_settings, make_worker, register, turn
from prometheus_client.parser import text_string_to_metric_families

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.metrics import IngressMetrics, render_metrics

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("host") / "tiny")


def scrape(coord: CacheCoordinator) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = render_metrics(IngressMetrics(), coord.stats()).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_heartbeats_carry_store_figures_to_metrics(model_dir: Path) -> None:
    settings = make_settings(model_dir, host_cache_bytes=5_000_000)
    coord = CacheCoordinator(settings, journal=MemoryJournal(), clock=Clock())
    coord.register_replica("r0", 100, 1000)
    (stats,) = coord.stats()
    assert (stats.store, stats.host_capacity) == ({}, 5_000_000)
    assert stats.bytes_by_tier == {"device": 0, "host": 0}
    figures = {"bytes_to_host": 4096.0, "seconds_to_host": 0.5, "host_bytes": 4096.0}
    assert coord.heartbeat("r0", [], 0, figures)[0] == "ok"
    assert coord.heartbeat("r0", [], 0)[0] == "ok"  # no figures this time: the last kept
    assert coord.heartbeat("ghost", [], 0, figures)[0] == "register"
    got = scrape(coord)
    to_host = (("direction", "to_host"), ("replica", "r0"))
    assert got[("marconi_store_tier_copied_bytes_total", to_host)] == 4096
    assert got[("marconi_store_tier_copy_seconds_total", to_host)] == 0.5
    assert got[("marconi_store_host_bytes", (("replica", "r0"),))] == 4096
    host = (("replica", "r0"), ("tier", "host"))
    assert got[("marconi_cache_tier_capacity_bytes", host)] == 5_000_000
    assert not any("ghost" in str(key) for key in got)
    coord.unregister_replica("r0")
    coord.register_replica("r0", 100, 1000)
    assert coord.stats()[0].store == {}  # a new cache: the old store's figures are gone


def test_a_real_store_and_the_coordinator_agree(model_dir: Path) -> None:
    """Three interleaved chats through a device tier that holds about one: the store's
    moves per direction are the cache's demotions and promotions, and its host bytes
    the cache's host tier. LRU placement: on the tiny model no copy is slower than the
    prefill it saves at the default clock, so `flop_aware` would demote nothing."""
    settings = make_settings(
        model_dir, cache_bytes=100_000, host_cache_bytes=10**7, host_placement="lru"
    )
    coord = CacheCoordinator(settings, journal=MemoryJournal(), clock=Clock())
    worker = make_worker(model_dir)
    register(coord, worker)
    rng = np.random.default_rng(0)
    chats = [[int(t) for t in rng.integers(1, 500, 30)] for _ in range(3)]
    for _ in range(3):
        for i, history in enumerate(chats):
            prompt = history + [int(t) for t in rng.integers(1, 500, 8)]
            out, _ = turn(coord, worker, prompt)
            chats[i] = prompt + out
    coord.heartbeat("r0", [], applied(worker), worker.store.tier_stats())
    (stats,) = coord.stats()
    cache = stats.stats
    assert cache["demotions"] and cache["promotions"] and cache["host_hit_tokens"]
    got = scrape(coord)
    r0 = (("replica", "r0"),)
    for way, key in (("to_host", "demotions"), ("to_device", "promotions")):
        direction = (("direction", way), ("replica", "r0"))
        assert got[("marconi_store_tier_moves_total", direction)] == cache[key]
        assert got[("marconi_store_tier_copied_bytes_total", direction)] > 0
        assert got[("marconi_store_tier_copy_seconds_total", direction)] > 0
    host = got[("marconi_cache_tier_bytes", (("replica", "r0"), ("tier", "host")))]
    assert host == got[("marconi_store_host_bytes", r0)] == stats.bytes_by_tier["host"] > 0


def test_the_local_backend_reports_its_store_with_a_host_tier(model_dir: Path) -> None:
    for host, reported in ((0, False), (10**7, True)):
        engine = Engine(model_dir, system="marconi", cache_bytes=10**6, host_cache_bytes=host)
        (stats,) = asyncio.run(LocalBackend(engine).stats())
        assert stats.host_capacity == host
        assert bool(stats.store) is reported
        assert stats.store.get("host_bytes", 0.0) == 0.0
