"""Messages of a move between replicas (`serve.disagg`): the coordinator's `MoveTicket`
for one move, a `Staged` answer to a plan (move first, then plan again), the P/D
`Handoff` a dispatch carries, what the receiver reports (`ImportResult`), and the
`ShardsQuery` that asks a replica for its shard actors."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class Handoff:
    """A P/D dispatch: its replica prefills and emits the first token (its order's
    `max_new` is 1), then the entry at the prompt's end moves to `replica_id`, which
    decodes the rest, up to `max_tokens` tokens in all."""

    replica_id: str
    max_tokens: int


@dataclass(frozen=True, eq=False)
class MoveTicket:
    """One planned move of the entry of `tokens` from `source` to `receiver`.

    The source's entry is pinned under request id `pin_request` (`state_id` and `slots`,
    one KV slot per token, are where its store holds it); the receiver's room is
    reserved under `import_request`, and it already holds the KV of `tokens[:kv_from]`,
    so only positions [kv_from, len(tokens)) and the state move. Both plans hold leases
    until `deadline`; `CacheCoordinator.finish_move` ends them. `receiver_generation`:
    the receiver's registration generation the reservation was made against."""

    source: str
    receiver: str
    tokens: npt.NDArray[np.int32]
    kv_from: int
    state_id: int
    slots: npt.NDArray[np.int64]
    pin_request: int
    import_request: int
    receiver_generation: int
    deadline: float
    kind: str

    @property
    def depth(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class Staged:
    """A plan's answer when an entry must move first: run `ticket`'s move, tell the
    coordinator how it went (`finish_move`), then plan the request again on `replica`
    (with `handoff`: a P/D dispatch)."""

    ticket: MoveTicket
    replica: str
    handoff: str | None


@dataclass(frozen=True, eq=False)
class ImportResult:
    """What a receiver's shard did with a payload: the new `state_id` and KV `slots`
    (positions [kv_from, depth)) it stored, `nbytes` that arrived, or why it took
    nothing (`refused`; then `state_id` is -1 and nothing was stored)."""

    state_id: int
    slots: npt.NDArray[np.int64]
    nbytes: int
    refused: str = ""

    @property
    def ok(self) -> bool:
        return not self.refused


@dataclass(frozen=True)
class ShardsQuery:
    """Ask replica `replica_id` for the Ray names of its shard actors (rank order)."""

    replica_id: str


@dataclass(frozen=True)
class TransferGroup:
    """A collective group over shard actors (`members`, actor handles, by group rank)
    named `name` on `backend`: every process that owns a move between two members
    registers it before the move (`replica.receiver.know_groups`)."""

    name: str
    backend: str
    members: tuple[Any, ...]


@dataclass(frozen=True)
class ReceiveOrder:
    """Replica `replica_id` (the ticket's receiver) is to pull `ticket`'s entry from the
    source's shards (`source_shards`, actor handles in rank order) over transfer mode
    `mode`, its rank i from the source's rank i; `groups`: the collective groups those
    pairs share (empty for NIXL and the object store)."""

    replica_id: str
    ticket: MoveTicket
    source_shards: tuple[Any, ...]
    mode: str
    groups: tuple[TransferGroup, ...] = ()
