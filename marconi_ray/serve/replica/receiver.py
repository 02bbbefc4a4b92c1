"""`Receiving`: a replica pulls a cache entry from another replica's shards into its own
(the receiver's side of a move, `serve.coordinator.transfers`).

The receiver drives the whole move, so that Ray Direct Transport's references are
owned where they are used (RDT objects cannot be handed on to a third process): its
loop calls each source rank's `export_<mode>(ticket)` and passes the reference straight
to its own rank's `import_ticket`, then ends the move at the coordinator
(`finish_move`) and frees on its own shards whatever the coordinator gives back. Moves
run in the loop between two steps, one at a time, so every rank of a tp > 1 replica
sees the same calls in the same order and allocates the same ids, and no reconcile
(also the loop's) ever runs between a move's import and its `finish_move`: a reconcile
never sees a stored copy whose move is not finished.

Exactly once: a move that fails anywhere (the source dead, a refusal, ranks that
disagree, a timeout) is finished as failed: its import is aborted and whatever a rank
stored of it is freed on that rank, once, here. Every failure is logged and reported as
an `ImportResult` naming it; the request that wanted the entry then recomputes.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import numpy as np

from marconi_ray.protocol.orders import Release
from marconi_ray.serve.transfer_messages import ImportResult, ReceiveOrder, TransferGroup

log = logging.getLogger(__name__)


def know_groups(groups: tuple[TransferGroup, ...]) -> None:
    """Register `groups` in this process's collective-group registry (Ray's
    `RemoteCommunicatorManager`, per process) unless it knows them: the owner of an RDT
    object must know the group its sender and receiver share."""
    if not groups:
        return
    from ray.experimental.collective.collective import RemoteCommunicatorManager
    from ray.experimental.collective.communicator import CommunicatorHandle

    manager = RemoteCommunicatorManager.get()
    known = {c.name for c in manager.get_collective_groups()}
    for group in groups:
        if group.name not in known:
            comm = CommunicatorHandle(list(group.members), group.name, group.backend)
            manager.add_remote_communicator(comm)


def _failed(why: str, nbytes: int = 0) -> ImportResult:
    return ImportResult(-1, np.zeros(0, np.int64), nbytes, why)


class Receiving:
    """Mixed into `ModelReplica`: `receive` queues a move for the loop, which runs the
    queue between two steps (`_run_receives`)."""

    replica_id: str
    settings: Any
    shards: Any
    coordinator: Any
    generation: int
    _receives: list[tuple[ReceiveOrder, asyncio.Future[ImportResult]]]

    def _ensure_loop(self) -> None: ...

    async def _release_now(self, release: Release) -> None: ...

    def _misrouted(self, replica_id: str, what: str, n: int = 1) -> bool:
        raise NotImplementedError

    async def transfer_shards(self, query: Any) -> list[Any]:
        """The handles of this replica's shard actors in rank order (empty: its shard
        lives in this process, so nothing can move to or from it)."""
        if self._misrouted(query.replica_id, "shards query"):
            return []
        return list(getattr(self.shards, "actors", []))

    async def receive(self, order: ReceiveOrder) -> ImportResult:
        """Pull `order`'s entry into this replica (see the module docstring); what the
        import did."""
        if self._misrouted(order.replica_id, "move"):  # the receiver is gone: end it now
            await self.coordinator.finish_move.remote(order.ticket, None)
            return _failed(f"the move for replica {order.replica_id!r} reached another")
        done: asyncio.Future[ImportResult] = asyncio.get_running_loop().create_future()
        self._receives.append((order, done))
        self._ensure_loop()
        return await done

    async def _run_receives(self) -> None:
        """Run every queued move, one at a time (the loop calls it between steps)."""
        while self._receives:
            order, done = self._receives.pop(0)
            try:
                result = await self._receive_one(order)
            except Exception as exc:  # never the loop's: the request recomputes
                log.exception("replica %s: a move failed", self.replica_id)
                result = _failed(f"{type(exc).__name__}: {exc}")
            if not done.done():
                done.set_result(result)

    async def _receive_one(self, order: ReceiveOrder) -> ImportResult:
        ticket = order.ticket
        own = list(getattr(self.shards, "actors", []))
        if ticket.receiver_generation != self.generation:
            result = _failed("the receiver's cache was reset since the move was planned")
        elif len(own) != len(order.source_shards) or not own:
            result = _failed(
                f"tp differs: the source has {len(order.source_shards)} shard actors, this "
                f"replica {len(own)}"
            )
        else:
            result = await self._pull(order, own)
        direct: Release = await self.coordinator.finish_move.remote(ticket, result)
        if direct.states or len(direct.slots):
            await self._release_now(direct)
        return result

    async def _pull(self, order: ReceiveOrder, own: list[Any]) -> ImportResult:
        """Every rank's import; one result when all ranks stored the same ids, else a
        failure (what any rank stored is freed on that rank first)."""
        ticket = order.ticket
        know_groups(order.groups)
        refs = [
            dst.import_ticket.remote(getattr(src, f"export_{order.mode}").remote(ticket), ticket)
            for src, dst in zip(order.source_shards, own, strict=True)
        ]
        timeout = self.settings.disagg.transfer_timeout_s
        try:
            gathered = asyncio.gather(*refs, return_exceptions=True)
            results: list[Any] = list(await asyncio.wait_for(gathered, timeout))
        except TimeoutError:
            return _failed(f"the move took longer than transfer_timeout_s ({timeout} s)")
        errors = [r for r in results if not isinstance(r, ImportResult)]
        stored = [r for r in results if isinstance(r, ImportResult) and r.ok]
        first = stored[0] if stored else None
        agree = (
            not errors
            and len(stored) == len(results)
            and first is not None
            and all(
                r.state_id == first.state_id and np.array_equal(r.slots, first.slots)
                for r in stored
            )
        )
        if agree:
            assert first is not None
            return replace(first, nbytes=sum(r.nbytes for r in stored))
        for dst, r in zip(own, results, strict=True):  # each rank frees only its own
            if isinstance(r, ImportResult) and r.ok:
                await dst.release.remote(Release((r.state_id,), r.slots))
        if errors:
            return _failed(f"{type(errors[0]).__name__}: {errors[0]}")
        refused = [r.refused for r in results if isinstance(r, ImportResult) and r.refused]
        return _failed(refused[0] if refused else "the ranks stored different ids")
