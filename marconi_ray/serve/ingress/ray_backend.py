"""`RayBackend`: the ingress's `Backend` over the coordinator actor and the replica
deployment (pinned routing)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from ray.exceptions import NodeDiedError, RayActorError, RayTaskError, WorkerCrashedError
from ray.serve.exceptions import ReplicaUnavailableError
from ray.serve.handle import DeploymentHandle

from marconi_ray.protocol.orders import Finished, TokenEvent
from marconi_ray.protocol.results import Timings, Usage
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.journal import JOURNAL_STATES
from marconi_ray.serve.ingress.generation import EventStream
from marconi_ray.serve.ingress.group_key import group_of, spill_order
from marconi_ray.serve.ingress.handoff_stream import HandoffStream
from marconi_ray.serve.ingress.metrics import IngressMetrics
from marconi_ray.serve.ingress.mover import Mover
from marconi_ray.serve.ingress.plan_batcher import PlanBatcher
from marconi_ray.serve.ingress.replica_channel import ChannelStream, ReplicaChannel
from marconi_ray.serve.messages import (
    Completed,
    Dispatch,
    MisroutedDispatch,
    NoReplicaAvailable,
    Overloaded,
    RelayedCommit,
    ReplicaFailed,
    ReplicaStats,
    ReplicasUnconfirmed,
    Settlements,
    WrongReplica,
)
from marconi_ray.serve.transfer_messages import Staged

log = logging.getLogger(__name__)


class ReplicaUnavailable(RuntimeError):
    """No replica could run the request, even after re-planning it (HTTP 503)."""


LOST_REPLICA: Final = (RayActorError, NodeDiedError, WorkerCrashedError, ReplicaUnavailableError)
"""How a replica that died (its process, its node) shows to a caller: `RayActorError`
covers `ActorDiedError` and `ActorUnavailableError`."""

REPLANNABLE: Final = (MisroutedDispatch, ReplicaFailed, *LOST_REPLICA)
"""Causes of a failed dispatch that the request survives by being planned again."""

MAX_ATTEMPTS: Final = 4
"""Dispatches one request may go through (the first plus re-plans after faults)."""

RETRY_BACKOFF_S: Final = 0.5
"""Pause before re-plan k (times k), so the coordinator can drop a dead replica."""


PLAN_WAIT_S: Final = 10.0
"""How long planning waits for a replica to be confirmed before the request fails."""

PLAN_POLL_S: Final = 0.1

SETTLE_WAIT_S: Final = 5.0
"""How long a re-plan waits for the old replica's word on the old dispatch."""


class GuardedStream:
    """A request's event stream that survives replica faults.

    When the replica refuses the dispatch (`MisroutedDispatch`: a reset generation, a
    lapsed lease; `WrongReplica`: the call reached another replica), loses a shard
    (`ReplicaFailed`), its channel breaks or closes, or it dies itself, alone or with its
    node (`LOST_REPLICA`: the coordinator is then told, so it drops the replica as soon
    as its heartbeats have stopped instead of routing to it until its lease runs out),
    the request is planned again: from scratch when no token was streamed, otherwise as
    a continuation whose prompt is the original prompt plus the tokens already streamed
    (greedy outputs are unchanged by the resume; sampled ones draw fresh randomness; a
    grammar goes on past the streamed tokens: `SamplingParams.grammar_prefix`).
    The caller sees one uninterrupted stream whose `Completed` counts the original
    prompt. After `MAX_ATTEMPTS` dispatches: `ReplicaUnavailable`.

    The old plan is never released on a guess: the replica may be alive and may have
    started the order. A replica that refused a dispatch released its plan itself; one
    the call never reached (`WrongReplica`) cannot start it, so its plan is abandoned
    here; otherwise the old dispatch is settled at its replica first (it stops the
    request, or refuses and abandons it if it never arrived), and when the replica
    cannot answer its plan is left to the coordinator (the replica is dropped when it
    stays silent, or the lease runs out). A re-plan whose client leaves meanwhile is
    abandoned once it is made (nobody sent it anywhere).

    `cancel` settles the current dispatch at its replica (`ChannelStream.cancel`): a
    client that leaves mid-stream stops its request there, and one that leaves before the
    first token, or before the stream is even read, releases the plan at once instead of
    at its lease's end.
    """

    def __init__(
        self, stream: Any, backend: RayBackend, dispatch: Dispatch, streamed: bool = True
    ) -> None:
        self._stream = stream
        self._streamed = streamed
        self._backend = backend
        self._first = dispatch
        self._dispatch = dispatch
        self._emitted: list[int] = []
        self._ended = False
        self._pending: Completed | None = None
        self._buffered: list[TokenEvent] = []
        self._done = False  # the replica's Completed arrived: nothing left to cancel
        self.attempts = 1

    def __aiter__(self) -> GuardedStream:
        return self

    async def __anext__(self) -> TokenEvent | Completed:
        while True:
            if self._buffered:
                return self._emit(self._buffered.pop(0))
            if self._pending is not None:
                self._done = True
                done, self._pending = self._pending, None
                return done
            try:
                item: list[TokenEvent] | Completed = await self._stream.__anext__()
            except RayTaskError as exc:
                if not isinstance(exc.cause, REPLANNABLE):
                    raise
                await self._resume(exc.cause)
                continue
            except REPLANNABLE as exc:  # an end the channel carried, or the channel broke
                await self._resume(exc)
                continue
            if isinstance(item, list):  # one replica step's tokens of this request
                self._buffered.extend(item)
                continue
            self._done = True
            if item.commit is not None:
                await self._backend.relay(self._dispatch, item.commit, item.applied)
                item = dataclasses.replace(item, commit=None)
            if self.attempts > 1:
                return self._completed(item.finish_reason, item.timings)
            return item

    def _emit(self, event: TokenEvent) -> TokenEvent:
        self._emitted.append(event.token)
        self._ended = event.finished
        return event

    def _completed(self, reason: str, timings: Timings) -> Completed:
        """The end of the whole request, counted against its original prompt."""
        order = self._first.order
        usage = Usage(len(order.prompt), len(self._emitted), order.hit_len)
        return Completed(order.request_id, reason, usage, timings)

    async def _resume(self, cause: BaseException) -> None:
        await self._backend.settle_failed(self._dispatch, cause)
        if self.attempts >= MAX_ATTEMPTS:
            raise ReplicaUnavailable(str(cause)) from None
        order = self._first.order
        k = len(self._emitted)
        if self._ended or k >= order.max_new:  # every token arrived, only Completed lost
            reason = "length" if k >= order.max_new else "stop"
            self._pending = self._completed(reason, Timings(0.0, 0.0, 0.0, 0.0))
            return
        await asyncio.sleep(RETRY_BACKOFF_S * self.attempts)
        if isinstance(cause, LOST_REPLICA):  # silent by now: dropped, not routed to again
            coordinator = self._backend.coordinator_of(self._dispatch)
            await coordinator.report_unreachable.remote(self._dispatch.replica_id)
        self.attempts += 1
        prompt = np.concatenate([order.prompt, np.asarray(self._emitted, dtype=np.int32)])
        params = continuation_params(order.params, self._emitted, order.max_new - k)
        try:
            self._dispatch = await self._backend.plan_shielded(
                prompt, params, order.submitted, whole=True
            )
        except RayTaskError as exc:
            raise ReplicaUnavailable(f"re-planning failed: {exc.cause}") from None
        except (NoReplicaAvailable, Overloaded, ValueError) as exc:
            raise ReplicaUnavailable(f"re-planning failed: {exc}") from None
        self._stream = self._backend.stream(self._dispatch, self._streamed)

    def ready(self) -> bool:
        """Whether the next event is here already (reading it will not wait)."""
        return bool(self._buffered) or self._pending is not None or self._stream.ready()

    def cancel(self) -> None:
        """Stop the request (idempotent; nothing to do once it completed): its stream
        settles it at its replica."""
        if self._done:
            return
        self._stream.cancel()


def continuation_params(
    params: SamplingParams, emitted: list[int], max_tokens: int
) -> SamplingParams:
    """`params` for going on after `emitted` tokens, at most `max_tokens` more: the
    prompt's log-probabilities came with the first token (if one came), and a grammar
    goes on from where the emitted tokens left it."""
    prefix = params.grammar_prefix
    if params.grammar is not None:
        prefix = (*prefix, *emitted)
    return dataclasses.replace(
        params,
        max_tokens=max_tokens,
        prompt_logprobs=params.prompt_logprobs if not emitted else None,
        grammar_prefix=prefix,
    )


class RayBackend:
    """`Backend` over the coordinator actor (or the coordinators of a group) and the
    replica deployment.

    With a group (`coordinator` a list of K actor handles, by index), each request is
    planned at the coordinator its group key picks (`group_key.group_of` of its first
    `key_tokens` tokens) and spills to the next ones round the group when that one
    cannot place it (no replica of its own can serve, or all are at their queue bound);
    everything about a dispatch afterwards (its relayed commit, an abandon, a report of
    its replica) goes to the coordinator that planned it (`Dispatch.coordinator`). One
    `PlanBatcher` per coordinator.
    """

    def __init__(
        self,
        coordinator: Any,
        replicas: DeploymentHandle[Any],
        metrics: IngressMetrics | None = None,
        key_tokens: int = 256,
        mover: Mover | None = None,
    ) -> None:
        self.coordinators: list[Any] = (
            list(coordinator) if isinstance(coordinator, list | tuple) else [coordinator]
        )
        self.coordinator = self.coordinators[0]
        self.key_tokens = key_tokens
        self.metrics = metrics
        self.replicas = replicas
        self.batchers = [PlanBatcher(c) for c in self.coordinators]
        self.channels: dict[str, ReplicaChannel] = {}
        """Replica id -> this ingress's open stream from it."""
        self.mover = mover
        """Runs moves between replicas (`serve.disagg`); None: entries never move."""

    def coordinator_of(self, dispatch: Dispatch) -> Any:
        """The coordinator that planned `dispatch`."""
        return self.coordinators[dispatch.coordinator]

    async def plan(
        self,
        prompt: npt.NDArray[np.int32],
        params: SamplingParams,
        submitted: float,
        whole: bool = False,
    ) -> Dispatch:
        """Route and plan (requests planned together share one coordinator call, see
        `PlanBatcher`); a ValueError raised by the coordinator is re-raised as such.
        While no replica is confirmed (a restarted coordinator waiting for heartbeats, a
        replica rebuilding), planning is retried for up to `PLAN_WAIT_S`. With moves
        between replicas, an entry the coordinator wants moved first is moved
        (`Staged`), then the request planned where it went; `whole`: no P/D hand-off
        (a re-plan after a fault runs the rest where it is planned)."""
        waited = 0.0
        while True:
            try:
                return await self._plan_in_group(prompt, params, submitted, whole)
            except NoReplicaAvailable:
                if waited >= PLAN_WAIT_S:
                    raise
            except RayTaskError as exc:  # the coordinator's call itself failed
                if isinstance(exc.cause, ValueError):
                    raise ValueError(str(exc.cause)) from None
                if isinstance(exc.cause, Overloaded):
                    raise Overloaded(str(exc.cause)) from None
                if not isinstance(exc.cause, NoReplicaAvailable) or waited >= PLAN_WAIT_S:
                    raise
            await asyncio.sleep(PLAN_POLL_S)
            waited += PLAN_POLL_S

    async def _plan_in_group(
        self,
        prompt: npt.NDArray[np.int32],
        params: SamplingParams,
        submitted: float,
        whole: bool = False,
    ) -> Dispatch:
        """Plan at the coordinator the group key picks; when it cannot place the request
        (`NoReplicaAvailable`, `Overloaded`), at the next ones round the group; if none
        can, the first one's refusal is raised. A first choice whose replicas wait to be
        confirmed (`ReplicasUnconfirmed`: it restarted) is waited for, not spilled from:
        the request's cache is there. Any other error is raised at once."""
        k = len(self.batchers)
        order = spill_order(group_of(prompt, k, self.key_tokens), k)
        first: BaseException | None = None
        for index in order:
            try:
                if whole and self.mover is not None:
                    plan = self.coordinators[index].plan
                    got = await plan.remote(prompt, params, submitted, None, True, False)
                else:
                    got = await self.batchers[index].plan(prompt, params, submitted)
                dispatch = await self._after_moves(index, got, prompt, params, submitted)
            except (NoReplicaAvailable, Overloaded, RayTaskError) as exc:
                cause = exc.cause if isinstance(exc, RayTaskError) else exc
                if not isinstance(cause, NoReplicaAvailable | Overloaded):
                    raise
                if first is None and isinstance(cause, ReplicasUnconfirmed):
                    raise
                first = first or exc
                continue
            if index != order[0] and self.metrics is not None:
                self.metrics.spills.inc()
            return dispatch
        assert first is not None
        raise first

    async def _after_moves(
        self,
        index: int,
        got: Dispatch | Staged,
        prompt: npt.NDArray[np.int32],
        params: SamplingParams,
        submitted: float,
    ) -> Dispatch:
        """`got`, or, when the coordinator staged a move first, the dispatch planned
        where the entry went once it moved (a second staging is not moved again: the
        request is then planned without one)."""
        coordinator = self.coordinators[index]
        for moves in (True, False):
            if isinstance(got, Dispatch):
                return got
            assert self.mover is not None, "the coordinator staged a move with no mover"
            await self.mover.move(got.ticket)
            route = (got.replica, got.handoff)
            got = await coordinator.plan.remote(prompt, params, submitted, route, moves)
        assert isinstance(got, Dispatch)
        return got

    async def continue_on(
        self,
        replica_id: str,
        tokens: npt.NDArray[np.int32],
        params: SamplingParams,
        emitted: list[int],
        max_tokens: int,
        submitted: float,
    ) -> Dispatch:
        """Plan the rest of a handed-off request (`tokens`: its prompt and the `emitted`
        tokens) on `replica_id`, or where the coordinator routes it when that replica
        can no longer take it; never handed off again."""
        rest = continuation_params(params, emitted, max_tokens)
        route = (replica_id, None)
        coordinator = self.coordinators[0]
        got = await coordinator.plan.remote(tokens, rest, submitted, route, False, False)
        assert isinstance(got, Dispatch)
        return got

    async def relay(self, dispatch: Dispatch, done: Finished, applied: int = 0) -> None:
        """Send the commit `dispatch`'s replica relayed through this ingress with the
        next coordinator call, and wait until it was applied (or dropped), so the client,
        answered after this, finds it when it sends its next turn. Never raises: a commit
        that does not arrive is committed by the replica itself after
        `settings.commit_relay_s` (`ModelReplica._commit_overdue`)."""
        commit = RelayedCommit(dispatch.replica_id, dispatch.generation, done, applied)
        try:
            await asyncio.shield(self.batchers[dispatch.coordinator].commit(commit))
        except Exception as exc:  # the coordinator's call failed: the replica's backstop
            log.warning(
                "relayed commit of request %d on replica %s not applied (%s): the replica "
                "commits it itself",
                done.request_id,
                dispatch.replica_id,
                exc,
            )

    async def plan_shielded(
        self,
        prompt: npt.NDArray[np.int32],
        params: SamplingParams,
        submitted: float,
        whole: bool = False,
    ) -> Dispatch:
        """`plan`, kept when the caller is cancelled meanwhile: the plan it makes is
        abandoned at the coordinator (it was never sent to a replica)."""
        task = asyncio.ensure_future(self.plan(prompt, params, submitted, whole))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._abandon_unsent)
            raise

    def _abandon_unsent(self, task: asyncio.Future[Dispatch]) -> None:
        if task.cancelled() or task.exception() is not None:
            return  # nothing was planned
        dispatch = task.result()
        self.coordinator_of(dispatch).abandon.remote(dispatch)

    async def settle_failed(self, dispatch: Dispatch, cause: BaseException) -> None:
        """Resolve a dispatch that failed with `cause` before it is planned again, by the
        replica's word (see `GuardedStream`): nothing to do when the replica refused it
        (it released the plan), an abandon when the call reached another replica, else
        a settlement at the replica, bounded by `SETTLE_WAIT_S` (no answer: the
        coordinator's lease and silence checks are the backstop). Counted by cause."""
        if isinstance(cause, WrongReplica):
            self._count_replan("misrouted")
            await self.coordinator_of(dispatch).abandon.remote(dispatch)
            return
        if isinstance(cause, MisroutedDispatch):
            self._count_replan("refused")
            return
        self._count_replan("lost")
        settle = self.replicas.settle_many.remote(Settlements(dispatch.replica_id, (dispatch,)))
        try:
            (answer,) = await asyncio.wait_for(settle, SETTLE_WAIT_S)
        except Exception as exc:  # the replica cannot answer: it is gone or going
            log.info(
                "request %d: replica %s did not settle it (%s); its lease is the backstop",
                dispatch.order.request_id,
                dispatch.replica_id,
                exc,
            )
            return
        log.info(
            "request %d failed on replica %s (%s): %s there",
            dispatch.order.request_id,
            dispatch.replica_id,
            type(cause).__name__,
            answer,
        )

    def _count_replan(self, cause: str) -> None:
        if self.metrics is not None:
            self.metrics.replans.labels(cause=cause).inc()

    def generate(self, dispatch: Dispatch, stream: bool = True) -> EventStream:
        """The request's events: one guarded stream, or with a P/D hand-off the prefill
        replica's first token and the decode replica's rest (`HandoffStream`)."""
        if dispatch.handoff is not None and self.mover is not None:
            return HandoffStream(self, dispatch, stream)
        return self.guarded(dispatch, stream)

    def guarded(self, dispatch: Dispatch, stream: bool = True) -> GuardedStream:
        """`dispatch`'s events on its replica, re-planned after faults."""
        return GuardedStream(self.stream(dispatch, stream), self, dispatch, stream)

    def stream(self, dispatch: Dispatch, stream: bool = True) -> ChannelStream:
        """The chosen replica's events for `dispatch` over this ingress's channel from
        that replica (opened on first use, again after it broke, and for each event loop
        the backend is used from). `stream=False`: the replica sends the tokens with the
        end, in one message."""
        channel = self.channels.get(dispatch.replica_id)
        if channel is not None and channel.loop is not asyncio.get_running_loop():
            channel.close()  # its loop is gone: nothing reads it any more
            channel = None
        if channel is None:
            counter = None if self.metrics is None else self.metrics.replica_messages
            channel = ReplicaChannel(self.replicas, dispatch.replica_id, self._closed, counter)
            self.channels[dispatch.replica_id] = channel
        return channel.open(dispatch, stream)

    def close(self) -> None:
        """Close every channel (the ingress is stopping): the replicas' ends stop what is
        left of their requests."""
        for channel in list(self.channels.values()):
            channel.close()

    def _closed(self, channel: ReplicaChannel) -> None:
        if self.channels.get(channel.replica_id) is channel:
            del self.channels[channel.replica_id]

    async def stats(self) -> list[ReplicaStats]:
        parts = await asyncio.gather(*(c.stats.remote() for c in self.coordinators))
        return [s for part in parts for s in part]

    async def tuner_runs(self) -> int:
        runs = await asyncio.gather(*(c.tuner_runs.remote() for c in self.coordinators))
        return sum(int(r) for r in runs)

    async def health(self) -> dict[str, Any]:
        """One coordinator's `health`; with a group, the sum of their replicas, the
        journal in the worst state of theirs, and each one's report (`coordinators`).
        Raises when no coordinator of the group answers."""
        if len(self.coordinators) == 1:
            health: dict[str, Any] = await self.coordinator.health.remote()
            return health
        got = await asyncio.gather(
            *(c.health.remote() for c in self.coordinators), return_exceptions=True
        )
        live = [h for h in got if isinstance(h, dict)]
        if not live:
            raise got[0] if isinstance(got[0], BaseException) else RuntimeError(str(got[0]))
        return {
            "replicas": sum(h["replicas"] for h in live),
            "registered": sum(h["registered"] for h in live),
            "journal": worst_journal([h["journal"] for h in live]),
            "findings": list({f["code"]: f for h in live for f in h.get("findings", [])}.values()),
            "coordinators": [
                h if isinstance(h, dict) else {"error": f"{type(h).__name__}: {h}"} for h in got
            ],
        }


def worst_journal(journals: list[dict[str, Any]]) -> dict[str, Any]:
    """The journal report in the worst state of `journals` (`lost` > `degraded` > `ok`;
    see `JOURNAL_STATES`), for a group's `/health` and `/metrics`."""
    return max(journals, key=lambda j: JOURNAL_STATES.index(j["state"]))
