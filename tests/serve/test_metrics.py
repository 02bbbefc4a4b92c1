"""`/metrics` text: ingress histograms and the replicas' cache figures, parsed back."""

from __future__ import annotations

import pytest
from cache_samples import COST, served_cache, tiered_cache
from prometheus_client.parser import text_string_to_metric_families

from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.serve.ingress.metrics import IngressMetrics, render_metrics
from marconi_ray.serve.messages import ReplicaStats


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture(scope="module")
def caches() -> dict[str, PrefixCache]:
    return {"r0": served_cache(10**6, 0), "r1": served_cache(1200, 1)}


def test_cache_figures_round_trip(caches: dict[str, PrefixCache]) -> None:
    stats = [ReplicaStats.of(n, c, i, i + 1) for i, (n, c) in enumerate(caches.items())]
    assert caches["r1"].stats.evictions > 0 and caches["r0"].stats.hit_tokens > 0
    text = render_metrics(IngressMetrics(), stats, tuner_runs=3).decode()
    got = samples(text)
    for name, cache in caches.items():
        r = (("replica", name),)
        s = cache.stats
        assert got[("marconi_cache_token_hit_rate", r)] == pytest.approx(s.token_hit_rate)
        assert got[("marconi_cache_request_hit_rate", r)] == pytest.approx(s.request_hit_rate)
        assert got[("marconi_cache_hit_tokens_total", r)] == s.hit_tokens
        assert got[("marconi_cache_input_tokens_total", r)] == s.input_tokens
        assert got[("marconi_cache_requests_total", r)] == s.requests
        assert got[("marconi_cache_flops_saved_total", r)] == pytest.approx(s.flops_saved)
        assert got[("marconi_cache_evictions_total", r)] == s.evictions
        assert got[("marconi_cache_capacity_bytes", r)] == cache.capacity
        assert got[("marconi_cache_used_bytes", r)] == cache.bytes_used
        assert got[("marconi_cache_reserved_bytes", r)] == cache.reserved
        assert got[("marconi_cache_alpha", r)] == cache.alpha
        for kind, value in cache.bytes_by_kind().items():
            key = ("marconi_cache_bytes", (("kind", kind), ("replica", name)))
            assert got[key] == value
        for reason, count in s.states_admitted.items():
            key = ("marconi_cache_states_admitted_total", (("reason", reason), ("replica", name)))
            assert got[key] == count
    assert got[("marconi_replica_in_flight", (("replica", "r1"),))] == 1
    assert got[("marconi_replica_tuner_runs_total", (("replica", "r1"),))] == 2
    assert got[("marconi_tuner_runs_total", ())] == 3


def test_ingress_histograms_and_counter() -> None:
    metrics = IngressMetrics()
    metrics.ttft.observe(0.02)
    metrics.ttft.observe(0.3)
    metrics.e2e.observe(1.5)
    metrics.count(200)
    metrics.count(200)
    metrics.count(400)
    got = samples(render_metrics(metrics, []).decode())
    assert got[("marconi_ttft_seconds_count", ())] == 2
    assert got[("marconi_ttft_seconds_sum", ())] == pytest.approx(0.32)
    assert got[("marconi_ttft_seconds_bucket", (("le", "0.025"),))] == 1
    assert got[("marconi_e2e_latency_seconds_count", ())] == 1
    assert got[("marconi_requests_total", (("status", "200"),))] == 2
    assert got[("marconi_requests_total", (("status", "400"),))] == 1
    assert got[("marconi_tuner_runs_total", ())] == 0


def test_registries_are_per_ingress() -> None:
    a, b = IngressMetrics(), IngressMetrics()
    a.count(200)
    assert ("marconi_requests_total", (("status", "200"),)) not in samples(
        render_metrics(b, None).decode()
    )


def test_coordinator_down_leaves_cache_figures_out() -> None:
    text = render_metrics(IngressMetrics(), None).decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert "marconi_ttft_seconds" in names and "marconi_cache_alpha" not in names


def test_bad_stats_value_is_named() -> None:
    cache = PrefixCache(COST, CacheConfig(1000))
    stats = ReplicaStats.of("r", cache, 0, 0)
    stats.stats["hit_tokens"] = "many"
    with pytest.raises(ValueError, match="hit_tokens"):
        render_metrics(IngressMetrics(), [stats])


STORE = {
    "host_bytes": 490.0,
    "host_slots": 40.0,
    "host_states": 3.0,
    "bytes_to_host": 5000.0,
    "bytes_to_device": 2500.0,
    "seconds_to_host": 0.25,
    "seconds_to_device": 0.125,
    "moves_to_host": 9.0,
    "moves_to_device": 3.0,
}


def test_tier_figures_round_trip(caches: dict[str, PrefixCache]) -> None:
    """Bytes, budgets and hit tokens per tier, promotions and demotions from the caches;
    copies per direction from the store figures a replica reported (none reported: no
    store series for it)."""
    two = tiered_cache()
    s = two.stats
    assert s.demotions and s.promotions and s.host_evictions
    assert 0 < s.host_hit_tokens < s.hit_tokens
    stats = [
        ReplicaStats.of("two", two, 0, 0, store=STORE),
        ReplicaStats.of("one", caches["r0"], 0, 0),
    ]
    got = samples(render_metrics(IngressMetrics(), stats).decode())

    def at(name: str, replica: str, **labels: str) -> float:
        return got[(name, tuple(sorted({"replica": replica, **labels}.items())))]

    assert at("marconi_cache_tier_bytes", "two", tier="device") == two.bytes_used
    assert at("marconi_cache_tier_bytes", "two", tier="host") == two.bytes_by_tier()["host"] > 0
    assert at("marconi_cache_tier_capacity_bytes", "two", tier="device") == 800
    assert at("marconi_cache_tier_capacity_bytes", "two", tier="host") == 600
    assert at("marconi_cache_tier_hit_tokens_total", "two", tier="host") == s.host_hit_tokens
    device_hits = at("marconi_cache_tier_hit_tokens_total", "two", tier="device")
    assert device_hits == s.hit_tokens - s.host_hit_tokens
    for name, value in (
        ("promotions", s.promotions),
        ("promoted_bytes", s.promoted_bytes),
        ("demotions", s.demotions),
        ("demoted_bytes", s.demoted_bytes),
        ("host_evictions", s.host_evictions),
        ("host_hit_bytes", s.host_hit_bytes),
    ):
        assert at(f"marconi_cache_{name}_total", "two") == value, name
    assert at("marconi_cache_host_peak_bytes", "two") == s.host_peak_bytes
    for way in ("to_host", "to_device"):
        copied = at("marconi_store_tier_copied_bytes_total", "two", direction=way)
        assert copied == STORE[f"bytes_{way}"]
        seconds = at("marconi_store_tier_copy_seconds_total", "two", direction=way)
        assert seconds == STORE[f"seconds_{way}"]
        assert at("marconi_store_tier_moves_total", "two", direction=way) == STORE[f"moves_{way}"]
    assert at("marconi_store_host_bytes", "two") == 490
    one = caches["r0"]
    assert at("marconi_cache_tier_bytes", "one", tier="host") == 0
    assert at("marconi_cache_tier_capacity_bytes", "one", tier="host") == 0
    assert at("marconi_cache_tier_hit_tokens_total", "one", tier="device") == one.stats.hit_tokens
    assert at("marconi_cache_promotions_total", "one") == 0
    assert not [key for key in got if key[0].startswith("marconi_store") and "one" in str(key)]


def test_bad_store_figure_is_named() -> None:
    cache = PrefixCache(COST, CacheConfig(1000))
    stats = ReplicaStats.of("r", cache, 0, 0, store={**STORE, "seconds_to_host": "slow"})
    with pytest.raises(ValueError, match="store field 'seconds_to_host'"):
        render_metrics(IngressMetrics(), [stats])


def test_refused_releases_are_counted_per_replica(caches: dict[str, PrefixCache]) -> None:
    stats = [ReplicaStats.of("one", caches["r0"], 0, 0, refused_releases=3)]
    got = samples(render_metrics(IngressMetrics(), stats).decode())
    assert got[("marconi_replica_refused_releases_total", (("replica", "one"),))] == 3
