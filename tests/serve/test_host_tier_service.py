"""The host tier through the service, in process (no Ray): the real coordinator keeps
what replicas' heartbeats report of their stores and `/metrics` renders it with the
caches' per-tier figures."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from coordinator_helpers import Clock, make_settings
from prometheus_client.parser import text_string_to_metric_families

from marconi_ray.engine.factory import make_model
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
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
    assert coord.heartbeat("r0", [], [], figures)[0] == "ok"
    assert coord.heartbeat("r0", [], [])[0] == "ok"  # no figures this time: the last kept
    assert coord.heartbeat("ghost", [], [], figures)[0] == "register"
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
