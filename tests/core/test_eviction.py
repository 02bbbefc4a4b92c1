"""Eviction policies: LRU over leaves, FLOP-aware over <= 1-child nodes, alpha, recency."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import SMALL_COST, cache, toks

from marconi_ray.core.cache.eviction import make_eviction
from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.tree.radix_tree import RadixTree


def _chain_tree() -> RadixTree:
    """root -> [1,2] (state) -> [3,4] (state, leaf) and a separate leaf [5]."""
    tree = RadixTree(SMALL_COST)
    tree.insert(toks(1, 2, 3, 4), [(2, 0), (4, 1)], now=1)
    tree.insert(toks(5), [(1, 2)], now=2)
    return tree


def test_lru_considers_leaves_only_and_the_oldest_goes_first() -> None:
    tree = _chain_tree()
    lru = make_eviction("lru")
    victim = lru.choose(tree, now=3)
    assert victim is not None and victim.depth == 4  # the inner [1,2] is not a leaf
    tree.touch(victim, 10)
    victim = lru.choose(tree, now=11)
    assert victim is not None and list(victim.edge) == [5]


def test_flop_aware_considers_single_child_nodes() -> None:
    tree = _chain_tree()
    policy = make_eviction("flop_aware", alpha=0.0)
    victim = policy.choose(tree, now=3)
    assert victim is not None and victim.depth == 2  # oldest, though it has a child
    before = tree.bytes_used
    freed = tree.evict(victim)
    assert before - tree.bytes_used == SMALL_COST.state_bytes  # only the state is freed
    assert freed.kv == [] and freed.states == [0]
    check_tree(tree)


def test_lru_hit_refreshes_the_path_marconi_only_the_hit_node() -> None:
    for eviction, expect_inner_touched in (("lru", True), ("flop_aware", False)):
        c = cache(eviction=eviction)
        c.serve(toks(1, 2, 3), toks())
        c.serve(toks(1, 2, 4), toks())
        c.serve(toks(1, 2, 3, 7), toks())
        inner = c.tree.match(toks(1, 2)).path[-1]
        stamp = c.tree.table.last_access[inner.slot]
        c.plan(toks(1, 2, 3, 7, 8))
        touched = c.tree.table.last_access[inner.slot] > stamp
        assert touched == expect_inner_touched


def test_alpha_trades_recency_for_flop_efficiency() -> None:
    """A long old sequence survives a short recent one once alpha is large enough."""
    long_old = np.arange(1, 401, dtype=np.int32)
    short_new = toks(1000, 1001)
    for alpha, survivor in ((0.0, "short"), (5.0, "long")):
        c = cache(capacity=10**9, alpha=alpha)
        c.serve(long_old, toks())
        c.serve(short_new, toks())
        victim = c.eviction.choose(c.tree, now=c.clock + 1)
        assert victim is not None
        kept = "short" if victim.depth == 400 else "long"
        assert kept == survivor


def test_efficiency_is_flops_over_the_nearest_state_ancestor_per_byte_freed() -> None:
    tree = _chain_tree()
    leaf = tree.match(toks(1, 2, 3, 4)).path[-1]
    want = SMALL_COST.prefill_flops(2, 2) / (SMALL_COST.state_bytes + 2 * 10)
    assert tree.efficiency(leaf) == pytest.approx(want)
    inner = tree.match(toks(1, 2)).path[-1]
    tree.evict(inner)  # leaf's anchor becomes the root and its edge grows to 4 tokens
    want = SMALL_COST.prefill_flops(4, 0) / (SMALL_COST.state_bytes + 4 * 10)
    assert tree.efficiency(leaf) == pytest.approx(want)


def test_inverse_age_recency_orders_like_timestamps() -> None:
    tree = _chain_tree()
    a = make_eviction("flop_aware", 0.0, "timestamp").choose(tree, now=5)
    b = make_eviction("flop_aware", 0.0, "inverse_age").choose(tree, now=5)
    assert a is b


def test_locked_nodes_are_never_candidates() -> None:
    tree = _chain_tree()
    for node in list(tree.nodes.values()):
        tree.lock(node)
    assert make_eviction("flop_aware").choose(tree, 9) is None
    assert make_eviction("lru").choose(tree, 9) is None


@pytest.mark.parametrize(
    "name,alpha,recency,message",
    [
        ("mru", 0.0, "timestamp", "mru"),
        ("flop_aware", -1.0, "timestamp", "alpha"),
        ("flop_aware", float("nan"), "timestamp", "alpha"),
        ("flop_aware", 0.0, "age", "age"),
    ],
)
def test_bad_eviction_settings_raise(name: str, alpha: float, recency: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_eviction(name, alpha, recency)


def test_victim_choice_never_walks_the_tree(monkeypatch: pytest.MonkeyPatch) -> None:
    """Artifact bug 4: no O(N) Python rescan of the tree per evicted node."""
    c = cache(capacity=3000, alpha=1.0)

    def forbidden() -> None:
        raise AssertionError("eviction walked the whole tree")

    monkeypatch.setattr(c.tree, "iter_nodes", forbidden)
    rng = np.random.default_rng(0)
    for _ in range(200):
        c.serve(rng.integers(0, 30, 20).astype(np.int32), rng.integers(0, 30, 5).astype(np.int32))
    assert c.stats.evictions > 50
