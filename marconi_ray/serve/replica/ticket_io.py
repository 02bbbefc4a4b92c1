"""A replica's store's side of a coordinator-planned move (`MoveTicket`): export the
pinned entry as a payload, import a payload into the room the coordinator reserved.

The coordinator owns the trees, so a shard never looks an entry up: the ticket names
where the source's store holds it (its state id and one KV slot per token) and how much
KV the receiver holds already (`kv_from`). An import that cannot be taken (short,
corrupt, foreign payload; a store that lacks room) stores nothing and says why: its
request then recomputes.
"""

from __future__ import annotations

import logging

import numpy as np

from marconi_ray.engine.store.entry_io import (
    EntryPayload,
    TransferError,
    export_entry,
    import_entry,
)
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.serve.transfer_messages import ImportResult, MoveTicket

log = logging.getLogger(__name__)


def export_ticket(store: StateStore, ticket: MoveTicket) -> EntryPayload:
    """A copy of the ticket's pinned entry, its KV from `kv_from` (ValueError from the
    store when the slots or the state are not held)."""
    return export_entry(store, ticket.tokens, ticket.slots, ticket.state_id, ticket.kv_from)


def import_ticket(
    store: StateStore, payload: EntryPayload | None, ticket: MoveTicket
) -> ImportResult:
    """Store `payload` as the ticket's entry: the new state id and KV slots of positions
    [kv_from, depth), or a refusal (nothing stored) naming why."""
    if payload is None:
        return ImportResult(-1, np.zeros(0, np.int64), 0, "the source sent no entry")
    try:
        state_id, slots = import_entry(store, payload, ticket.tokens, ticket.kv_from)
    except (TransferError, RuntimeError, MemoryError) as exc:
        log.warning("refused the entry of a move from %s: %s", ticket.source, exc)
        return ImportResult(-1, np.zeros(0, np.int64), payload.meta.nbytes, str(exc))
    return ImportResult(int(state_id), np.asarray(slots, np.int64), payload.meta.nbytes)
