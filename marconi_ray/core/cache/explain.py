"""Why FLOP-aware eviction chose each victim (`marconi-ray replay --explain`).

`ExplainingEviction` is a `FlopAwareEviction` that records, for every decision, the
victim's normalised recency and efficiency terms, its score, and where it ranked among
the candidates by recency alone (rank 0: the victim is the one LRU would have taken, so
the efficiency term did not change the choice). `summarize` condenses the decisions.
It decides exactly as the policy it replaces: `choose` is `scores(...).victim`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from marconi_ray.core.cache.eviction import BoolArray, FlopAwareEviction
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import Node


@dataclass(frozen=True)
class Decision:
    """One eviction decision.

    Attributes:
        request: index of the request being served (planned or committed) when it ran.
        candidates: how many nodes could have been evicted.
        depth, edge_len, leaf: the victim's depth, edge length, and whether it was a leaf
            (a leaf frees its edge's KV too; an inner node only its state).
        reason: why the victim's state was admitted ("" when unknown).
        recency, efficiency: the victim's min-max normalised terms, in [0, 1].
        raw_efficiency: its FLOPs saved per byte under the formula in use.
        score: recency + alpha * efficiency, the lowest of all candidates.
        lru_rank: candidates less recent than the victim (0: LRU's own choice).
        alpha: the alpha in force.
    """

    request: int
    candidates: int
    depth: int
    edge_len: int
    leaf: bool
    reason: str
    recency: float
    efficiency: float
    raw_efficiency: float
    score: float
    lru_rank: int
    alpha: float


class ExplainingEviction(FlopAwareEviction):
    """FLOP-aware eviction that appends a `Decision` to `decisions` for every victim.

    `request` is the index the caller sets before serving each request; `reasons` maps
    live state ids to admission reasons (a `PrefixCache.reasons`)."""

    def __init__(self, like: FlopAwareEviction, reasons: dict[int, str]) -> None:
        super().__init__(like.alpha, like.recency, like.efficiency)
        self.reasons = reasons
        self.decisions: list[Decision] = []
        self.request = 0

    def choose(self, tree: RadixTree, now: float, among: BoolArray | None = None) -> Node | None:
        sc = self.scores(tree, now, among=among)
        if sc.victim is None:
            return None
        i = int(np.searchsorted(sc.slots, sc.victim))
        node = tree.nodes[sc.victim]
        self.decisions.append(
            Decision(
                request=self.request,
                candidates=len(sc.slots),
                depth=node.depth,
                edge_len=len(node.edge),
                leaf=not node.children,
                reason=self.reasons.get(node.state, ""),
                recency=float(sc.recency[i]),
                efficiency=float(sc.efficiency[i]),
                raw_efficiency=float(sc.raw_efficiency[i]),
                score=float(sc.score[i]),
                lru_rank=int(np.count_nonzero(sc.recency < sc.recency[i])),
                alpha=self.alpha,
            )
        )
        return node


@dataclass(frozen=True)
class Summary:
    """What a run's eviction decisions add up to (`summarize`); shares are fractions."""

    decisions: int
    lru_choice_share: float
    """Decisions whose victim was the least recent candidate (LRU's own choice)."""
    leaf_share: float
    median_candidates: float
    median_lru_rank: float
    median_recency: float
    median_efficiency: float
    victims_by_reason: dict[str, int]


def summarize(decisions: Sequence[Decision]) -> Summary:
    """Counts and medians over `decisions` (none: zeros)."""
    n = len(decisions)
    by_reason: dict[str, int] = {}
    for d in decisions:
        key = d.reason or "unknown"
        by_reason[key] = by_reason.get(key, 0) + 1

    def median(values: Sequence[float]) -> float:
        return float(np.median(values)) if n else 0.0

    return Summary(
        decisions=n,
        lru_choice_share=sum(d.lru_rank == 0 for d in decisions) / n if n else 0.0,
        leaf_share=sum(d.leaf for d in decisions) / n if n else 0.0,
        median_candidates=median([d.candidates for d in decisions]),
        median_lru_rank=median([d.lru_rank for d in decisions]),
        median_recency=median([d.recency for d in decisions]),
        median_efficiency=median([d.efficiency for d in decisions]),
        victims_by_reason=by_reason,
    )
