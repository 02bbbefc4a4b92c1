"""Messages between the ingress, the coordinator and the replicas (picklable dataclasses,
no tensors)."""

from __future__ import annotations

from dataclasses import dataclass, field

from marconi_ray.core.prefix_cache import PrefixCache
from marconi_ray.engine.orders import PrefillOrder, Release
from marconi_ray.engine.results import Timings, Usage


@dataclass(frozen=True)
class Dispatch:
    """The coordinator's decision for one request: which replica runs it, its prefill
    order, and what the replica must free first (evicted while reserving room)."""

    replica_id: str
    order: PrefillOrder
    release: Release = field(default_factory=Release)


class MisroutedDispatch(RuntimeError):
    """A replica was handed a dispatch planned for another replica (which has gone)."""


@dataclass(frozen=True)
class Completed:
    """The last event of a request's stream: its usage, finish reason and timings."""

    request_id: int
    finish_reason: str
    usage: Usage
    timings: Timings


@dataclass(frozen=True)
class ReplicaStats:
    """One replica's cache figures, as the coordinator sees them (for `/metrics`).

    Attributes:
        stats: `core.stats.CacheStats.to_dict()` (requests, hit tokens, FLOPs saved,
            states admitted by reason, evictions, ...).
        bytes_by_kind: bytes held now, {"kv": ..., "ssm": ...}.
        in_flight: requests planned on this replica and not yet committed or aborted.
        tuner_runs: alpha searches adopted so far.
    """

    replica_id: str
    capacity: int
    bytes_used: int
    reserved: int
    bytes_by_kind: dict[str, int]
    alpha: float
    in_flight: int
    tuner_runs: int
    stats: dict[str, object]

    @classmethod
    def of(
        cls, replica_id: str, cache: PrefixCache, in_flight: int, tuner_runs: int
    ) -> ReplicaStats:
        """A snapshot of `cache`'s figures."""
        return cls(
            replica_id=replica_id,
            capacity=cache.capacity,
            bytes_used=cache.bytes_used,
            reserved=cache.reserved,
            bytes_by_kind=cache.bytes_by_kind(),
            alpha=cache.alpha,
            in_flight=in_flight,
            tuner_runs=tuner_runs,
            stats=cache.stats.to_dict(),
        )
