"""LRU through the node table's lazy heap picks exactly the argmin-scan victim (oldest
last access among leaf candidates, ties to the lowest slot), under random inserts, hits,
locks, evictions and slot reuse; the batched `evict_lru` equals one `evict_into` per
scan victim."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import SMALL_COST, cache

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.eviction import LRUEviction
from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import NO_STATE, Node, Reclaimed


def scan_victim(tree: RadixTree) -> int | None:
    """The reference: argmin of last access over the leaf mask (np.argmin: lowest slot)."""
    slots = np.flatnonzero(tree.table.leaf)
    if not len(slots):
        return None
    return int(slots[np.argmin(tree.table.last_access[slots])])


def random_sequence(rng: np.random.Generator) -> np.ndarray:
    prefix = rng.integers(0, 3, int(rng.integers(0, 4)))  # shared prefixes: branches
    body = rng.integers(0, 6, int(rng.integers(1, 12)))
    return np.concatenate([prefix, body]).astype(np.int32)


def checkpoints_for(rng: np.random.Generator, n: int, first_id: int) -> list[tuple[int, int]]:
    depths = sorted({int(d) for d in rng.integers(1, n + 1, int(rng.integers(1, 4)))} | {n})
    return [(d, first_id + i) for i, d in enumerate(depths)]


def random_ops(tree: RadixTree, rng: np.random.Generator, steps: int) -> None:
    """Mutate `tree` at random, checking the heap's victim against the scan after each
    step. Times come from a small set, so ties are common."""
    lru = LRUEviction()
    locked: list[Node] = []
    next_id = 0
    for _ in range(steps):
        now = float(rng.integers(0, 6))
        op = rng.random()
        if op < 0.45:
            seq = random_sequence(rng)
            ckpts = checkpoints_for(rng, len(seq), next_id)
            next_id += len(ckpts)
            tree.insert(seq, ckpts, now)
        elif op < 0.65:
            match = tree.match(random_sequence(rng))
            if rng.random() < 0.5:
                tree.touch_many(match.path, now)
            else:
                tree.touch(match.hit_node, now)
        elif op < 0.75 and tree.n_states:
            node = tree.match(random_sequence(rng)).hit_node
            tree.lock(node)
            locked.append(node)
        elif op < 0.85 and locked:
            tree.unlock(locked.pop(int(rng.integers(len(locked)))))
        else:
            victim = lru.choose(tree, now)
            if victim is not None:
                tree.evict(victim)
        victim = lru.choose(tree, now)
        assert (None if victim is None else victim.slot) == scan_victim(tree)
    check_tree(tree)


@pytest.mark.parametrize("seed", range(8))
def test_heap_victim_is_the_argmin_scan_victim(seed: int) -> None:
    random_ops(RadixTree(SMALL_COST), np.random.default_rng(seed), 400)


def test_a_restored_tree_rebuilds_the_heap() -> None:
    tree = RadixTree(SMALL_COST)
    random_ops(tree, np.random.default_rng(99), 200)
    copy = RadixTree.from_flat(SMALL_COST, tree.flatten())
    check_tree(copy)
    assert LRUEviction().choose(copy, 0.0) is not None
    assert LRUEviction().choose(copy, 0.0).slot == scan_victim(tree)  # type: ignore[union-attr]
    random_ops(copy, np.random.default_rng(100), 200)


def test_stale_entries_are_compacted() -> None:
    tree = RadixTree(SMALL_COST)
    tree.insert(np.arange(1, 4, dtype=np.int32), [(3, 0)], 0.0)
    leaf = tree.match(np.arange(1, 4, dtype=np.int32)).hit_node
    for t in range(20_000):  # every touch of a leaf pushes a fresh entry
        tree.touch(leaf, float(t))
    assert len(tree.table.lru) < 10_000
    assert tree.table.oldest_leaf() == leaf.slot
    check_tree(tree)


@pytest.mark.parametrize("seed", range(6))
def test_batched_lru_eviction_equals_one_scan_victim_at_a_time(seed: int) -> None:
    rng = np.random.default_rng(seed)
    tree = RadixTree(SMALL_COST)
    random_ops(tree, rng, 150)
    locked = [n for n in tree.iter_nodes()[1:] if n.state != NO_STATE][:2]
    for node in locked:  # locked nodes stay; their parents take the slow path
        tree.lock(node)
    twin = RadixTree.from_flat(SMALL_COST, tree.flatten())
    for node in locked:
        twin.lock(twin.nodes[node.slot])
    target = tree.bytes_used // 3
    freed = Reclaimed()
    n, exhausted = tree.evict_lru(target, freed)
    twin_freed = Reclaimed()
    twin_n = 0
    while twin.bytes_used > target:
        slot = scan_victim(twin)
        if slot is None:
            break
        twin.evict_into(twin.nodes[slot], twin_freed)
        twin_n += 1
    assert (n, exhausted) == (twin_n, twin.bytes_used > target)
    assert freed.states == twin_freed.states and freed.n_tokens == twin_freed.n_tokens
    assert tree.flatten().slot.tolist() == twin.flatten().slot.tolist()
    assert tree.table._free == twin.table._free
    check_tree(tree)
    check_tree(twin)
    assert LRUEviction().choose(tree, 0.0) is not None or scan_victim(tree) is None


def test_lru_caches_match_through_a_snapshot_mid_run() -> None:
    """A cache restored from a snapshot evicts exactly as the original (heap rebuilt)."""
    rng = np.random.default_rng(5)
    c = cache(capacity=700, admission="fine_grained:3", eviction="lru")
    reqs = [
        (rng.integers(0, 4, int(rng.integers(2, 20))).astype(np.int32), np.zeros(0, np.int32))
        for _ in range(120)
    ]
    for inp, out in reqs[:60]:
        c.serve(inp, out)
    copy = cache_codec.restore(cache_codec.snapshot(c))
    hits = [c.serve(i, o) for i, o in reqs[60:]]
    assert [copy.serve(i, o) for i, o in reqs[60:]] == hits
    assert c.stats.evictions > 0
    for key in ("evictions", "hit_tokens", "input_tokens", "states_dropped", "peak_bytes"):
        assert getattr(c.stats, key) == getattr(copy.stats, key), key
    check_tree(copy.tree)
