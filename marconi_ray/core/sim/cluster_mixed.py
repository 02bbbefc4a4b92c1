"""The systems of mixed replicas (each prefills and decodes its own requests):

- `colocated`: one cache of all the bytes that every replica reads in place at no cost,
  the bound the targets compare with ("one co-located cache of the same total bytes");
  a request goes to the replica free soonest (ties: the lowest index).
- `mixed`: P + D mixed replicas, each its own cache of an equal share; the router rule
  (`core.sim.cluster_route`) picks the replica, which prefills from its own hit, decodes
  and commits the prompt and its output.
- `mixed+remote`: `mixed`, and when the deepest hit in the cluster is on another replica,
  the chosen one pulls it first when the clock says that finishes sooner than
  prefilling from its own hit (routing is `mixed`'s, so the difference is the pulls).
"""

from __future__ import annotations

from typing import ClassVar

from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.sim.cluster_config import ClusterConfig
from marconi_ray.core.sim.cluster_replica import Replica
from marconi_ray.core.sim.cluster_result import Served
from marconi_ray.core.sim.cluster_system import (
    ClusterSystem,
    Option,
    Tokens,
    cheapest,
    deepest,
    turn_tokens,
)


class Colocated(ClusterSystem):
    """One cache shared by every replica (module docstring)."""

    name: ClassVar[str] = "colocated"

    def __init__(self, cost: CostModel, cfg: ClusterConfig) -> None:
        super().__init__(cost, cfg)
        (self.shared,) = self._build("cache")
        self.workers = self._build("mixed")

    @classmethod
    def roles(cls, cfg: ClusterConfig) -> dict[str, tuple[int, bool]]:
        return {"cache": (1, True), "mixed": (cfg.replicas, False)}

    def replicas(self) -> list[Replica]:
        return [self.shared, *self.workers]

    def serve(self, prompt: Tokens, output: Tokens, now: float) -> Served:
        worker = min(self.workers, key=lambda r: (max(r.busy_until, now), r.index))
        hit = self.shared.serve(prompt, turn_tokens(prompt, output), prefilled=True)
        opt = self._local(worker, hit, len(prompt), now)
        end = worker.run(now, self._seconds(len(prompt), hit))
        self._decode(worker, end, len(output))
        return self._served(opt, hit, end, now, opt.finish)


class Mixed(ClusterSystem):
    """Mixed replicas, each its own cache (module docstring)."""

    name: ClassVar[str] = "mixed"
    remote: ClassVar[bool] = False

    def __init__(self, cost: CostModel, cfg: ClusterConfig) -> None:
        super().__init__(cost, cfg)
        self.mixed = self._build("mixed")

    @classmethod
    def roles(cls, cfg: ClusterConfig) -> dict[str, tuple[int, bool]]:
        return {"mixed": (cfg.replicas, True)}

    def replicas(self) -> list[Replica]:
        return list(self.mixed)

    def serve(self, prompt: Tokens, output: Tokens, now: float) -> Served:
        n = len(prompt)
        probes = [r.probe(prompt) for r in self.mixed]
        b = self._route(self.mixed, probes, now)
        here = self.mixed[b]
        local = self._local(here, probes[b].hit, n, now)
        options: list[Option] = [local]
        src = deepest(probes) if self.remote else None
        if src is not None and probes[src].hit > probes[b].hit:
            options.append(self._pull(here, probes[b], self.mixed[src], probes[src].hit, n, now))
        opt = cheapest(options)
        hit, end = self._prefill(opt, prompt, turn_tokens(prompt, output))
        self._decode(here, end, len(output))
        return self._served(opt, hit, end, now, local.finish)


class MixedRemote(Mixed):
    """`mixed` with pulls of the deepest hit (module docstring)."""

    name: ClassVar[str] = "mixed+remote"
    remote: ClassVar[bool] = True
