"""What the cluster replay measures (`core.sim.cluster_replay`): one `Served` per request,
summed into a `ClusterResult` per system; `verify` checks every cache afterwards.

Token hit rate = input tokens not recomputed (reused from the serving replica's cache,
or from a copy pulled in) / input tokens. TTFT is the modelled time from a request's
arrival to the end of its prefill (where its first token is sampled): queueing behind the
replica's earlier jobs, a pulled entry's copy when the prefill waits for it, and the
prefill of the uncached tokens. The P/D handoff (prefill to decode replica) comes after
the first token: its bytes and seconds are reported, not added to TTFT.

Routes: `local` (the serving replica's own hit, > 0), `recompute` (no hit), `decode_suffix`
(`both`: the decode replica holding the hit prefills the suffix itself), `pull` (the hit is
copied to the serving replica first).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.cache.prefix_cache import PrefixCache

ROUTES = ("local", "recompute", "decode_suffix", "pull")


@dataclass(frozen=True)
class Served:
    """How one request was served.

    Attributes:
        hit: input tokens not recomputed.
        ttft_s: modelled time to first token (module docstring).
        route: one of `ROUTES`.
        planned_s: the TTFT the clock estimated for the chosen way (`ttft_s` unless a
            pulled entry did not fit in the receiving cache).
        best_local_s: the estimated TTFT of the best way that copies nothing (equal to
            `planned_s` unless a pull was chosen: then `planned_s` is lower).
        pull_bytes, pull_s: the pulled entry's bytes and copy seconds (0 without a pull).
        pd_bytes, pd_s: the P/D handoff's bytes and seconds (0 without one).
    """

    hit: int
    ttft_s: float
    route: str
    planned_s: float
    best_local_s: float
    pull_bytes: int = 0
    pull_s: float = 0.0
    pd_bytes: int = 0
    pd_s: float = 0.0


@dataclass(frozen=True)
class ClusterResult:
    """One system's figures over a trace; `to_record` is a JSON-ready dict.

    `replicas`, `cache_bytes_each` and `utilisation` are per role (utilisation: the
    seconds of jobs a role's replicas ran / (their number x the arrival span), above 1
    when they fall behind the trace); `cache_bytes` is what all caches
    hold together (the total, less the remainder of the split; a third of it for
    `prefill_only_own`); `peak_fraction` is the largest peak bytes / capacity of any cache
    (<= 1: capacities are hard limits).
    """

    system: str
    total_cache_bytes: int
    cache_bytes: int
    replicas: dict[str, int]
    cache_bytes_each: dict[str, int]
    requests: int
    input_tokens: int
    hit_tokens: int
    token_hit_rate: float
    request_hit_rate: float
    ttft_p50_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    routes: dict[str, int]
    hit_tokens_by_route: dict[str, int]
    pull_bytes_per_request: float
    pd_bytes_per_request: float
    transfer_s_per_request: float
    utilisation: dict[str, float]
    peak_fraction: float
    evictions: int
    states_dropped: int
    wall_s: float

    def to_record(self) -> dict[str, object]:
        return dict(self.__dict__)


def summarize(
    system: str,
    total_cache_bytes: int,
    shares: Mapping[str, tuple[int, int]],
    inputs: Iterable[int],
    served: list[Served],
    caches: list[tuple[str, PrefixCache]],
    busy_s: Mapping[str, float],
    span_s: float,
    wall_s: float,
) -> ClusterResult:
    """The `ClusterResult` of `served` (one per request, `inputs` their input lengths;
    `busy_s`: per role, the seconds of jobs its replicas ran; `span_s`: from the first
    arrival to the last)."""
    n_input = np.fromiter(inputs, dtype=np.int64, count=len(served))
    hits = np.array([s.hit for s in served], dtype=np.int64)
    ttft = np.array([s.ttft_s for s in served], dtype=np.float64)
    n = len(served)
    routes = dict.fromkeys(ROUTES, 0)
    by_route = dict.fromkeys(ROUTES, 0)
    for s in served:
        routes[s.route] += 1
        by_route[s.route] += s.hit
    total_in = int(n_input.sum())

    def per_request(values: Iterable[float]) -> float:
        return float(sum(values)) / n if n else 0.0

    return ClusterResult(
        system=system,
        total_cache_bytes=total_cache_bytes,
        cache_bytes=sum(count * each for count, each in shares.values()),
        replicas={role: count for role, (count, _) in shares.items()},
        cache_bytes_each={role: each for role, (_, each) in shares.items()},
        requests=n,
        input_tokens=total_in,
        hit_tokens=int(hits.sum()),
        token_hit_rate=float(hits.sum()) / total_in if total_in else 0.0,
        request_hit_rate=float(np.mean(hits > 0)) if n else 0.0,
        ttft_p50_s=float(np.percentile(ttft, 50)) if n else 0.0,
        ttft_p99_s=float(np.percentile(ttft, 99)) if n else 0.0,
        ttft_mean_s=float(ttft.mean()) if n else 0.0,
        routes=routes,
        hit_tokens_by_route=by_route,
        pull_bytes_per_request=per_request(s.pull_bytes for s in served),
        pd_bytes_per_request=per_request(s.pd_bytes for s in served),
        transfer_s_per_request=per_request(s.pull_s + s.pd_s for s in served),
        utilisation={
            role: busy_s.get(role, 0.0) / (count * span_s) if span_s > 0 else 0.0
            for role, (count, _) in shares.items()
        },
        peak_fraction=max((c.stats.peak_bytes / c.capacity for _, c in caches), default=0.0),
        evictions=sum(c.stats.evictions for _, c in caches),
        states_dropped=sum(c.stats.states_dropped for _, c in caches),
        wall_s=wall_s,
    )


def verify(caches: list[tuple[str, PrefixCache]]) -> None:
    """AssertionError naming the cache and the broken invariant when a cache is not at
    rest and exact: its tree's invariants (`check_tree`: byte totals equal the sum over
    nodes, radix shape, eviction flags), no plan open, nothing reserved or locked, bytes
    held and the peak within capacity."""
    for label, cache in caches:
        try:
            check_tree(cache.tree)
        except AssertionError as exc:
            raise AssertionError(f"{label}: {exc}") from exc
        assert cache.open_plans == 0, f"{label}: {cache.open_plans} plans left open"
        assert cache.reserved == 0, f"{label}: {cache.reserved} bytes left reserved"
        assert cache.locked_nodes() == 0, f"{label}: {cache.locked_nodes()} nodes left locked"
        assert cache.bytes_used <= cache.capacity, f"{label}: holds {cache.bytes_used} bytes"
        assert cache.stats.peak_bytes <= cache.capacity, f"{label}: peak over capacity"


def gap_recovered(lower: ClusterResult, upper: ClusterResult, tried: ClusterResult) -> float | None:
    """The share of the hit-rate gap from `lower` to `upper` that `tried` recovers
    ((tried - lower) / (upper - lower)); None when there is no gap (upper <= lower)."""
    gap = upper.token_hit_rate - lower.token_hit_rate
    if gap <= 0:
        return None
    return (tried.token_hit_rate - lower.token_hit_rate) / gap
