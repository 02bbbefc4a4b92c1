"""Radix tree structure: match semantics, splits, merges, snapshots, invariants."""

from __future__ import annotations

import numpy as np
from core_helpers import SMALL_COST, cache, toks

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import common_prefix_len


def test_common_prefix_len() -> None:
    assert common_prefix_len(toks(1, 2, 3), toks(1, 2, 4)) == 2
    assert common_prefix_len(toks(1, 2, 3), toks(1, 2)) == 2
    assert common_prefix_len(toks(5), toks(6)) == 0


def test_divergence_inside_an_edge_stops_the_match() -> None:
    """Artifact bug 1: after a divergence inside an edge the walk must not go on."""
    tree = RadixTree(SMALL_COST)
    tree.insert(toks(1, 2, 3, 4, 9, 9, 9), [(4, 0), (7, 1)], now=1)
    match = tree.match(toks(1, 2, 9, 9, 9, 5))
    assert match.matched_len == 2
    assert match.hit_len == 0
    assert match.partial is not None


def test_full_input_equal_to_cached_sequence_is_a_full_hit() -> None:
    c = cache()
    c.serve(toks(1, 2, 3), toks(4, 5))
    assert c.lookup(toks(1, 2, 3, 4, 5)) == 5


def test_hit_is_deepest_state_on_path_not_deepest_match() -> None:
    tree = RadixTree(SMALL_COST)
    tree.insert(toks(1, 2, 3, 4, 5, 6), [(3, 0), (6, 1)], now=1)
    match = tree.match(toks(1, 2, 3, 4, 5, 7))
    assert (match.hit_len, match.matched_len) == (3, 5)


def test_split_keeps_kv_handles_aligned_and_merge_restores_them() -> None:
    tree = RadixTree(SMALL_COST)
    kv = np.arange(100, 106)
    tree.insert(toks(1, 2, 3, 4, 5, 6), [(6, 0)], now=1, kv=kv, kv_start=0)
    tree.insert(toks(1, 2, 3, 9), [(3, 1), (4, 2)], now=2, kv=np.arange(200, 204), kv_start=0)
    check_tree(tree)
    mid = tree.match(toks(1, 2, 3)).path[-1]
    assert list(mid.kv) == [100, 101, 102]
    (leaf,) = (n for n in mid.children.values() if n.depth == 6)
    assert list(leaf.kv) == [103, 104, 105]
    assert list(mid.children[9].kv) == [203]
    tree.evict(mid.children[9])
    freed = tree.evict(mid)  # one child left: state freed, KV merged into the child
    assert freed.states == [1] and freed.kv == []
    check_tree(tree)
    (only,) = tree.root.children.values()
    assert list(only.kv) == [100, 101, 102, 103, 104, 105]


def test_unlock_tidies_a_stateless_node_left_alone() -> None:
    tree = RadixTree(SMALL_COST)
    tree.insert(toks(1, 2, 3), [(3, 0)], now=1)
    tree.insert(toks(1, 2, 4), [(3, 1)], now=2)
    branch = tree.match(toks(1, 2)).path[-1]
    assert branch.state < 0 and len(branch.children) == 2
    tree.lock(branch)
    tree.evict(branch.children[3])
    tree.evict(branch.children[4])
    assert tree.nodes.get(branch.slot) is branch  # kept while locked
    freed = tree.unlock(branch)
    assert freed.n_tokens == 2 and tree.n_tokens == 0
    check_tree(tree)


def test_snapshot_round_trip_of_a_deep_chain() -> None:
    c = cache(admission="fine_grained:1", eviction="lru")
    c.serve(np.arange(5000, dtype=np.int32) % 7 + 1, toks(3))
    copy = cache_codec.restore(cache_codec.snapshot(c))
    check_tree(copy.tree)
    assert copy.tree.n_states == c.tree.n_states == 5001
    assert copy.lookup(np.arange(4000, dtype=np.int32) % 7 + 1) == 4000


def test_insert_reports_where_new_edges_begin_and_bumps_the_version() -> None:
    tree = RadixTree(SMALL_COST)
    v0 = tree.version
    first = tree.insert(toks(1, 2, 3, 4, 5, 6), [(6, 0)], now=1, kv=np.arange(6), kv_start=0)
    assert first.new_from == 0 and first.admitted == [(6, 0)] and tree.version > v0
    kv = np.arange(200, 202)
    second = tree.insert(toks(1, 2, 3, 9, 8), [(3, 1), (5, 2)], now=2, kv=kv, kv_start=3)
    assert second.new_from == 3 and second.admitted == [(3, 1), (5, 2)]
    again = tree.insert(toks(1, 2, 3), [(3, 7)], now=3)  # nothing new: a duplicate
    assert again.new_from == 3 and again.duplicates == [7] and again.admitted == []
    v1 = tree.version
    tree.match(toks(1, 2, 3, 9))  # a walk changes nothing
    assert tree.version == v1
    node = tree.match(toks(1, 2, 3, 9, 8)).path[-1]
    tree.evict(node)
    assert tree.version > v1
    check_tree(tree)


def test_a_node_key_is_its_edge_bytes_after_splits_and_merges() -> None:
    tree = RadixTree(SMALL_COST)
    tree.insert(toks(1, 2, 3, 4, 5, 6), [(6, 0)], now=1)
    tree.insert(toks(1, 2, 3, 9), [(3, 1), (4, 2)], now=2)
    mid = tree.match(toks(1, 2, 3)).path[-1]
    assert mid.key == toks(1, 2, 3).tobytes()
    tree.evict(mid.children[9])
    tree.evict(mid)  # merged into the child: its key covers the whole edge again
    (only,) = tree.root.children.values()
    assert only.key == toks(1, 2, 3, 4, 5, 6).tobytes()
    only.key = b"stale"
    try:
        check_tree(tree)
    except AssertionError as exc:
        assert "stale byte key" in str(exc)
    else:
        raise AssertionError("check_tree missed a stale key")
