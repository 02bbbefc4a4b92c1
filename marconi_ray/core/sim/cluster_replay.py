"""Cluster replay: a trace served by a P/D or mixed cluster of replicas, each with a real
`PrefixCache`, at equal total cache bytes (issue 50, item 7(b)).

The systems (`CLUSTER_SYSTEMS`, strategy classes by name): `colocated` (one cache of all
the bytes, read in place by every replica: the bound), `prefill_only`, `both`
(`core.sim.cluster_pd`; `prefill_only_own` beside them, not at equal bytes), `mixed` and
`mixed+remote` (`core.sim.cluster_mixed`). Requests are served one at a time in arrival
order (`ts / speedup`): each is routed, planned and committed on the caches that see it,
and its prefill and decode jobs are queued on the replicas' clocks
(`core.sim.cluster_replica`), so the modelled TTFT includes queueing behind earlier
requests while caches change in arrival order, as in the single-cache replay
(`core.sim.replay`). After the run every cache is checked (`cluster_result.verify`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Protocol

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.cache_types import as_tokens
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.sim.cluster_config import ClusterConfig
from marconi_ray.core.sim.cluster_mixed import Colocated, Mixed, MixedRemote
from marconi_ray.core.sim.cluster_pd import Both, PrefillOnly, PrefillOnlyOwn
from marconi_ray.core.sim.cluster_result import ClusterResult, Served, summarize, verify
from marconi_ray.core.sim.cluster_system import ClusterSystem

CLUSTER_SYSTEMS: Mapping[str, type[ClusterSystem]] = MappingProxyType(
    {s.name: s for s in (Colocated, PrefillOnly, PrefillOnlyOwn, Both, Mixed, MixedRemote)}
)
"""The systems of the cluster replay by name, in report order."""


class TimedRequest(Protocol):
    """What the replay reads of a request (a `traces.trace.Request` is one)."""

    @property
    def ts(self) -> float: ...

    @property
    def input_tokens(self) -> npt.NDArray[np.int32]: ...

    @property
    def output_tokens(self) -> npt.NDArray[np.int32]: ...


def get_cluster_system(name: str) -> type[ClusterSystem]:
    """The system class called `name`; ValueError naming it and the choices otherwise."""
    system = CLUSTER_SYSTEMS.get(name)
    if system is None:
        raise ValueError(f"unknown cluster system {name!r}; choose from {list(CLUSTER_SYSTEMS)}")
    return system


def make_system(name: str, cost: CostModel, cfg: ClusterConfig) -> ClusterSystem:
    """A fresh cluster of system `name` (ValueError for an unknown name, or a total too
    small to split over its caches)."""
    return get_cluster_system(name)(cost, cfg)


def run_cluster(
    requests: Sequence[TimedRequest],
    cost: CostModel,
    system: str,
    cfg: ClusterConfig,
    on_request: Callable[[], None] | None = None,
    served: list[Served] | None = None,
) -> ClusterResult:
    """Replay `requests` (in arrival order: ValueError at the first that arrives before
    the one before it) through `system`.

    Args:
        on_request: called after each request (e.g. to advance a progress bar).
        served: when a list, each request's `Served` is appended to it, in order.
    """
    start = time.perf_counter()
    cluster = make_system(system, cost, cfg)
    caches = cluster.caches()
    out: list[Served] = [] if served is None else served
    first = len(out)
    last = 0.0
    first_ts = float(requests[0].ts) / cfg.speedup if len(requests) else 0.0
    for k, req in enumerate(requests):
        now = float(req.ts) / cfg.speedup
        if now < last:
            raise ValueError(f"request {k} arrives at {req.ts} s, before the one before it")
        last = now
        prompt = as_tokens(req.input_tokens, "input tokens")
        output = np.asarray(req.output_tokens, dtype=np.int32)
        out.append(cluster.serve(prompt, output, now))
        if cfg.check:
            verify(caches)
        if on_request is not None:
            on_request()
    verify(caches)
    busy: dict[str, float] = {}
    for rep in cluster.replicas():
        busy[rep.role] = busy.get(rep.role, 0.0) + rep.busy_s
    return summarize(
        system,
        cfg.total_cache_bytes,
        cluster.shares(cfg),
        (len(r.input_tokens) for r in requests),
        out[first:],
        caches,
        busy,
        last - first_ts,
        time.perf_counter() - start,
    )
