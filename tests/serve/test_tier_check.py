"""`tier_mismatch`: which of a tree's ids a store holds in the other tier, ids that
queued moves will still move aside."""

from __future__ import annotations

import numpy as np

from marconi_ray.core.cache.host_tier import HostTier
from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.protocol.orders import Move, Release
from marconi_ray.serve.coordinator.tier_check import tier_mismatch


def _two_tier_cache() -> PrefixCache:
    """A device for one 20-token request; the second demotes the first to the host."""
    cost = CostModel(1000.0, 1.0, 10, 100)
    cache = PrefixCache(cost, CacheConfig(350, host=HostTier(10**6, placement="lru")))
    for start, kv in ((1, 0), (40, 100)):
        plan = cache.plan(np.arange(start, start + 20, dtype=np.int32))
        cache.commit(plan, plan.tokens, {20: start}, np.arange(kv, kv + 20), 0)
    return cache


def test_the_store_must_hold_the_trees_host_ids_on_the_host() -> None:
    cache = _two_tier_cache()
    states, slots = cache.referenced_on_host()
    assert (states, slots) == ({1}, set(range(20)))
    assert (
        tier_mismatch(cache, cache.referenced(), Release(), None, None) == 0
    )  # the store did not say
    assert tier_mismatch(cache, cache.referenced(), Release(), [1], list(range(20))) == 0
    assert (
        tier_mismatch(cache, cache.referenced(), Release(), [], list(range(20))) == 1
    )  # state 1 on the device
    assert (
        tier_mismatch(cache, cache.referenced(), Release(), [1], [*range(19), 100]) == 2
    )  # 19 down, 100 up
    queued = Release(moves=(Move(True, (1,), np.asarray([19], dtype=np.int64)),))
    assert (
        tier_mismatch(cache, cache.referenced(), queued, [], list(range(19))) == 0
    )  # still on its way
