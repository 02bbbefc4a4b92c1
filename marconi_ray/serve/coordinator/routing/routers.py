"""Routing strategies: which replica serves a request (checkpoint-aware routing).

The coordinator keeps one prefix cache per replica. A `Router` picks a replica id from
`ReplicaView`s, one per replica that may take the request (confirmed, with room in its
queue), in registration order. Strategies are classes in the `ROUTERS` registry, chosen
by name with `make_router(name, settings)` (an unknown name is a ValueError naming it).

A view holds what routing may weigh: the usable hit (the longest state-backed cached
prefix of the prompt on that replica), the prefill FLOPs that hit saves (the replica's
`CostModel.prefill_flops(hit)`), the replica's open requests (planned, not yet committed
or aborted: its queue and running batch), the FLOPs one queued request is worth, and
whether the replica holds the session's last state.

"Holds the session's last state" is read off the radix tree: the hit ends at a leaf.
A leaf's state is the one admitted after the last decoded token of a served request that
nothing has extended since; a prompt that walks down to it is that request's sequence
plus new tokens, i.e. the next turn of its conversation, and the hit covers the whole
previous turn. (A shared system prompt or document ends at an inner branch node, so it
does not count.)

Strategies:
- `cache_aware` (default). score = flops_saved - open_requests * queue_flops, where
  queue_flops = prefill FLOPs of `route_load_weight` tokens from scratch: a request
  waiting behind one more in-flight request is charged as if it had to prefill that many
  more tokens, so the hit and the queue are weighed in one unit (FLOPs ~ time). A replica
  is *overloaded* when its open requests exceed the least loaded replica's by more than
  `route_max_imbalance`; overloaded replicas are never chosen. Among the others, a
  replica holding the session's last state keeps the session (stickiness, whatever the
  score); otherwise the best score wins. Ties: fewer open requests, then registration
  order.
- `round_robin`: the replicas in registration order, cycling (ignores caches and load).
- `least_loaded`: fewest open requests; ties: longer hit, then registration order.

Two ways in, one answer. `route` (the reference) builds the view of every replica, each
a walk of its tree (`PrefixCache.peek`): O(replicas) per request. `pick` (what the
coordinator calls) takes an `Eligible`: the replicas a `prefix_index` walk names
(those that may hold a usable hit) and, of all the others (hit 0, no session), only the
least loaded; only the named are walked. A replica with hit 0 and no session never beats
a less loaded one of the same kind (nor an earlier one equally loaded) under these rules,
so `pick` returns exactly what `route` returns on the views of every eligible replica,
given that all replicas price FLOPs with one model's coefficients (as the coordinator's
do). `round_robin` needs no views: it takes the k-th eligible replica.

Routers are pure Python, single-threaded (the coordinator actor runs one call at a time),
and deterministic: the same views (and, for `round_robin`, the same number of earlier
calls) give the same choice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Final, NamedTuple, Protocol

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.serve.settings import ServeSettings

DEFAULT_ROUTING: Final = "cache_aware"


@dataclass(frozen=True)
class ReplicaView:
    """What a router sees of one replica for one prompt.

    Attributes:
        replica_id: the replica's id.
        hit_tokens: usable cached prefix of the prompt (tokens a resumed prefill skips).
        flops_saved: prefill FLOPs that hit saves on this replica (its cost model).
        open_requests: requests planned on the replica and not yet finished (its queue).
        queue_flops: FLOPs one open request is charged as (see `cache_aware`).
        holds_session: the hit ends at a leaf: the replica holds the state right after the
            previous turn of this conversation (see the module docstring).
    """

    replica_id: str
    hit_tokens: int = 0
    flops_saved: float = 0.0
    open_requests: int = 0
    queue_flops: float = 0.0
    holds_session: bool = False

    @classmethod
    def of(
        cls,
        replica_id: str,
        cache: PrefixCache,
        open_requests: int,
        prompt: npt.NDArray[np.int32],
        load_tokens: float,
    ) -> ReplicaView:
        """The view of a replica whose cache is `cache` (read only, no side effects on
        the tree; `peek` remembers its walk for the plan that follows); one open request
        is worth the prefill FLOPs of `load_tokens` tokens."""
        hit, at_leaf = cache.peek(prompt)
        cost = cache.cost
        return cls(
            replica_id=replica_id,
            hit_tokens=hit,
            flops_saved=cost.prefill_flops(hit) if hit else 0.0,
            open_requests=open_requests,
            queue_flops=queue_flops(cost, load_tokens),
            holds_session=at_leaf,
        )

    @classmethod
    def cold(
        cls, replica_id: str, cost: CostModel, open_requests: int, load_tokens: float
    ) -> ReplicaView:
        """The view `of` gives a replica known to hold no usable hit (no walk)."""
        return cls(replica_id, 0, 0.0, open_requests, queue_flops(cost, load_tokens), False)


def queue_flops(cost: CostModel, load_tokens: float) -> float:
    """`cost.total_flops(load_tokens)` for a real-valued length: what one open request is
    charged as."""
    flops = cost.flops_linear * load_tokens + cost.flops_quadratic * load_tokens**2
    for t in cost.windows:
        flops += t.coefficient * load_tokens * min(load_tokens, t.window)
    return float(flops)


class Contender(NamedTuple):
    """A replica an `Eligible` presents: `named` when it may hold a usable hit (the
    routing index names it, or it is the only eligible replica): its view needs a walk;
    else it holds none."""

    replica_id: str
    cache: PrefixCache
    open_requests: int
    named: bool


class Eligible(Protocol):
    """The replicas a request may go to (confirmed, with room), in registration order,
    as the coordinator's routing index presents them (see the module docstring)."""

    def __len__(self) -> int:
        """How many replicas are eligible (>= 1)."""

    def nth(self, k: int) -> str:
        """The id of the k-th eligible replica in registration order (0 <= k < len)."""

    def shortlist(self) -> list[Contender]:
        """In registration order: every eligible replica the index names, and the least
        loaded eligible replica it does not name (earliest among equals), if any. (A
        lone eligible replica is named without a walk of the index.)"""


class Router(ABC):
    """Chooses the replica of each request from the replicas' views.

    Contract of `choose`: `views` is non-empty, in registration order, with distinct
    ids (from `route`: one per replica that may take the request; from `pick`: the
    shortlist that decides, see the module docstring); the result is one of their
    `replica_id`s. Views are not modified. A router may keep state across calls
    (`round_robin` does); `route` and `pick` each count as one call.
    """

    name: ClassVar[str]

    @classmethod
    def from_settings(cls, settings: ServeSettings) -> Router:
        """The router a deployment's settings ask for (default: no parameters)."""
        return cls()

    def __init__(self, load_tokens: float = 0.0) -> None:
        self.load_tokens = load_tokens

    @abstractmethod
    def choose(self, prompt: npt.NDArray[np.int32], views: Sequence[ReplicaView]) -> str:
        """The id of the replica that serves `prompt`."""

    def route(
        self,
        prompt: npt.NDArray[np.int32],
        replicas: Iterable[tuple[str, PrefixCache, int]],
    ) -> str:
        """`choose` over views built from (replica id, cache, open requests) triples in
        registration order (the reference: one walk per replica). ValueError when there
        is no replica."""
        views = [ReplicaView.of(rid, c, n, prompt, self.load_tokens) for rid, c, n in replicas]
        if not views:
            raise ValueError("no replica to route to")
        return self.choose(prompt, views)

    def pick(self, prompt: npt.NDArray[np.int32], eligible: Eligible) -> str:
        """What `route` returns on the views of every eligible replica, from the views of
        `eligible.shortlist()` only (exact for a router whose `choose` prefers, among
        replicas with hit 0 and no session, fewer open requests, then the earlier one:
        see the module docstring; others override this)."""
        return self.choose(prompt, self.views(prompt, eligible.shortlist()))

    def views(
        self, prompt: npt.NDArray[np.int32], contenders: Iterable[Contender]
    ) -> list[ReplicaView]:
        """The views of `contenders`, a walk of the named ones' trees only."""
        load = self.load_tokens
        return [
            ReplicaView.of(rid, cache, n, prompt, load)
            if named
            else ReplicaView.cold(rid, cache.cost, n, load)
            for rid, cache, n, named in contenders
        ]


class CacheAwareRouter(Router):
    """FLOPs saved by the usable hit net of the queue, sticky sessions, bounded imbalance
    (see the module docstring)."""

    name = "cache_aware"

    def __init__(self, load_tokens: float = 256.0, max_imbalance: int = 4) -> None:
        if load_tokens < 0:
            raise ValueError(f"load_tokens must be >= 0, got {load_tokens}")
        if max_imbalance < 0:
            raise ValueError(f"max_imbalance must be >= 0, got {max_imbalance}")
        super().__init__(load_tokens)
        self.max_imbalance = max_imbalance

    @classmethod
    def from_settings(cls, settings: ServeSettings) -> Router:
        return cls(settings.route_load_weight, settings.route_max_imbalance)

    @staticmethod
    def score(view: ReplicaView) -> float:
        """FLOPs saved by the hit minus the FLOPs its open requests are charged as."""
        return view.flops_saved - view.open_requests * view.queue_flops

    def pick(self, prompt: npt.NDArray[np.int32], eligible: Eligible) -> str:
        """`Router.pick`, without walking the named replicas that are overloaded (the
        shortlist holds the least loaded eligible replica, so its bound is the same)."""
        short = eligible.shortlist()
        bound = min(c.open_requests for c in short) + self.max_imbalance
        return self.choose(
            prompt, self.views(prompt, [c for c in short if c.open_requests <= bound])
        )

    def choose(self, prompt: npt.NDArray[np.int32], views: Sequence[ReplicaView]) -> str:
        bound = min(v.open_requests for v in views) + self.max_imbalance
        ranked = [(i, v) for i, v in enumerate(views) if v.open_requests <= bound]
        sticky = [(i, v) for i, v in ranked if v.holds_session]
        pool = sticky or ranked
        _, best = max(pool, key=lambda iv: (self.score(iv[1]), -iv[1].open_requests, -iv[0]))
        return best.replica_id


class RoundRobinRouter(Router):
    """Replicas in registration order, one request each in turn."""

    name = "round_robin"

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def choose(self, prompt: npt.NDArray[np.int32], views: Sequence[ReplicaView]) -> str:
        chosen = views[self.calls % len(views)].replica_id
        self.calls += 1
        return chosen

    def pick(self, prompt: npt.NDArray[np.int32], eligible: Eligible) -> str:
        chosen = eligible.nth(self.calls % len(eligible))
        self.calls += 1
        return chosen


class LeastLoadedRouter(Router):
    """Fewest open requests; ties: the longer hit, then registration order."""

    name = "least_loaded"

    def choose(self, prompt: npt.NDArray[np.int32], views: Sequence[ReplicaView]) -> str:
        i = min(range(len(views)), key=lambda k: (views[k].open_requests, -views[k].hit_tokens, k))
        return views[i].replica_id

    def pick(self, prompt: npt.NDArray[np.int32], eligible: Eligible) -> str:
        """`Router.pick`, walking only the named replicas that are least loaded."""
        short = eligible.shortlist()
        least = min(c.open_requests for c in short)
        return self.choose(
            prompt, self.views(prompt, [c for c in short if c.open_requests == least])
        )


ROUTERS: Final[dict[str, type[Router]]] = {
    r.name: r for r in (CacheAwareRouter, RoundRobinRouter, LeastLoadedRouter)
}


def check_routing(name: str) -> str:
    """`name` if it is a known strategy, else ValueError naming it and the choices."""
    if name not in ROUTERS:
        raise ValueError(
            f"unknown routing strategy {name!r}; choose one of {', '.join(sorted(ROUTERS))}"
        )
    return name


def make_router(name: str, settings: ServeSettings) -> Router:
    """A new router of strategy `name` configured from `settings` (ValueError naming an
    unknown name)."""
    return ROUTERS[check_routing(name)].from_settings(settings)
