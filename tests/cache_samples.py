"""Real prefix caches in a known state, shared by the metrics and dashboard tests."""

from __future__ import annotations

import numpy as np

from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.prefix_cache import CacheConfig, PrefixCache

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
