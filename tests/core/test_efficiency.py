"""FLOP-efficiency formulas of FLOP-aware eviction: hand-computed values, the vectorised
path equal to the scalar reference bit for bit, validation, plumbing, and `scores`."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import SMALL_COST, toks

from marconi_ray.core.cache.eviction import FlopAwareEviction, make_eviction
from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.model.cost_model import EFFICIENCY_FORMULAS, CostModel, validate_efficiency
from marconi_ray.core.model.presets import get_preset
from marconi_ray.core.model.window_term import WindowTerm
from marconi_ray.core.sim.replay import RunConfig, run_replay
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.traces.registry import load_sample

# SMALL_COST: linear 1000 FLOPs/token, quadratic 1, KV 10 B/token, state 100 B.
# _chain_tree: A = [1,2] (depth 2, inner), B = [3,4] under A (depth 4, anchor 2, leaf),
# C = [5] (depth 1, leaf). prefill(2, 0) = 2004, prefill(2, 2) = 2012, prefill(1, 0) = 1001,
# total(4) = 4016.
HAND = {
    "freed": {"A": 2004 / 100, "B": 2012 / (100 + 20), "C": 1001 / (100 + 10)},
    "paper": {"A": 2004 / (100 + 20), "B": 4016 / (100 + 40), "C": 1001 / (100 + 10)},
    "artifact": {"A": 2004 / (100 + 20), "B": 2012 / (100 + 40), "C": 1001 / (100 + 10)},
    "uniform": {"A": 2004 / (100 + 20), "B": 2012 / (100 + 20), "C": 1001 / (100 + 10)},
}


def _chain_tree() -> RadixTree:
    tree = RadixTree(SMALL_COST)
    tree.insert(toks(1, 2, 3, 4), [(2, 0), (4, 1)], now=1)
    tree.insert(toks(5), [(1, 2)], now=2)
    return tree


def test_the_registry_names_four_formulas() -> None:
    assert set(EFFICIENCY_FORMULAS) == {"freed", "paper", "artifact", "uniform"}


@pytest.mark.parametrize("formula", sorted(HAND))
def test_formulas_match_hand_computed_values(formula: str) -> None:
    tree = _chain_tree()
    nodes = {
        "A": tree.match(toks(1, 2)).path[-1],
        "B": tree.match(toks(1, 2, 3, 4)).path[-1],
        "C": tree.match(toks(5)).path[-1],
    }
    for name, node in nodes.items():
        want = HAND[formula][name]
        assert tree.efficiency(node, formula) == pytest.approx(want, rel=1e-12), name
        scalar = SMALL_COST.efficiency(
            node.depth, tree.anchor_depth(node), len(node.edge), not node.children, formula
        )
        assert scalar == pytest.approx(want, rel=1e-12), name


def test_evicting_the_inner_node_updates_anchor_and_edge() -> None:
    tree = _chain_tree()
    tree.evict(tree.match(toks(1, 2)).path[-1])  # B's anchor: the root; its edge: 4 tokens
    leaf = tree.match(toks(1, 2, 3, 4)).path[-1]
    assert tree.efficiency(leaf, "freed") == pytest.approx(4016 / (100 + 40))
    assert tree.efficiency(leaf, "uniform") == pytest.approx(4016 / (100 + 40))
    assert tree.efficiency(leaf, "artifact") == pytest.approx(4016 / (100 + 40))
    check_tree(tree)


@pytest.mark.parametrize("formula", sorted(EFFICIENCY_FORMULAS))
@pytest.mark.parametrize(
    "cost",
    [
        SMALL_COST,
        CostModel.from_spec(get_preset("paper-7b")),
        CostModel(1e3, 1.0, 10, 100, (WindowTerm(8.0, 4096), WindowTerm(3.0, 50_000))),
    ],
)
def test_vectorised_equals_the_scalar_reference_exactly(formula: str, cost: CostModel) -> None:
    rng = np.random.default_rng(0)
    n = 2000
    depth = rng.integers(1, 200_000, n).astype(np.int64)
    anchor = (depth * rng.random(n)).astype(np.int64)
    anchor[: n // 10] = 0
    edge_len = np.maximum(1, ((depth - anchor) * rng.random(n)).astype(np.int64))
    edge_len = np.minimum(edge_len, depth - anchor)
    leaf = rng.random(n) < 0.5
    got = cost.efficiencies(depth, anchor, edge_len, leaf, formula)
    assert got.dtype == np.float64
    want = [
        cost.efficiency(int(d), int(a), int(e), bool(lf), formula)
        for d, a, e, lf in zip(depth, anchor, edge_len, leaf, strict=True)
    ]
    assert got.tolist() == want  # bit for bit: same victims as a per-node computation


@pytest.mark.parametrize(
    "build",
    [
        lambda: validate_efficiency("flops"),
        lambda: SMALL_COST.efficiency(2, 0, 2, True, "flops"),
        lambda: make_eviction("flop_aware", 0.0, "timestamp", "flops"),
        lambda: make_eviction("lru", 0.0, "timestamp", "flops"),
        lambda: FlopAwareEviction(1.0, "timestamp", "flops"),
        lambda: CacheConfig(1000, efficiency="flops"),
    ],
)
def test_an_unknown_formula_is_a_value_error_naming_it(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="'flops'"):
        build()


def test_the_default_is_freed_everywhere() -> None:
    assert CacheConfig(1000).efficiency == "freed"
    policy = make_eviction("flop_aware", 1.0)
    assert isinstance(policy, FlopAwareEviction) and policy.efficiency == "freed"
    c = PrefixCache(SMALL_COST, CacheConfig(1000, efficiency="paper"))
    assert isinstance(c.eviction, FlopAwareEviction) and c.eviction.efficiency == "paper"


def _three_candidates() -> RadixTree:
    """P = [1..4] (inner, depth 4) with child Q = [5, 6] (leaf, depth 6), both at time 1;
    R = [100..103] (leaf, depth 4) at time 2."""
    tree = RadixTree(SMALL_COST)
    tree.insert(toks(1, 2, 3, 4, 5, 6), [(4, 0), (6, 1)], now=1)
    tree.insert(toks(100, 101, 102, 103), [(4, 2)], now=2)
    return tree


def test_the_formula_changes_the_victim() -> None:
    """freed: P 40.16, Q 16.83, R 28.69 (Q goes); paper: P 28.69, Q 37.73, R 28.69 (P)."""
    tree = _three_candidates()
    p = tree.match(toks(1, 2, 3, 4)).path[-1]
    q = tree.match(toks(1, 2, 3, 4, 5, 6)).path[-1]
    assert FlopAwareEviction(1.0, efficiency="freed").choose(tree, 3) is q
    assert FlopAwareEviction(1.0, efficiency="paper").choose(tree, 3) is p
    assert FlopAwareEviction(1.0, efficiency="uniform").choose(tree, 3) is q
    assert FlopAwareEviction(0.0, efficiency="paper").choose(tree, 3) is p  # oldest, lowest slot


@pytest.mark.parametrize("formula", sorted(EFFICIENCY_FORMULAS))
@pytest.mark.parametrize("recency", ["timestamp", "inverse_age"])
def test_scores_explain_the_decision(formula: str, recency: str) -> None:
    tree = _three_candidates()
    policy = FlopAwareEviction(0.7, recency, formula)
    s = policy.scores(tree, now=3)
    assert s.slots.tolist() == sorted(np.flatnonzero(tree.table.evictable).tolist())
    assert len(s.recency) == len(s.efficiency) == len(s.raw_efficiency) == len(s.score) == 3
    want_raw = [tree.efficiency(tree.nodes[int(slot)], formula) for slot in s.slots]
    assert s.raw_efficiency.tolist() == want_raw
    assert s.efficiency.min() == 0.0 and s.efficiency.max() == 1.0
    assert s.recency.min() == 0.0 and s.recency.max() == 1.0
    np.testing.assert_array_equal(s.score, s.recency + 0.7 * s.efficiency)
    assert s.victim == int(s.slots[np.argmin(s.score)])
    victim = policy.choose(tree, now=3)
    assert victim is not None and victim.slot == s.victim


def test_scores_with_no_candidate_and_at_alpha_zero() -> None:
    tree = RadixTree(SMALL_COST)
    s = FlopAwareEviction(1.0).scores(tree, now=1)
    assert s.victim is None and len(s.slots) == 0
    tree = _three_candidates()
    s = FlopAwareEviction(0.0).scores(tree, now=3)  # the terms are still shown at alpha 0
    assert not np.isnan(s.efficiency).any()
    np.testing.assert_array_equal(s.score, s.recency)
    fast = FlopAwareEviction(0.0).scores(tree, now=3, with_efficiency=False)
    assert fast.victim == s.victim and np.isnan(fast.efficiency).all()


@pytest.mark.parametrize("formula", sorted(EFFICIENCY_FORMULAS))
def test_every_formula_runs_a_cache_under_pressure(formula: str) -> None:
    rng = np.random.default_rng(3)
    c = PrefixCache(SMALL_COST, CacheConfig(2500, "marconi", "flop_aware", 1.0, efficiency=formula))
    for _ in range(150):
        c.serve(rng.integers(0, 8, int(rng.integers(2, 30))).astype(np.int32), toks(1, 2))
        assert c.bytes_used <= c.capacity
    assert c.stats.evictions > 20
    check_tree(c.tree)


def test_replay_runs_take_the_formula() -> None:
    with pytest.raises(ValueError, match="'flops'"):
        RunConfig("marconi", 10**6, efficiency="flops")
    reqs = list(load_sample())[:150]
    cost = CostModel.from_spec(get_preset("paper-7b"))
    rates = {
        formula: run_replay(reqs, cost, RunConfig("marconi", int(3e8), 1.0, efficiency=formula))
        for formula in ("freed", "paper")
    }
    assert all(r.evictions > 0 for r in rates.values())
    default = run_replay(reqs, cost, RunConfig("marconi", int(3e8), 1.0))
    assert default.token_hit_rate == rates["freed"].token_hit_rate
