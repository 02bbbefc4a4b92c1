"""`Mover`: the ingress's side of moves between replicas (`serve.disagg`).

For a `MoveTicket` the coordinator began, it asks the receiver to pull the entry
(`ReceiveOrder`, pinned-routed to the receiver: `ModelReplica.receive`), which runs the
move and ends it at the coordinator itself. The mover only names the source's shard
actors (asked of the source replica once: `ShardsQuery`) and the collective groups they
share.

Collective groups (GLOO, NCCL): Ray's torch collective backend gives each process one
process group, made when it first joins a group, so an actor can be in one group for
good. The mover therefore forms one group per TP rank over every registered replica's
shard of that rank, once, the first time a move needs it (one ingress per deployment
does: `serve.app`), and hands the groups to each receiver with its order. A replica
that registered later (a replacement for a lost one) is in no group: its moves go over
the object store, which needs none, and that is logged once.

One move at a time per replica over a two-sided transport (GLOO, NCCL): each shard
actor sends and receives on one system thread, so two moves in opposite directions
between the same replicas (a hand-off P -> D while a pull D -> P runs), or any cycle of
them, would each wait on the other's send. The mover takes a lock per replica for both
ends of a move, in one global order, so moves touching a replica run one after the
other and moves between disjoint pairs run side by side.

A receiver that cannot be reached or does not answer within `transfer_timeout_s` (plus
a margin for its queue) has the move finished here as failed; if it finishes it too,
the coordinator's second `finish_move` finds both plans ended and changes nothing but
to hand back what the receiver stored, which the receiver frees.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Final

import numpy as np

from marconi_ray.serve.ingress.metrics import IngressMetrics
from marconi_ray.serve.transfer_messages import (
    ImportResult,
    MoveTicket,
    ReceiveOrder,
    ShardsQuery,
    TransferGroup,
)
from marconi_ray.serve.transfer_modes import TRANSFER_MODES, TransferMode

log = logging.getLogger(__name__)

ANSWER_MARGIN_S: Final = 10.0
"""Seconds a receiver may take beyond `transfer_timeout_s` to answer (its loop runs the
move between two steps, after those queued before it)."""


class Mover:
    """Runs moves for one ingress (see the module docstring).

    Args:
        replicas: the replica deployment's handle (pinned routing).
        coordinator: the coordinator actor (moves need one coordinator).
        mode: the deployment's transfer mode (`serve.transfer_modes.resolve_transfer`).
        timeout_s: `transfer_timeout_s`.
        metrics: where bytes, seconds and outcomes of moves are counted.
    """

    def __init__(
        self,
        replicas: Any,
        coordinator: Any,
        mode: TransferMode,
        timeout_s: float,
        metrics: IngressMetrics | None = None,
    ) -> None:
        self.replicas = replicas
        self.coordinator = coordinator
        self.mode = mode
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._shards: dict[str, tuple[Any, ...]] = {}
        self._groups: tuple[TransferGroup, ...] | None = None
        self._lock = asyncio.Lock()
        self._warned: set[str] = set()
        self._busy: dict[str, asyncio.Lock] = {}
        """Replica id -> held while a two-sided move has it at one end."""

    async def shards_of(self, replica_id: str) -> tuple[Any, ...]:
        """`replica_id`'s shard actors in rank order (asked once; empty: it has none)."""
        shards = self._shards.get(replica_id)
        if shards is None:
            got = await self.replicas.transfer_shards.remote(ShardsQuery(replica_id))
            shards = tuple(got)
            if shards:
                self._shards[replica_id] = shards
        return shards

    async def warm(self, replicas: int, timeout_s: float = 300.0) -> None:
        """Form the collective groups as soon as `replicas` replicas are registered (the
        ingress starts this at its start), so no request's first move waits for them.
        Gives up quietly after `timeout_s`: the first move forms them then."""
        if self.mode.collective is None:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if len(await self.coordinator.replicas.remote()) >= replicas:
                    await self._ensure_groups()
                    return
            except Exception:
                log.exception("forming the transfer groups failed: the first move tries again")
                return
            await asyncio.sleep(0.5)

    async def _groups_for(
        self, source: tuple[Any, ...], receiver: tuple[Any, ...]
    ) -> tuple[TransferGroup, ...] | None:
        """The groups rank i of `source` and `receiver` share, for each i (formed on the
        first call); None when some pair shares none."""
        if self.mode.collective is None:
            return ()
        groups = await self._ensure_groups()
        if len(groups) < len(source):
            return None
        for group, s, d in zip(groups, source, receiver, strict=False):
            if s not in group.members or d not in group.members:
                return None
        return groups

    async def _ensure_groups(self) -> tuple[TransferGroup, ...]:
        """The groups, formed on the first call (one caller forms them)."""
        async with self._lock:
            if self._groups is None:
                await self._form_groups()
        assert self._groups is not None
        return self._groups

    async def _form_groups(self) -> None:
        from ray.experimental.collective import create_collective_group

        backend = self.mode.collective
        assert backend is not None
        replicas = list(await self.coordinator.replicas.remote())
        shards = [s for s in [await self.shards_of(rid) for rid in replicas] if s]
        groups = []
        for rank in range(min((len(s) for s in shards), default=0)):
            actors = [s[rank] for s in shards]
            comm = await asyncio.to_thread(create_collective_group, actors, backend)
            groups.append(TransferGroup(comm.name, backend, tuple(actors)))
        self._groups = tuple(groups)
        log.info(
            "transfer groups (%s) over %d replicas' shards: %d rank(s)",
            backend,
            len(shards),
            len(groups),
        )

    async def move(self, ticket: MoveTicket) -> ImportResult:
        """Run `ticket`'s move (the receiver pulls it and finishes it at the
        coordinator); what the receiver's import did. Never raises: a failure is an
        `ImportResult` naming it, and the move is finished as failed."""
        start = time.perf_counter()
        used = [self.mode.name]  # the mode that carried it (`_move` says)
        try:
            result = await asyncio.wait_for(
                self._move(ticket, used), self.timeout_s + ANSWER_MARGIN_S
            )
        except Exception as exc:
            log.warning("move %d -> %s failed: %s", ticket.import_request, ticket.receiver, exc)
            result = ImportResult(-1, np.zeros(0, np.int64), 0, f"{type(exc).__name__}: {exc}")
            try:
                await self.coordinator.finish_move.remote(ticket, None)
            except Exception:
                log.exception("finishing a failed move at the coordinator failed")
        self._count(ticket, result, time.perf_counter() - start, used[0])
        return result

    async def _move(self, ticket: MoveTicket, used: list[str]) -> ImportResult:
        source = await self.shards_of(ticket.source)
        receiver = await self.shards_of(ticket.receiver)
        mode = self.mode
        groups: tuple[TransferGroup, ...] = ()
        if source and receiver and len(source) == len(receiver):
            found = await self._groups_for(source, receiver)
            if found is None:
                mode = TRANSFER_MODES["object_store"]
                self._warn_once(ticket)
            else:
                groups = found
        used[0] = mode.name
        order = ReceiveOrder(ticket.receiver, ticket, source, mode.name, groups)
        if mode.collective is None:
            result: ImportResult = await self.replicas.receive.remote(order)
            return result
        first, second = (
            self._busy.setdefault(r, asyncio.Lock())
            for r in sorted((ticket.source, ticket.receiver))
        )
        async with first, second:
            result = await self.replicas.receive.remote(order)
        return result

    def _warn_once(self, ticket: MoveTicket) -> None:
        pair = f"{ticket.source}->{ticket.receiver}"
        if pair not in self._warned:
            self._warned.add(pair)
            log.warning(
                "replicas %s share no %s group (one registered after the groups were "
                "formed): their moves go over the object store",
                pair,
                self.mode.name,
            )

    def _count(self, ticket: MoveTicket, result: ImportResult, seconds: float, mode: str) -> None:
        if self.metrics is None:
            return
        outcome = "ok" if result.ok else "failed"
        self.metrics.transfers.labels(kind=ticket.kind, outcome=outcome, mode=mode).inc()
        self.metrics.transfer_seconds.labels(kind=ticket.kind).observe(seconds)
        if result.ok:
            self.metrics.transfer_bytes.labels(kind=ticket.kind).inc(result.nbytes)
            if ticket.kind == "remote_hit":
                self.metrics.remote_hit_tokens.inc(ticket.depth - ticket.kv_from)
