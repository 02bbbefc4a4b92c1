"""`check_moves`: validation of a release's tier moves, as a whole, before any applies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

import numpy as np

from marconi_ray.engine.store.slot_table import DEVICE, HOST, TIER_NAMES, SlotTable
from marconi_ray.protocol.orders import Move


def check_moves(
    moves: Sequence[Move], slots: SlotTable, states: Collection[int], host_states: Collection[int]
) -> None:
    """ValueError, naming the move and the ids, unless every move of `moves` in order is
    valid given the ones before it: each slot held by `slots` and listed once, each state
    in `states` and listed once, and none already in the tier the move sends it to (states
    in `host_states` are on the host, the others on the device). Changes nothing."""
    tier = slots.tier.copy()
    on_host = set(host_states)
    for n, m in enumerate(moves):
        where = TIER_NAMES[HOST if m.to_host else DEVICE]
        ids = np.asarray(m.slots, dtype=np.int64)
        errors = []
        bad = slots.not_held(ids, tier)
        if bad:
            errors.append(f"KV slots {bad[:16]} are not held")
        there = np.unique(ids[slots.tiers_of(ids, tier) == (HOST if m.to_host else DEVICE)])
        if len(there):
            errors.append(f"KV slots {there[:16].tolist()} are already on {where}")
        sids = list(m.states)
        unknown = {s for s in sids if s not in states}
        unknown |= {s for s, c in Counter(sids).items() if c > 1}
        if unknown:
            errors.append(f"states {sorted(unknown)[:16]} are not held (or listed twice)")
        done = sorted({s for s in sids if s in states and (s in on_host) == m.to_host})
        if done:
            errors.append(f"states {done[:16]} are already on {where}")
        if errors:
            raise ValueError(f"move {n} to {where}: {'; '.join(errors)} (nothing moved)")
        tier[ids] = HOST if m.to_host else DEVICE
        (on_host.update if m.to_host else on_host.difference_update)(sids)
