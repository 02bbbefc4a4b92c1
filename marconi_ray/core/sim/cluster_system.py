"""`ClusterSystem`: the shape every system of the cluster replay shares, and the ways to
get a prompt's first token (`Option`) that systems choose among by the clock.

An `Option` prefills the prompt on one replica from a hit: `local` (the replica's own
hit; `recompute` when it is 0), `decode_suffix` (a decode replica's own hit, `both`
only) or `pull` (the deepest hit in the cluster, copied from its source to the replica
first: the copy's seconds at `transfer_gbps` delay the prefill's start; the prefill runs
when both the copy has landed and the replica is free). Its estimated finish is what the
replica's queue and the clock say; `cheapest` takes the earliest, preferring no copy,
then the longer hit, then the earlier option. Serving an option (`_prefill`) queues the
same job on the same replica, so the estimate is the TTFT unless the pulled entry did not
fit in the receiving cache.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.sim.cluster_config import ClusterConfig
from marconi_ray.core.sim.cluster_replica import Replica
from marconi_ray.core.sim.cluster_result import Served
from marconi_ray.core.sim.cluster_route import Probe

Tokens = npt.NDArray[np.int32]


@dataclass(frozen=True)
class Option:
    """One way to prefill a prompt (module docstring).

    Attributes:
        route: `local`, `decode_suffix` or `pull` (`local` with hit 0 is served as
            `recompute`).
        replica: where the prefill runs.
        hit: tokens it starts from.
        ready: when the prefill may start (the arrival, or when the pulled copy lands).
        finish: its estimated end.
        source: the replica a pull copies from (None otherwise).
        pull_bytes: the copy's bytes (0 without a pull).
    """

    route: str
    replica: Replica
    hit: int
    ready: float
    finish: float
    source: Replica | None = None
    pull_bytes: int = 0


def cheapest(options: Sequence[Option]) -> Option:
    """The option (of a non-empty list) that finishes first; ties: no copy, then the
    longer hit, then the earlier in the list."""
    best = min(
        range(len(options)),
        key=lambda i: (options[i].finish, options[i].pull_bytes > 0, -options[i].hit, i),
    )
    return options[best]


def turn_tokens(prompt: Tokens, output: Tokens) -> Tokens:
    """The prompt followed by its output: what a replica that decoded it holds."""
    return np.concatenate([prompt, output]) if len(output) else prompt


def deepest(probes: Sequence[Probe]) -> int | None:
    """The index of the first probe with the longest hit, None when no hit is > 0."""
    best = max(range(len(probes)), key=lambda i: (probes[i].hit, -i), default=None)
    return best if best is not None and probes[best].hit > 0 else None


class ClusterSystem(ABC):
    """A cluster of replicas serving one request after another (arrival order).

    Contract of `serve`: `prompt` (non-empty int32) arrives at `now` (never decreasing
    between calls); the system routes it, plans and commits it on the caches that see
    it, queues its prefill and decode jobs, and returns how it was served.
    """

    name: ClassVar[str]

    def __init__(self, cost: CostModel, cfg: ClusterConfig) -> None:
        self.cost = cost
        self.cfg = cfg
        self.clock = cfg.clock

    @classmethod
    @abstractmethod
    def roles(cls, cfg: ClusterConfig) -> dict[str, tuple[int, bool]]:
        """Per role: how many replicas, and whether they cache."""

    @classmethod
    def split_over(cls, cfg: ClusterConfig) -> int:
        """How many equal shares the total is cut into: one per replica that caches."""
        return sum(n for n, caches in cls.roles(cfg).values() if caches)

    @classmethod
    def shares(cls, cfg: ClusterConfig) -> dict[str, tuple[int, int]]:
        """Per role: how many replicas and the cache bytes of each (0: none): the total
        split into `split_over` equal shares (`core.sim.cluster_config`). ValueError when
        a share would be 0 bytes."""
        roles = cls.roles(cfg)
        parts = cls.split_over(cfg)
        each = cfg.total_cache_bytes // parts
        if each <= 0:
            raise ValueError(
                f"total_cache_bytes {cfg.total_cache_bytes} is too small to split into "
                f"{parts} caches"
            )
        return {role: (n, each if caches else 0) for role, (n, caches) in roles.items()}

    @abstractmethod
    def replicas(self) -> list[Replica]:
        """Every replica, caching or not."""

    @abstractmethod
    def serve(self, prompt: Tokens, output: Tokens, now: float) -> Served:
        """Serve one request (class docstring)."""

    def caches(self) -> list[tuple[str, PrefixCache]]:
        """(label, cache) of every replica that caches."""
        return [(repr(r), r.cache) for r in self.replicas() if r.cache is not None]

    # ---------------------------------------------------------------- helpers
    def _build(self, role: str) -> list[Replica]:
        count, each = self.shares(self.cfg)[role]
        return [
            Replica(i, role, PrefixCache(self.cost, self.cfg.cache_config(each)) if each else None)
            for i in range(count)
        ]

    def _route(self, replicas: Sequence[Replica], probes: Sequence[Probe], now: float) -> int:
        """The router rule's pick among `replicas` (their `probes` of the prompt)."""
        return self.cfg.route.choose(self.cost, probes, [r.open_at(now) for r in replicas])

    def _seconds(self, n: int, hit: int) -> float:
        return self.clock.prefill_seconds(self.cost, n - hit, hit)

    def _local(
        self, replica: Replica, hit: int, n: int, now: float, route: str = "local"
    ) -> Option:
        """Prefill `n` tokens on `replica` from its own `hit`."""
        return Option(route, replica, hit, now, replica.finish_if(now, self._seconds(n, hit)))

    def _pull(
        self, dst: Replica, dst_probe: Probe, src: Replica, hit: int, n: int, now: float
    ) -> Option:
        """Copy `src`'s entry of `hit` tokens to `dst` (the KV `dst` lacks and the
        state), then prefill the rest there."""
        n_bytes = self.clock.entry_bytes(self.cost, hit, min(dst_probe.matched, hit))
        ready = now + self.clock.transfer_seconds(n_bytes)
        finish = dst.finish_if(ready, self._seconds(n, hit))
        return Option("pull", dst, hit, ready, finish, src, n_bytes)

    def _prefill(self, opt: Option, prompt: Tokens, committed: Tokens) -> tuple[int, float]:
        """Serve `opt`: copy a pulled entry in, plan `prompt` and commit `committed` on its
        replica, queue the prefill; returns (the hit it started from, its end)."""
        if opt.source is not None:
            opt.source.touch(prompt)
            opt.replica.import_entry(prompt[: opt.hit])
        hit = opt.replica.serve(prompt, committed, prefilled=True)
        end = opt.replica.run(opt.ready, self._seconds(len(prompt), hit))
        return hit, end

    def _decode(self, replica: Replica, ready: float, n_output: int) -> None:
        """Queue the decode of `n_output` tokens on `replica` from `ready` (its share of
        the batched steps) and hold the request open there until its last token."""
        end = replica.run(ready, self.clock.decode_seconds(n_output))
        replica.hold(max(end, ready + self.clock.decode_residence(n_output)))

    def _served(
        self,
        opt: Option,
        hit: int,
        end: float,
        now: float,
        best_local: float,
        pd_bytes: int = 0,
        pd_s: float = 0.0,
    ) -> Served:
        """The `Served` of an option after `_prefill` (`best_local`: the estimated finish
        of the best option that copies nothing; `pd_*`: the P/D handoff)."""
        route = "recompute" if opt.route == "local" and hit == 0 else opt.route
        pull_s = opt.ready - now if opt.source is not None else 0.0
        return Served(
            hit,
            end - now,
            route,
            opt.finish - now,
            best_local - now,
            opt.pull_bytes,
            pull_s,
            pd_bytes,
            pd_s,
        )
