"""The coordinator's side of moves between replicas (`serve.disagg`): where a request
runs (`stage`: `routing.disagg`), and the two journalled ends of each move.

A move of the entry of `tokens` from replica A to replica B:
1. `begin_move` applies a `Pin` on A (its deepest usable entry of `tokens` is locked: it
   cannot be evicted while it is copied) and an `Import` on B (B's own hit is locked,
   the bytes the entry adds are reserved, evicting to make room); both hold leases. It
   returns the `MoveTicket`, or None when there is nothing to move (A holds no deeper
   entry than B).
2. Whoever runs the move (the ingress: `serve.ingress.mover`) has A's shards export the
   entry and B's shards import it over Ray Direct Transport.
3. `finish_move` ends both plans: B's import is committed (a `Commit` whose
   `finish_reason` is "transfer": the tree admits the entry's state and the KV slots B
   stored) when B stored it, else aborted; A's pin is aborted. Each release goes to its
   replica's log, applied there once.

Exactly once: A's slots stay pinned until `finish_move` (or the pin's lease expires: a
mover that died), so they are never freed under the copy. What B stored for an import
whose plan is no longer open (its lease expired, B was reset) is returned by
`finish_move` for B to free directly: no tree refers to it. This relies on B running a
move's import and its `finish_move` between two steps of its loop, with no reconcile in
between (`replica.receiver`): a reconcile never sees a stored copy whose move is not
finished, so it never frees one that `finish_move` then commits or frees again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from marconi_ray.protocol.ops import NO_TIMINGS, Commit, Import, Pin
from marconi_ray.protocol.orders import Finished, Release
from marconi_ray.protocol.planner import Planner
from marconi_ray.serve.coordinator.cache_state import Held, ReplicaInfo
from marconi_ray.serve.coordinator.routing.choose import choose_replica, max_open
from marconi_ray.serve.coordinator.routing.disagg import (
    Candidate,
    MoveClock,
    Staging,
    stage_remote,
    stage_roles,
)
from marconi_ray.serve.messages import NoReplicaAvailable, Overloaded
from marconi_ray.serve.transfer_messages import ImportResult, MoveTicket

log = logging.getLogger(__name__)

TRANSFER_REASON = "transfer"
"""`Finished.finish_reason` of an import's commit."""


class TransferPlanning:
    """Mixed into `CacheCoordinator` (see the module docstring)."""

    # ------------------------------------------------------------------ choosing
    def stage(self: Any, prompt: npt.NDArray[np.int32]) -> Staging:
        """Where `prompt` runs and what moves first (`routing.disagg`): with roles, the
        local / hand-off / pull choice; with remote hits, the router's replica and a
        pull when it pays; otherwise the router's replica. NoReplicaAvailable /
        Overloaded as `route`."""
        disagg = self.settings.disagg
        if not disagg.moves:
            return Staging(self.route(prompt))
        clock = self._move_clock()
        if disagg.roles:
            decode = self._candidates(prompt, "decode")
            try:
                rid = choose_replica(
                    self.state, self._router, self.settings, prompt, self._has_role("prefill")
                )
            except (NoReplicaAvailable, Overloaded):
                if not decode:
                    raise
                rid = None
            prefill = None if rid is None else self._candidate(rid, prompt)
            return stage_roles(len(prompt), prefill, decode, clock)
        routed = self._candidate(self.route(prompt), prompt)
        return stage_remote(routed, self._candidates(prompt, None), clock)

    def _has_role(self: Any, role: str) -> Callable[[str], bool]:
        infos: Mapping[str, ReplicaInfo] = self.replica_info
        return lambda rid: infos[rid].role == role

    def _candidate(self: Any, rid: str, prompt: npt.NDArray[np.int32]) -> Candidate:
        planner: Planner = self.planners[rid]
        hit, _ = planner.cache.peek(prompt)
        return Candidate(rid, hit, planner.open_requests)

    def _candidates(self: Any, prompt: npt.NDArray[np.int32], role: str | None) -> list[Candidate]:
        """The confirmed replicas (of `role`; None: any) with room for one more request;
        those the routing index names are walked for their hit, the others hit 0."""
        table = self.state.routing.table
        named = self.state.routing.index.candidates(prompt)
        out = []
        for slot in np.flatnonzero(table.eligible(max_open(self.settings))):
            rid = table.id_at(int(slot))
            if role is not None and self.replica_info[rid].role != role:
                continue
            if rid in named:
                out.append(self._candidate(rid, prompt))
            else:
                out.append(Candidate(rid, 0, self.planners[rid].open_requests))
        return out

    def _move_clock(self: Any) -> MoveClock:
        cost = next(iter(self.planners.values())).cache.cost
        d = self.settings.disagg
        return MoveClock(cost, self.settings.prefill_tflops, d.transfer_gbps, d.transfer_latency_s)

    # ------------------------------------------------------------------ moving
    def begin_move(
        self: Any, source: str, receiver: str, tokens: npt.NDArray[np.int32], kind: str
    ) -> MoveTicket | None:
        """Pin `source`'s deepest usable entry of `tokens` and reserve `receiver`'s room
        for it (journalled `Pin` and `Import`); None when there is nothing to move (an
        unknown replica, no entry on the source, or none deeper than the receiver's own
        hit). `kind` (`pd`, `remote_hit`) is carried for metrics."""
        if source == receiver or source not in self.planners or receiver not in self.planners:
            return None
        tokens = np.asarray(tokens, dtype=np.int32)
        pin_id = self.state.next_request
        pinned: Held = self._do(Pin(source, pin_id, tokens))
        depth = pinned.depth
        if depth == 0 or self.planners[receiver].cache.peek(tokens[:depth])[0] >= depth:
            self._end_plan(source, pin_id, None, "nothing_to_move")
            return None
        import_id = self.state.next_request
        held: Held = self._do(Import(receiver, import_id, tokens[:depth]))
        return MoveTicket(
            source=source,
            receiver=receiver,
            tokens=tokens[:depth].copy(),
            kv_from=held.depth,
            state_id=pinned.state_id,
            slots=np.asarray(pinned.slots, dtype=np.int64),
            pin_request=pin_id,
            import_request=import_id,
            receiver_generation=self.state.log_of(receiver).generation,
            deadline=min(pinned.deadline, held.deadline),
            kind=kind,
        )

    def finish_move(self: Any, ticket: MoveTicket, result: ImportResult | None) -> Release:
        """End `ticket`'s move: commit the import when the receiver stored it (`result`
        ok), else abort it; abort the pin. Returns what the receiver stored that no tree
        will refer to (an import whose plan ended meanwhile), for the caller to free on
        the receiver directly; empty otherwise."""
        self._end_plan(ticket.source, ticket.pin_request, None, "moved")
        stored = (
            Release()
            if result is None or not result.ok
            else Release((result.state_id,), np.asarray(result.slots, dtype=np.int64))
        )
        rid, request = ticket.receiver, ticket.import_request
        if not self.state.is_planned(rid, request):
            return stored  # the plan ended (lease, reset): nothing refers to the copy
        if result is None or not result.ok:
            self._end_plan(rid, request, None, "transfer_failed")
            return Release()
        done = Finished(
            request_id=request,
            tokens=(),
            finish_reason=TRANSFER_REASON,
            state_ids={ticket.depth: int(result.state_id)},
            kv_slots=np.asarray(result.slots, dtype=np.int64),
            timings=NO_TIMINGS,
        )
        self._do(Commit(rid, done))
        return Release()
