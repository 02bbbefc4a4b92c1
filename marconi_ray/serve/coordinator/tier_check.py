"""Reconciliation of a restored tree's tiers with a replica's store (`reconcile`)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.protocol.orders import Release


def tier_mismatch(
    cache: PrefixCache,
    referenced: tuple[set[int], set[int]],
    pending: Release,
    host_states: Iterable[int] | None,
    host_slots: Iterable[int] | None,
) -> int:
    """How many ids the tree refers to (`referenced`: `cache.referenced()`) sit in
    another tier in the store than the tree says, given the store's host ids
    (`host_states`, `host_slots`; None: the store did not say, 0). Ids that `pending`
    (moves not yet applied by the store) still moves are not compared: the store will
    move them."""
    if host_states is None and host_slots is None:
        return 0
    tree_states, tree_slots = referenced
    tree_host_states, tree_host_slots = cache.referenced_on_host()
    moving_states = {int(s) for move in pending.moves for s in move.states}
    moving_slots = {int(s) for move in pending.moves for s in np.asarray(move.slots).tolist()}
    store_states = {int(s) for s in (() if host_states is None else host_states)}
    store_slots = {int(s) for s in (() if host_slots is None else host_slots)}
    states = ((tree_host_states ^ store_states) & tree_states) - moving_states
    slots = ((tree_host_slots ^ store_slots) & tree_slots) - moving_slots
    return len(states) + len(slots)
