"""The named caching systems compared in the paper, as policy compositions (registry).

- `vanilla`: no prefix caching.
- `vllm+`: a state at every full 32-token block, as real vLLM caches (the last, partial
  block is not cached), LRU over leaf blocks.
- `vllm+refill`: the paper's vLLM+ as its artifact runs it: the last partial block holds a
  state too, refilled in place when a later request completes that block.
- `sglang+`: Marconi's judicious admission with LRU over leaves.
- `marconi`: judicious admission + FLOP-aware eviction with bootstrap alpha tuning.
- `marconi+`: Marconi plus gated speculative checkpoints at geometric block boundaries
  of long inputs (see `core.cache.admission.MarconiPlusAdmission`), same eviction and tuning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from marconi_ray.core.cache.admission import make_admission
from marconi_ray.core.cache.host_tier import NO_HOST_TIER, HostTier
from marconi_ray.core.cache.prefix_cache import CacheConfig
from marconi_ray.core.model.cost_model import DEFAULT_EFFICIENCY


@dataclass(frozen=True)
class SystemSpec:
    """A system: policies, and whether alpha is tuned online (`tuned`)."""

    name: str
    admission: str
    eviction: str
    tuned: bool = False

    def cache_config(
        self,
        capacity_bytes: int,
        alpha: float = 0.0,
        recency: str = "timestamp",
        efficiency: str = DEFAULT_EFFICIENCY,
        host: HostTier = NO_HOST_TIER,
    ) -> CacheConfig:
        """This system's cache with `capacity_bytes` of device memory and `host`."""
        return CacheConfig(
            capacity_bytes, self.admission, self.eviction, alpha, recency, efficiency, host
        )


SYSTEMS: Mapping[str, SystemSpec] = MappingProxyType(
    {
        "vanilla": SystemSpec("vanilla", "none", "lru"),
        "vllm+": SystemSpec("vllm+", "fine_grained:32", "lru"),
        "vllm+refill": SystemSpec("vllm+refill", "fine_grained_refill:32", "lru"),
        "sglang+": SystemSpec("sglang+", "marconi", "lru"),
        "marconi": SystemSpec("marconi", "marconi", "flop_aware", tuned=True),
        "marconi+": SystemSpec("marconi+", "marconi+", "flop_aware", tuned=True),
    }
)


def get_system(name: str) -> SystemSpec:
    """Look a system up by name; ValueError naming it when unknown. `marconi+:B` is
    `marconi+` with speculative checkpoints at B * 2**k (B tokens > 0)."""
    spec = SYSTEMS.get(name)
    if spec is None and name.startswith("marconi+:"):
        make_admission(name)  # a bad block size raises here, naming it
        return SystemSpec(name, name, "flop_aware", tuned=True)
    if spec is None:
        raise ValueError(f"unknown system {name!r}; choose from {sorted(SYSTEMS)}")
    return spec
