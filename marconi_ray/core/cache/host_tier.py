"""`HostTier`: the second, slower tier of a prefix cache (host memory), and the clock
that prices moving a node between the tiers against recomputing it.

A two-tier cache holds every node's KV tokens and its SSM state in one of two tiers:
the device (HBM, the cache's `capacity_bytes`) or the host (`HostTier.capacity_bytes`).
Device eviction either demotes its victim to the host or drops it; host eviction drops.
A hit whose path holds host bytes has them promoted before the resumed prefill.

Placement (`PLACEMENTS`):
- `flop_aware`: demote a device victim only when a later hit on it saves more time
  than copying it back costs: prefill seconds of the tokens its state saves
  (`prefill_seconds`) > its bytes over the copy bandwidth (`copy_seconds`); the host
  tier then evicts by the cache's eviction policy like the device does.
- `lru`: demote every device victim (what SGLang's HiCache and LMCache do); the
  eviction policy still picks the victims.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PLACEMENTS = ("flop_aware", "lru")
DEFAULT_HOST_GBPS = 50.0
"""Host <-> device copy bandwidth, GB/s: PCIe 5.0 x16 as measured, roughly."""
DEFAULT_PREFILL_TFLOPS = 400.0
"""Prefill speed, TFLOP/s: an H200's dense bf16 peak (989) at about 40% utilisation."""


def _positive(value: float, name: str) -> float:
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


@dataclass(frozen=True)
class HostTier:
    """The host tier's budget and the clock its placement decisions use.

    Attributes:
        capacity_bytes: host bytes the cache may hold (0: one tier, today's cache).
        gbps: copy bandwidth between the tiers, GB/s (1e9 bytes per second).
        prefill_tflops: prefill speed, TFLOP/s, that turns FLOPs saved into seconds.
        placement: `flop_aware` or `lru` (see the module docstring).
    """

    capacity_bytes: int = 0
    gbps: float = DEFAULT_HOST_GBPS
    prefill_tflops: float = DEFAULT_PREFILL_TFLOPS
    placement: str = "flop_aware"

    def __post_init__(self) -> None:
        if isinstance(self.capacity_bytes, bool) or not isinstance(
            self.capacity_bytes, int | np.integer
        ):
            raise ValueError(f"host capacity_bytes must be an integer, got {self.capacity_bytes!r}")
        if self.capacity_bytes < 0:
            raise ValueError(f"host capacity_bytes must be >= 0, got {self.capacity_bytes}")
        _positive(self.gbps, "host gbps")
        _positive(self.prefill_tflops, "prefill_tflops")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"unknown placement {self.placement!r}; choose from {PLACEMENTS}")

    @property
    def enabled(self) -> bool:
        return self.capacity_bytes > 0

    def copy_seconds(self, n_bytes: float) -> float:
        """Seconds to copy `n_bytes` between the tiers."""
        return float(n_bytes) / (self.gbps * 1e9)

    def prefill_seconds(self, flops: float) -> float:
        """Seconds to prefill `flops` FLOPs."""
        return float(flops) / (self.prefill_tflops * 1e12)

    def worth_demoting(self, flops_saved: float, n_bytes: int) -> bool:
        """Does keeping `n_bytes` on the host pay: a hit then saves `flops_saved` FLOPs of
        prefill at the cost of copying the bytes back? Always True for `lru`."""
        if self.placement == "lru":
            return True
        return self.prefill_seconds(flops_saved) > self.copy_seconds(n_bytes)


NO_HOST_TIER = HostTier()
"""One tier: no host memory."""
