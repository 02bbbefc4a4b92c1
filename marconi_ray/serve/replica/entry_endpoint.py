"""`EntryEndpoint`: the actor side of moving cache entries between replicas over Ray
Direct Transport (`serve.transfer_modes`).

An actor that holds a replica's cache (an `Engine`, or a TP rank's worker and planner)
mixes this in and says where its engine is (`_entry_engine`). `move_entry` chains one
actor's export into another's import: the payload's tensors go from the source's
process straight to the receiver's (GLOO here, NCCL or NIXL between GPUs), never through
the caller. At tp > 1 each rank holds its shard of every entry, so rank i moves to rank
i (`move_entries`); a receiver of another tp or model layout refuses the payload.

Exactly once: the export copies the entry and unlocks it before it returns, so the
source's cache never waits on the receiver; the copy lives as long as Ray's reference to
it (freed when the import has read it, or when either side dies). A receiver that
refuses a payload (short, corrupt, for other tokens or another layout) or loses its
source mid-transfer changes nothing and reports 0 tokens: its caller recomputes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import ray
from ray.exceptions import RayError

from marconi_ray.engine.store.entry_io import EntryPayload, TransferError
from marconi_ray.serve.transfer_modes import TransferMode

log = logging.getLogger(__name__)


class EntryEngine(Protocol):
    def export_prefix(self, tokens: Any, kv_from: int = 0) -> EntryPayload | None: ...

    def import_prefix(self, payload: EntryPayload) -> int: ...

    def held_prefix(self, tokens: Any) -> int: ...


@dataclass(frozen=True)
class Imported:
    """What an import did: `tokens` of the entry now cached at the receiver (0: none),
    `nbytes` that arrived, and why it took nothing (`refused`, "" when it did)."""

    tokens: int
    nbytes: int
    refused: str = ""


class EntryEndpoint:
    """Mixed into an actor class: its cache's entries can be exported to and imported
    from other endpoints (see the module docstring).

    The `export_<mode>` methods take whatever the actor's `_export` takes (an engine:
    the tokens and `kv_from`; a replica's shard: the coordinator's `MoveTicket`) and
    return its payload over that mode's transport."""

    def _entry_engine(self) -> EntryEngine:
        raise NotImplementedError

    def _export(self, *args: Any) -> EntryPayload | None:
        tokens, kv_from = args
        return self._entry_engine().export_prefix(tokens, kv_from)

    @ray.method(tensor_transport="gloo")
    def export_gloo(self, *args: Any) -> EntryPayload | None:
        return self._export(*args)

    @ray.method(tensor_transport="nccl")
    def export_nccl(self, *args: Any) -> EntryPayload | None:
        return self._export(*args)

    @ray.method(tensor_transport="nixl")
    def export_nixl(self, *args: Any) -> EntryPayload | None:
        return self._export(*args)

    def export_object_store(self, *args: Any) -> EntryPayload | None:
        return self._export(*args)

    def held_prefix(self, tokens: npt.NDArray[np.int32]) -> int:
        """Tokens of `tokens` this endpoint's cache could serve as a hit now."""
        return self._entry_engine().held_prefix(tokens)

    def import_entry(self, payload: EntryPayload | None) -> Imported:
        """Admit a payload (None: the source had no entry deeper than asked); a refused
        one changes nothing and says why."""
        if payload is None:
            return Imported(0, 0, "the source holds no entry deeper than asked")
        try:
            return Imported(self._entry_engine().import_prefix(payload), payload.meta.nbytes)
        except TransferError as exc:
            log.warning("refused a transferred entry: %s", exc)
            return Imported(0, payload.meta.nbytes, str(exc))


def join_transfer_group(endpoints: list[Any], mode: TransferMode) -> None:
    """Put `endpoints` (actor handles) in one collective group when `mode` needs one
    (GLOO, NCCL); each actor can be in one group per backend."""
    if mode.collective is None:
        return
    from ray.experimental.collective import create_collective_group

    create_collective_group(endpoints, backend=mode.collective)


def move_entry(
    source: Any, receiver: Any, tokens: npt.NDArray[np.int32], kv_from: int, mode: TransferMode
) -> Any:
    """Start moving `source`'s deepest entry of `tokens` (KV from `kv_from`, what the
    receiver holds) to `receiver`; returns the ObjectRef of the receiver's `Imported`."""
    export = getattr(source, f"export_{mode.name}")
    return receiver.import_entry.remote(export.remote(tokens, kv_from))


def settle_move(ref: Any, timeout_s: float) -> Imported:
    """Wait for a `move_entry`; a source or receiver that died, or a move past
    `timeout_s`, is an `Imported` of 0 tokens naming what happened (never raised: the
    caller recomputes)."""
    try:
        got: Imported = ray.get(ref, timeout=timeout_s)
        return got
    except (RayError, TimeoutError) as exc:
        log.warning("an entry transfer failed: %s", exc)
        return Imported(0, 0, f"{type(exc).__name__}: {exc}")
