"""Real prefix caches in a known state, shared by the metrics and dashboard tests."""

from __future__ import annotations

import numpy as np

from marconi_ray.core.cache.host_tier import HostTier
from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.model.cost_model import CostModel

COST = CostModel(flops_linear=1000.0, flops_quadratic=1.0, kv_bytes_per_token=10, state_bytes=100)


def served_cache(capacity: int, seed: int) -> PrefixCache:
    """A real cache that served a few conversations (hits, admissions, evictions)."""
    cache = PrefixCache(COST, CacheConfig(capacity, alpha=0.5))
    rng = np.random.default_rng(seed)
    for _ in range(3):
        history = rng.integers(0, 50, 8).astype(np.int32)
        for _ in range(3):
            prompt = np.concatenate([history, rng.integers(0, 50, 4).astype(np.int32)])
            reply = rng.integers(0, 50, 3).astype(np.int32)
            cache.serve(prompt, reply)
            history = np.concatenate([prompt, reply])
    return cache


def tiered_cache(capacity: int = 800, host: int = 600, seed: int = 0) -> PrefixCache:
    """A real two-tier cache (LRU placement: every device victim is demoted) that served
    three interleaved conversations: demotions, promotions, hits read from the host and
    host evictions."""
    tier = HostTier(host, placement="lru")
    cache = PrefixCache(COST, CacheConfig(capacity, alpha=0.5, host=tier))
    rng = np.random.default_rng(seed)
    histories = [rng.integers(0, 50, 8).astype(np.int32) for _ in range(3)]
    for _ in range(3):
        for i, history in enumerate(histories):
            prompt = np.concatenate([history, rng.integers(0, 50, 4).astype(np.int32)])
            reply = rng.integers(0, 50, 3).astype(np.int32)
            cache.serve(prompt, reply)
            histories[i] = np.concatenate([prompt, reply])
    return cache
