"""Eviction policies: which cached node goes next (strategies + registry).

A policy reads the node table's columns (see `node_table`) and picks one victim with
numpy reductions over the candidate slots; it never walks the tree. It also decides
which nodes a cache hit refreshes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from marconi_ray.core.radix_tree import RadixTree
from marconi_ray.core.tree_types import Match, Node

RECENCY_MODES = ("timestamp", "inverse_age")


class EvictionPolicy(ABC):
    """Picks victims; `alpha` is meaningful only for FLOP-aware eviction."""

    name: str
    alpha: float = 0.0

    @abstractmethod
    def on_hit(self, tree: RadixTree, match: Match, now: float) -> None:
        """Refresh access times after `match` was served."""

    @abstractmethod
    def choose(self, tree: RadixTree, now: float) -> Node | None:
        """The next victim among unlocked candidates, or None when there is none."""


class LRUEviction(EvictionPolicy):
    """SGLang-style LRU over leaves; a hit refreshes every node on the matched path."""

    name = "lru"

    def on_hit(self, tree: RadixTree, match: Match, now: float) -> None:
        for node in match.path:
            tree.touch(node, now)

    def choose(self, tree: RadixTree, now: float) -> Node | None:
        slots = np.flatnonzero(tree.table.leaf)
        if not len(slots):
            return None
        return tree.nodes[int(slots[np.argmin(tree.table.last_access[slots])])]


def _minmax(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    low = values.min()
    span = values.max() - low
    if span <= 0:
        return np.zeros_like(values)
    out: npt.NDArray[np.float64] = (values - low) / span
    return out


class FlopAwareEviction(EvictionPolicy):
    """Marconi's eviction: minimise recency + alpha * flop_efficiency.

    Candidates are state-holding nodes with <= 1 child; both terms are min-max normalised
    over the candidates. Only the hit node is refreshed on a hit. Recency is the last
    access time ("timestamp", the paper) or 1 / (age + 1) ("inverse_age", the artifact).
    Ties go to the lowest slot, so runs are deterministic.
    """

    name = "flop_aware"

    def __init__(self, alpha: float = 0.0, recency: str = "timestamp") -> None:
        if recency not in RECENCY_MODES:
            raise ValueError(f"unknown recency mode {recency!r}; choose from {RECENCY_MODES}")
        self.alpha = validate_alpha(alpha)
        self.recency = recency

    def on_hit(self, tree: RadixTree, match: Match, now: float) -> None:
        tree.touch(match.hit_node, now)

    def choose(self, tree: RadixTree, now: float) -> Node | None:
        slots = np.flatnonzero(tree.table.evictable)
        if not len(slots):
            return None
        last = tree.table.last_access[slots]
        recency = last if self.recency == "timestamp" else 1.0 / (now - last + 1.0)
        score = _minmax(recency)
        if self.alpha:
            score = score + self.alpha * _minmax(tree.table.efficiency[slots])
        return tree.nodes[int(slots[np.argmin(score)])]


def validate_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    return alpha


EVICTION_POLICIES: Mapping[str, Callable[[float, str], EvictionPolicy]] = MappingProxyType(
    {
        "lru": lambda _alpha, _recency: LRUEviction(),
        "flop_aware": FlopAwareEviction,
    }
)


def make_eviction(name: str, alpha: float = 0.0, recency: str = "timestamp") -> EvictionPolicy:
    factory = EVICTION_POLICIES.get(name)
    if factory is None:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose from {sorted(EVICTION_POLICIES)}"
        )
    return factory(alpha, recency)
