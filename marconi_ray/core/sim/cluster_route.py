"""The router rule of the cluster replay (`core.sim.cluster_replay`): which of several
replicas of one role serves a request.

`pick` mirrors the live `cache_aware` router (`serve.coordinator.routing.routers`, which
`core` may not import): score = FLOPs the replica's usable hit saves - its open requests x
the prefill FLOPs of `load_tokens` tokens; a replica with more than `max_imbalance` open
requests above the least loaded is never picked; among the others one whose hit ends at a
leaf (it holds the state right after the session's previous turn) keeps the session, else
the best score wins; ties: fewer open requests, then the lower index. A replica without a
cache (a decode replica of `prefill_only`) has hit 0, so among such replicas the rule is
least loaded, then the lowest index.

`RouteRule.weigh_kv` (off by default, not what the live router does) scores the KV the
tree holds along the prompt instead of the usable hit: with Marconi's admission a prefix
two requests share holds no state until the second of them is checkpointed at the branch
point, which happens only where the first one's KV is, so a router that sees only usable
hits sends the second request wherever load says and the sharing is never found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from marconi_ray.core.model.cost_model import CostModel


@dataclass(frozen=True)
class Probe:
    """What one replica's cache holds of a prompt (read only, no side effects).

    Attributes:
        hit: usable cached prefix: tokens a resumed prefill skips (a state ends there).
        matched: prompt tokens whose KV the tree holds along the prompt's path, with or
            without a state at their end (>= `hit`; at most the prompt's length).
        at_leaf: the hit ends at a leaf of the tree (the session's last state).
    """

    hit: int = 0
    matched: int = 0
    at_leaf: bool = False


NO_PROBE = Probe()
"""The probe of a replica that caches nothing."""


@dataclass(frozen=True)
class View:
    """What the router sees of one replica for one prompt."""

    hit: int
    at_leaf: bool
    open_requests: int
    flops_saved: float


@dataclass(frozen=True)
class RouteRule:
    """The `cache_aware` rule's two knobs (module docstring), the live router's defaults
    (`ServeSettings.route_load_weight`, `route_max_imbalance`).

    Attributes:
        load_tokens: one open request is charged as the from-scratch prefill FLOPs of
            this many tokens (>= 0).
        max_imbalance: open requests a pick may have above the least loaded (>= 0).
        weigh_kv: score the prompt tokens whose KV a replica holds (`Probe.matched`)
            instead of its usable hit (module docstring).
    """

    load_tokens: int = 256
    max_imbalance: int = 4
    weigh_kv: bool = False

    def __post_init__(self) -> None:
        if self.load_tokens < 0:
            raise ValueError(f"load_tokens must be >= 0, got {self.load_tokens}")
        if self.max_imbalance < 0:
            raise ValueError(f"max_imbalance must be >= 0, got {self.max_imbalance}")

    def choose(self, cost: CostModel, probes: Sequence[Probe], open_requests: Sequence[int]) -> int:
        """The index of the replica to serve, given each one's probe and open requests
        (two sequences of one non-empty length, in replica order)."""
        lengths = [p.matched if self.weigh_kv else p.hit for p in probes]
        views = [
            View(h, p.at_leaf, n, float(cost.prefill_flops(h)) if h else 0.0)
            for h, p, n in zip(lengths, probes, open_requests, strict=True)
        ]
        return pick(views, float(cost.total_flops(self.load_tokens)), self.max_imbalance)


def pick(views: Sequence[View], queue_flops: float, max_imbalance: int) -> int:
    """The index in `views` (non-empty) of the replica to serve (module docstring)."""
    bound = min(v.open_requests for v in views) + max_imbalance
    ranked = [i for i, v in enumerate(views) if v.open_requests <= bound]
    pool = [i for i in ranked if views[i].at_leaf] or ranked

    def key(i: int) -> tuple[float, int, int]:
        v = views[i]
        return (v.flops_saved - v.open_requests * queue_flops, -v.open_requests, -i)

    return max(pool, key=key)
