"""`ClusterConfig`: what every system of the cluster replay shares (`core.sim.cluster_replay`):
the total cache bytes, the replica counts, each cache's policies, the clock and the
router rule.

Equal total bytes: each system splits `total_cache_bytes` evenly over the replicas that
cache (`core.sim.cluster_system.ClusterSystem.shares`), so `colocated` holds all of it in
one cache, `prefill_only` an eighth on each of 8 prefill replicas, and `both`, `mixed`,
`mixed+remote` a 24th on each of 24 replicas (an integer split: together they hold at
most N - 1 bytes fewer than the total).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from marconi_ray.core.cache.admission import make_admission
from marconi_ray.core.cache.cache_types import CacheConfig
from marconi_ray.core.cache.eviction import make_eviction
from marconi_ray.core.sim.cluster_cost import ClusterCost
from marconi_ray.core.sim.cluster_route import RouteRule


@dataclass(frozen=True)
class ClusterConfig:
    """One cluster replay's shared settings.

    Attributes:
        total_cache_bytes: bytes all of a system's caches hold together (> 0).
        prefill_replicas: prefill replicas of the P/D systems (>= 1).
        decode_replicas: decode replicas of the P/D systems (>= 1); the mixed systems and
            `colocated` run `prefill_replicas + decode_replicas` replicas.
        admission: every cache's admission policy (`core.cache.admission`; `marconi`:
            states at branch points and after the last token).
        eviction: every cache's eviction policy (`flop_aware` or `lru`).
        alpha: the FLOP-efficiency weight of `flop_aware` eviction, fixed (no tuner; 0,
            the bootstrap tuner's start value, is recency only).
        clock: replica and link speeds (`core.sim.cluster_cost`).
        route: the router rule (`core.sim.cluster_route`).
        speedup: arrivals are replayed at `ts / speedup` (> 0; 1: the trace's own times).
        check: check every cache's tree after every request (slow; for tests).
    """

    total_cache_bytes: int
    prefill_replicas: int = 8
    decode_replicas: int = 16
    admission: str = "marconi"
    eviction: str = "flop_aware"
    alpha: float = 0.0
    clock: ClusterCost = field(default_factory=ClusterCost)
    route: RouteRule = field(default_factory=RouteRule)
    speedup: float = 1.0
    check: bool = False

    def __post_init__(self) -> None:
        if not self.total_cache_bytes > 0:
            raise ValueError(f"total_cache_bytes must be > 0, got {self.total_cache_bytes}")
        for name in ("prefill_replicas", "decode_replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (math.isfinite(self.speedup) and self.speedup > 0):
            raise ValueError(f"speedup must be a finite number > 0, got {self.speedup}")
        make_admission(self.admission)
        make_eviction(self.eviction, self.alpha)
        if not isinstance(self.clock, ClusterCost):
            raise ValueError(f"clock must be a ClusterCost, got {type(self.clock).__name__}")
        if not isinstance(self.route, RouteRule):
            raise ValueError(f"route must be a RouteRule, got {type(self.route).__name__}")

    @property
    def replicas(self) -> int:
        """Replicas of every system: prefill + decode."""
        return self.prefill_replicas + self.decode_replicas

    def cache_config(self, capacity_bytes: int) -> CacheConfig:
        """One replica's cache of `capacity_bytes` with this config's policies."""
        return CacheConfig(capacity_bytes, self.admission, self.eviction, self.alpha)
