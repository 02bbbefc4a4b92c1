"""Full-scan checks of the radix tree invariants (tests and the replay's debug mode)."""

from __future__ import annotations

import numpy as np

from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.core.model.cost_model import EFFICIENCY_FORMULAS
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import NO_STATE, Node


def check_tree(tree: RadixTree) -> None:
    """Raise AssertionError naming the first broken invariant of `tree` (see radix_tree)."""
    n_tokens = 0
    n_states = 0
    n_host_tokens = 0
    n_host_states = 0
    seen_slots: set[int] = set()
    heap_entries = set(tree.table.lru)
    candidates: list[tuple[Node, int]] = []
    root_slot = tree.root.slot
    assert tree.table.depth[root_slot] == 0 and tree.table.anchor[root_slot] == 0, (
        "the root's columns must be 0"
    )
    assert tree.table.edge_len[root_slot] == 0, "the root's columns must be 0"
    for node in tree.iter_nodes():
        assert node.slot not in seen_slots, f"slot {node.slot} used twice"
        seen_slots.add(node.slot)
        assert tree.nodes.get(node.slot) is node, f"{node!r} missing from the slot map"
        for key, child in node.children.items():
            assert child.parent is node, f"{child!r} has a wrong parent"
            assert len(child.edge) > 0, f"{child!r} has an empty edge"
            assert int(child.edge[0]) == key, f"{child!r} is keyed by {key}"
            assert child.key == child.edge.tobytes(), f"{child!r} has a stale byte key"
            assert child.depth == node.depth + len(child.edge), f"{child!r} has a wrong depth"
            if child.kv is not None:
                assert len(child.kv) == len(child.edge), f"{child!r} kv length mismatch"
        if node is tree.root:
            assert node.state == NO_STATE and node.depth == 0, "root must be empty"
            continue
        assert node.lock >= 0, f"{node!r} has a negative lock count"
        n_tokens += len(node.edge)
        n_states += node.state != NO_STATE
        n_host_tokens += _check_tiers(tree, node)
        n_host_states += node.state_host
        if node.state == NO_STATE and node.lock == 0:
            assert len(node.children) >= 2, f"state-less {node!r} has < 2 children"
        candidate = node.state != NO_STATE and len(node.children) <= 1 and node.lock == 0
        slot = node.slot
        assert bool(tree.table.evictable[slot]) == candidate, f"{node!r} evictable flag stale"
        leaf = candidate and not node.children
        assert bool(tree.table.leaf[slot]) == leaf, f"{node!r} leaf flag stale"
        table = tree.table
        assert table.depth[slot] == node.depth, f"{node!r} depth column stale"
        assert table.edge_len[slot] == len(node.edge), f"{node!r} edge_len column stale"
        anchor = tree.anchor_depth(node)
        assert table.anchor[slot] == anchor, f"{node!r} anchor column {table.anchor[slot]}"
        if leaf:
            entry = (float(table.last_access[slot]), slot)
            assert entry in heap_entries, f"{node!r} is a leaf missing from the LRU heap"
        if candidate:
            candidates.append((node, anchor))
    assert len(seen_slots) == len(tree.nodes), "slot map holds dead nodes"
    assert tree.table.used_slots() == len(tree.nodes), "node table leaks slots"
    assert n_tokens == tree.n_tokens, f"n_tokens {tree.n_tokens} != sum {n_tokens}"
    assert n_states == tree.n_states, f"n_states {tree.n_states} != sum {n_states}"
    assert n_host_tokens == tree.n_host_tokens, (
        f"n_host_tokens {tree.n_host_tokens} != sum {n_host_tokens}"
    )
    assert n_host_states == tree.n_host_states, (
        f"n_host_states {tree.n_host_states} != sum {n_host_states}"
    )
    _check_efficiencies(tree, candidates)
    live = set(tree.nodes)
    for slot in range(tree.table.n_slots):
        if slot not in live:
            assert not tree.table.evictable[slot] and not tree.table.leaf[slot], (
                f"free slot {slot} is a candidate"
            )


def _check_tiers(tree: RadixTree, node: Node) -> int:
    """Check `node`'s tier flags against its table columns; return its host tokens."""
    slot = node.slot
    n_host = 0
    if node.host is not None:
        assert node.host.dtype == np.bool_ and node.host.shape == node.edge.shape, (
            f"{node!r} host mask does not match its edge"
        )
        n_host = int(np.count_nonzero(node.host))
    assert tree.table.host_tokens[slot] == n_host, f"{node!r} host_tokens column stale"
    assert bool(tree.table.state_host[slot]) == node.state_host, f"{node!r} state_host stale"
    assert not node.state_host or node.state != NO_STATE, f"{node!r} has no state on the host"
    return n_host


def check_cache_tiers(cache: PrefixCache) -> None:
    """Raise AssertionError unless each tier holds at most its capacity (the device with
    the open plans' reservations) and the tree's invariants hold."""
    check_tree(cache.tree)
    device = cache.bytes_used
    assert device + cache.reserved <= cache.capacity, (
        f"device holds {device} + {cache.reserved} reserved > capacity {cache.capacity}"
    )
    host = cache.tree.host_bytes
    assert host <= cache.host_capacity, f"host holds {host} > capacity {cache.host_capacity}"


def _check_efficiencies(tree: RadixTree, candidates: list[tuple[Node, int]]) -> None:
    """Every formula, vectorised over the candidates' columns, equals its scalar
    reference computed from the nodes themselves, bit for bit."""
    if not candidates:
        return
    slots = np.asarray([node.slot for node, _ in candidates], dtype=np.int64)
    for formula in EFFICIENCY_FORMULAS:
        got = tree.table.efficiency(tree.cost, formula, slots).tolist()
        for (node, anchor), value in zip(candidates, got, strict=True):
            want = tree.cost.efficiency(
                node.depth, anchor, len(node.edge), not node.children, formula
            )
            assert value == want, f"{node!r} {formula} efficiency {value} != {want}"
