"""Placement across the tiers of a two-tier prefix cache (see `core.cache.host_tier`).

- Device eviction (`TierPlacer.evict_device`): the eviction policy picks a victim among
  the nodes whose eviction frees device bytes (`NodeTable.device_candidates`); the
  victim is demoted to the host when `HostTier.worth_demoting` says a later hit on its
  state saves more prefill time than copying its bytes back costs and the host can make
  room for them, else dropped as in a one-tier cache. When no candidate is left, the KV
  of unlocked nodes that cannot be dropped on their own (state-less branch points whose
  subtrees went to the host) is demoted, deepest first, so device bytes never pin.
  The KV on the path of an open plan's hit is never demoted (`in_use`): a running
  request reads its hit's KV in place, in the device rows of its slots, which a
  demotion frees for the next prefill to overwrite; a node there gives up its state only.
- Host eviction (`host_room`): the same policy over `NodeTable.host_candidates`; a host
  victim is dropped.
- Promotion (`promote_hit`): a hit's host bytes (the KV on its path and its state) are
  copied back to the device before the resumed prefill, the path locked while room is
  made; what cannot find room stays on the host and is read from there.

Every move is recorded, in order, in the mutation's `Reclaimed.moves` (the worker's
store replays them) and counted in the cache's `CacheStats`.
"""

from __future__ import annotations

from collections.abc import Callable, Set

from marconi_ray.core.cache.eviction import EvictionPolicy
from marconi_ray.core.cache.host_tier import HostTier
from marconi_ray.core.cache.stats import CacheStats
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import NO_STATE, Match, Node, Reclaimed, TierMove

InUse = Callable[[], Set[Node]]
"""The nodes whose edge KV must stay on the device: every node on the path of an open
plan's hit (`PrefixCache._in_use`), asked for when a victim is placed."""


def device_bytes_of(tree: RadixTree, node: Node, with_kv: bool = True) -> int:
    """Bytes of `node` on the device: its device KV tokens (when `with_kv`) and its state
    if there."""
    n_dev = len(node.edge) - int(tree.table.host_tokens[node.slot]) if with_kv else 0
    on_device = node.state != NO_STATE and not node.state_host
    return tree.cost.kv_bytes(n_dev) + on_device * tree.cost.state_bytes


def host_part(tree: RadixTree, node: Node, with_state: bool) -> int:
    """Bytes of `node` on the host: its host KV tokens, and its state when `with_state`."""
    n_host = int(tree.table.host_tokens[node.slot])
    return tree.cost.kv_bytes(n_host) + (with_state and node.state_host) * tree.cost.state_bytes


def hit_saves(tree: RadixTree, node: Node) -> float:
    """Prefill FLOPs a hit on `node`'s state saves over one on its anchor's."""
    anchor = int(tree.table.anchor[node.slot])
    return tree.cost.prefill_flops(node.depth - anchor, anchor)


def _alive(node: Node) -> bool:
    return node.parent is not None


class TierPlacer:
    """Device eviction with demotion, host eviction and promotion for one cache."""

    def __init__(self, host: HostTier, policy: EvictionPolicy) -> None:
        self.host = host
        self.policy = policy

    # ---------------------------------------------------------------- device
    def evict_device(
        self,
        tree: RadixTree,
        now: float,
        max_bytes: int,
        freed: Reclaimed,
        stats: CacheStats,
        in_use: InUse | None = None,
    ) -> tuple[int, bool]:
        """Demote or drop device victims while the device holds more than `max_bytes`;
        of a node `in_use` names only the state is demoted, its KV stays. Returns
        (victims placed, pinned nodes demoted included; whether the device ran out of
        them first)."""
        n = 0
        keep: Set[Node] | None = None
        while tree.device_bytes > max_bytes:
            if keep is None:  # asked once: placing victims only shrinks the paths
                keep = in_use() if in_use is not None else frozenset()
            victim = self.policy.choose(tree, now, tree.table.device_candidates())
            if victim is None:
                moved = self._demote_pinned(tree, now, max_bytes, freed, stats, keep)
                if not moved:
                    return n, True
                n += moved
                continue
            self._place(tree, victim, now, freed, stats, victim not in keep)
            n += 1
        return n, False

    def _place(
        self,
        tree: RadixTree,
        victim: Node,
        now: float,
        freed: Reclaimed,
        stats: CacheStats,
        with_kv: bool = True,
    ) -> None:
        """Demote `victim` (its KV too when `with_kv`) when worth it and the host can hold
        it, else drop it."""
        n_bytes = device_bytes_of(tree, victim, with_kv)
        if self.host.worth_demoting(hit_saves(tree, victim), n_bytes) and self.host_room(
            tree, victim, now, freed, stats, with_kv
        ):
            self._demote(tree, victim, freed, stats, with_kv)
        else:
            tree.evict_into(victim, freed)

    def _demote(
        self, tree: RadixTree, node: Node, freed: Reclaimed, stats: CacheStats, with_kv: bool
    ) -> None:
        move = tree.demote(node, with_kv)
        if move is not None:
            _record(move, freed, stats)

    def _demote_pinned(
        self,
        tree: RadixTree,
        now: float,
        max_bytes: int,
        freed: Reclaimed,
        stats: CacheStats,
        keep: Set[Node],
    ) -> int:
        """Demote, deepest first, unlocked nodes holding device bytes that no candidate
        covers (branch points, states above a subtree) until the device holds at most
        `max_bytes` (of a node in `keep`, its state only); returns how many moved."""
        pinned = [
            node
            for node in tree.iter_nodes()
            if node is not tree.root
            and node.lock == 0
            and device_bytes_of(tree, node, node not in keep)
        ]
        pinned.sort(key=lambda node: -node.depth)
        moved = 0
        for node in pinned:
            if tree.device_bytes <= max_bytes:
                break
            with_kv = node not in keep
            if (
                _alive(node)
                and self.host_room(tree, node, now, freed, stats, with_kv)
                and _alive(node)
            ):
                self._demote(tree, node, freed, stats, with_kv)
                moved += 1
        return moved

    # ------------------------------------------------------------------ host
    def host_room(
        self,
        tree: RadixTree,
        node: Node,
        now: float,
        freed: Reclaimed,
        stats: CacheStats,
        with_kv: bool = True,
    ) -> bool:
        """Drop host victims (never `node`) until the host can take `node`'s device
        bytes (its KV only `with_kv`); False when it cannot (the host is too small, or
        `node` went with a victim's tidying)."""
        cap = self.host.capacity_bytes
        while _alive(node):
            need = device_bytes_of(tree, node, with_kv)
            if tree.host_bytes + need <= cap:
                return True
            if need > cap:
                return False
            among = tree.table.host_candidates()
            among[node.slot] = False
            victim = self.policy.choose(tree, now, among)
            if victim is None:
                return False
            tree.evict_into(victim, freed)
            stats.host_evictions += 1
        return False

    # ------------------------------------------------------------- promotion
    def promote_hit(
        self,
        tree: RadixTree,
        match: Match,
        now: float,
        room: int,
        freed: Reclaimed,
        stats: CacheStats,
        in_use: InUse | None = None,
    ) -> tuple[int, int]:
        """Copy the host bytes of `match`'s hit (KV on its path, the hit's state) to the
        device, making room there first so that the device holds at most `room` bytes
        after, with the path locked; root-first, as far as room allows (`in_use`: see
        `evict_device`).

        Returns (hit tokens whose KV was on the host, host bytes the hit reads: what
        reaches the device by promotion or straight from the host)."""
        hit = match.hit_node
        if hit is tree.root:
            return 0, 0
        path = [n for n in match.path if n.depth <= hit.depth]
        on_host = sum(int(tree.table.host_tokens[n.slot]) for n in path)
        need = sum(host_part(tree, n, n is hit) for n in path)
        if not need:
            return 0, 0
        for node in path:
            tree.lock(node)
        try:
            evicted, _ = self.evict_device(tree, now, room - need, freed, stats, in_use)
            stats.evictions += evicted
            for node in path:
                part = host_part(tree, node, node is hit)
                if not part:
                    continue
                if tree.device_bytes + part > room:
                    break
                move = tree.promote(node, node is hit)
                assert move is not None
                _record(move, freed, stats)
        finally:
            for node in path:
                tree.unlock_into(node, freed)
        return on_host, need


def _record(move: TierMove, freed: Reclaimed, stats: CacheStats) -> None:
    freed.moves.append(move)
    if move.to_host:
        stats.demotions += 1
        stats.demoted_bytes += move.n_bytes
    else:
        stats.promotions += 1
        stats.promoted_bytes += move.n_bytes
