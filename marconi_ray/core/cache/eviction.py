"""Eviction policies: which cached node goes next (strategies + registry).

A policy reads the node table's columns (see `node_table`) and picks one victim with
numpy reductions over the candidate slots (FLOP-aware) or the table's LRU heap (LRU); it
never walks the tree. It also decides which nodes a cache hit refreshes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from marconi_ray.core.model.cost_model import (
    DEFAULT_EFFICIENCY,
    EFFICIENCY_FORMULAS,
    FloatArray,
    IntArray,
    validate_efficiency,
)
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import Match, Node, Reclaimed

RECENCY_MODES = ("timestamp", "inverse_age")
BoolArray = npt.NDArray[np.bool_]
_MIN = np.minimum.reduce
_MAX = np.maximum.reduce


class EvictionPolicy(ABC):
    """Picks victims; `alpha` is meaningful only for FLOP-aware eviction."""

    name: str
    alpha: float = 0.0

    @abstractmethod
    def on_hit(self, tree: RadixTree, match: Match, now: float) -> None:
        """Refresh access times after `match` was served."""

    @abstractmethod
    def choose(self, tree: RadixTree, now: float, among: BoolArray | None = None) -> Node | None:
        """The next victim among unlocked candidates (`among`: only those of this mask
        over the table's slots, e.g. one tier's `NodeTable.device_candidates`), or None
        when there is none."""

    def evict_until(
        self, tree: RadixTree, now: float, max_bytes: int, freed: Reclaimed
    ) -> tuple[int, bool]:
        """Evict `choose`'s victims, one at a time, while the tree holds more than
        `max_bytes`; add what they free to `freed`. Returns (victims evicted, whether
        the candidates ran out first)."""
        n = 0
        while tree.bytes_used > max_bytes:
            victim = self.choose(tree, now)
            if victim is None:
                return n, True
            tree.evict_into(victim, freed)
            n += 1
        return n, False


class LRUEviction(EvictionPolicy):
    """SGLang-style LRU over leaves; a hit refreshes every node on the matched path.

    The victim is the leaf with the oldest access, ties to the lowest slot (the argmin
    over the table's leaf slots), found through the table's lazy heap."""

    name = "lru"

    def on_hit(self, tree: RadixTree, match: Match, now: float) -> None:
        tree.touch_many(match.path, now)

    def choose(self, tree: RadixTree, now: float, among: BoolArray | None = None) -> Node | None:
        """The oldest leaf; within a mask (one tier of a two-tier cache, where a node
        whose subtree left the tier is no leaf yet must be able to go), the oldest
        candidate of the mask, ties to the deepest (the leaf end of a chain stamped at
        once), then the lowest slot."""
        if among is None:
            slot = tree.table.oldest_leaf()
            return None if slot is None else tree.nodes[slot]
        slots = among.nonzero()[0]
        if not len(slots):
            return None
        table = tree.table
        order = np.lexsort((slots, -table.depth[slots], table.last_access[slots]))
        return tree.nodes[int(slots[order[0]])]

    def evict_until(
        self, tree: RadixTree, now: float, max_bytes: int, freed: Reclaimed
    ) -> tuple[int, bool]:
        return tree.evict_lru(max_bytes, freed)


def _minmax(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    low = _MIN(values)
    span = _MAX(values) - low
    if span <= 0:
        return np.zeros_like(values)
    out: npt.NDArray[np.float64] = (values - low) / span
    return out


class EvictionScores(NamedTuple):
    """One FLOP-aware eviction decision, candidate by candidate (`FlopAwareEviction.scores`).

    Attributes:
        slots: the candidates' node-table slots, ascending.
        recency: their min-max normalised recency term.
        efficiency: their min-max normalised FLOP efficiency (all NaN when not computed).
        raw_efficiency: their FLOP efficiency, FLOPs per byte (all NaN when not computed).
        score: recency + alpha * efficiency; the lowest score is evicted.
        victim: the evicted slot (lowest score, ties to the lowest slot); None when
            there is no candidate.
    """

    slots: IntArray
    recency: FloatArray
    efficiency: FloatArray
    raw_efficiency: FloatArray
    score: FloatArray
    victim: int | None


class FlopAwareEviction(EvictionPolicy):
    """Marconi's eviction: minimise recency + alpha * flop_efficiency.

    Candidates are state-holding nodes with <= 1 child; both terms are min-max normalised
    over the candidates. Only the hit node is refreshed on a hit. Recency is the last
    access time ("timestamp", the paper) or 1 / (age + 1) ("inverse_age", the artifact).
    FLOP efficiency is one of `cost_model.EFFICIENCY_FORMULAS` (`efficiency`, default
    "freed"), evaluated over the candidates' table columns at once. Ties go to the lowest
    slot, so runs are deterministic.
    """

    name = "flop_aware"

    def __init__(
        self, alpha: float = 0.0, recency: str = "timestamp", efficiency: str = DEFAULT_EFFICIENCY
    ) -> None:
        if recency not in RECENCY_MODES:
            raise ValueError(f"unknown recency mode {recency!r}; choose from {RECENCY_MODES}")
        self.alpha = validate_alpha(alpha)
        self.recency = recency
        self.efficiency = efficiency

    @property
    def efficiency(self) -> str:
        """The FLOP-efficiency formula's name (`cost_model.EFFICIENCY_FORMULAS`)."""
        return self._efficiency

    @efficiency.setter
    def efficiency(self, formula: str) -> None:
        self._formula = EFFICIENCY_FORMULAS[validate_efficiency(formula)]
        self._efficiency = formula

    def on_hit(self, tree: RadixTree, match: Match, now: float) -> None:
        tree.touch(match.hit_node, now)

    def scores(
        self,
        tree: RadixTree,
        now: float,
        with_efficiency: bool = True,
        among: BoolArray | None = None,
    ) -> EvictionScores:
        """Every candidate's terms and score, and the victim (what `choose` decides).

        Args:
            with_efficiency: evaluate the efficiency terms even when alpha is 0 (they
                do not change the score then; `choose` skips them).
            among: score only the candidates of this mask (default: every candidate).
        """
        table = tree.table
        slots = (table.evictable if among is None else among).nonzero()[0]
        if not len(slots):
            empty = np.zeros(0, dtype=np.float64)
            return EvictionScores(slots, empty, empty, empty, empty, None)
        last = table.last_access[slots]
        recency = last if self.recency == "timestamp" else 1.0 / (now - last + 1.0)
        rec_norm = _minmax(recency)
        if with_efficiency or self.alpha:
            depth, anchor, edge_len = table.geometry[slots].T
            raw = self._formula(tree.cost, depth, anchor, edge_len, table.leaf[slots])
            eff_norm = _minmax(raw)
        else:
            raw = eff_norm = np.full(len(slots), np.nan)
        score = rec_norm + self.alpha * eff_norm if self.alpha else rec_norm
        return EvictionScores(slots, rec_norm, eff_norm, raw, score, int(slots[score.argmin()]))

    def choose(self, tree: RadixTree, now: float, among: BoolArray | None = None) -> Node | None:
        victim = self.scores(tree, now, with_efficiency=False, among=among).victim
        return None if victim is None else tree.nodes[victim]


def validate_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not np.isfinite(alpha) or alpha < 0:
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha}")
    return alpha


EVICTION_POLICIES: Mapping[str, Callable[[float, str, str], EvictionPolicy]] = MappingProxyType(
    {
        "lru": lambda _alpha, _recency, _efficiency: LRUEviction(),
        "flop_aware": FlopAwareEviction,
    }
)


def make_eviction(
    name: str,
    alpha: float = 0.0,
    recency: str = "timestamp",
    efficiency: str = DEFAULT_EFFICIENCY,
) -> EvictionPolicy:
    """Build a policy; `alpha`, `recency` and `efficiency` (a name from
    `cost_model.EFFICIENCY_FORMULAS`) configure `flop_aware`. Every name is validated,
    for `lru` too, so a typo is never silently ignored."""
    factory = EVICTION_POLICIES.get(name)
    if factory is None:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose from {sorted(EVICTION_POLICIES)}"
        )
    validate_efficiency(efficiency)
    return factory(alpha, recency, efficiency)
