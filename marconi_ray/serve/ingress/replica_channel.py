"""`ReplicaChannel`: one multiplexed stream from one model replica to this ingress.

Every request this ingress runs on a replica travels over one long-lived Serve stream
(`ModelReplica.subscribe`) instead of a stream of its own: the replica sends one message
per loop step with the new tokens of all of them (`StepMessage`), and the channel hands
each request its items (`ChannelStream`, an event stream for `GuardedStream`). Requests
start in batches (`submit_many`, coalesced like plans) and clients that leave are
settled in batches (`settle_many`). Per streamed token this costs one dictionary entry
instead of a Ray object, an RPC and a Serve wrapper on each side.

A channel with no request in flight for `IDLE_CLOSE_S` closes (the ingress cancels the
stream): an idle ingress holds no call open at the replica, so Serve can drain and stop
a replica without waiting out its graceful-shutdown timeout.

Faults: when the stream breaks (the replica died, was replaced, refused the
subscription), every request of the channel gets the error as its next item (its
`GuardedStream` re-plans it), the requests are settled at the replica in case it still
runs them, and the channel closes; the next request to that replica opens a new one.
A refused submission (`MisroutedDispatch`) or a failed call reaches its request alone.
Every task here is `detached`: one client leaving cancels nothing shared.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

from marconi_ray.protocol.orders import TokenEvent
from marconi_ray.serve.detached import detached
from marconi_ray.serve.ingress.coalescer import Coalescer
from marconi_ray.serve.messages import (
    Completed,
    Dispatch,
    ReplicaFailed,
    Settlements,
    StreamItem,
    Submissions,
    Subscription,
)

log = logging.getLogger(__name__)

IDLE_CLOSE_S = 1.0
"""Seconds a channel stays open with no request in flight."""


class Inbox:
    """One request's items as the channel delivered them, until its stream reads them."""

    __slots__ = ("_waiter", "items")

    def __init__(self) -> None:
        self.items: list[StreamItem] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, items: list[StreamItem]) -> None:
        self.items.extend(items)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def take(self) -> list[StreamItem]:
        """Every item delivered since the last `take` (waits for one)."""
        while not self.items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        items, self.items = self.items, []
        return items


def _ends(item: StreamItem) -> bool:
    return not isinstance(item, TokenEvent)


class ChannelStream:
    """One request's events off its replica's channel: lists of `TokenEvent` (what came
    since the last read), then its `Completed`; an exception that ended it on the replica
    (or broke the channel) is raised. `cancel` settles the request at its replica."""

    def __init__(self, channel: ReplicaChannel, dispatch: Dispatch, inbox: Inbox) -> None:
        self._channel = channel
        self._dispatch = dispatch
        self._inbox = inbox
        self._items: list[StreamItem] = []
        self._over = False  # its end was read (or it was cancelled)

    def __aiter__(self) -> ChannelStream:
        return self

    async def __anext__(self) -> list[TokenEvent] | Completed:
        if not self._items:
            if self._over:
                raise StopAsyncIteration
            self._items = await self._inbox.take()
        n = 0
        while n < len(self._items) and isinstance(self._items[n], TokenEvent):
            n += 1
        if n:
            tokens, self._items = self._items[:n], self._items[n:]
            return tokens  # type: ignore[return-value]  # the first n are TokenEvents
        end = self._items.pop(0)
        self._over = True
        if isinstance(end, BaseException):
            raise end
        if not isinstance(end, Completed):
            raise RuntimeError(f"request {self._dispatch.order.request_id}: bad item {end!r}")
        return end

    def ready(self) -> bool:
        """Whether the next read returns without waiting."""
        return bool(self._items) or bool(self._inbox.items)

    def cancel(self) -> None:
        """Stop listening; unless its end came, stop the request at its replica (or
        refuse and abandon it there if it never arrived). Idempotent."""
        if self._over:
            return
        self._over = True
        self._channel.forget(self._dispatch)


class ReplicaChannel:
    """This ingress's stream from replica `replica_id` (see the module docstring).

    Args:
        replicas: the model replicas' deployment handle (pinned routing).
        replica_id: the replica this channel reads.
        on_close: called once, with this channel, when its stream has broken.
        counter: counts the messages read (a Prometheus `Counter`), if given.
    """

    def __init__(
        self,
        replicas: Any,
        replica_id: str,
        on_close: Callable[[ReplicaChannel], None],
        counter: Counter | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.id = uuid.uuid4().hex
        self.closed = False
        self.loop = asyncio.get_running_loop()
        """The event loop its tasks run on (a channel serves that loop's requests only)."""
        self._replicas = replicas
        self._on_close = on_close
        self._inboxes: dict[int, tuple[Dispatch, Inbox]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._submit: Coalescer[tuple[Dispatch, bool], None] = Coalescer(self._send_submissions)
        self._settle: Coalescer[Dispatch, str] = Coalescer(self._send_settlements)
        self.messages = 0
        """Messages read from the replica so far."""
        self._counter = counter
        self._stream: Any = None
        self._idle: asyncio.TimerHandle | None = None
        detached(self._listen(), self._tasks)

    def open(self, dispatch: Dispatch, streamed: bool) -> ChannelStream:
        """Start `dispatch` on the replica; its events come through the returned stream."""
        inbox = Inbox()
        self._inboxes[dispatch.order.request_id] = (dispatch, inbox)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        detached(self._start(dispatch, streamed, inbox), self._tasks)
        return ChannelStream(self, dispatch, inbox)

    def forget(self, dispatch: Dispatch) -> None:
        """The request's client no longer listens: settle it at the replica."""
        if self._inboxes.pop(dispatch.order.request_id, None) is not None and not self.closed:
            detached(self._settle_one(dispatch), self._tasks)
        self._watch_idle()

    def _watch_idle(self) -> None:
        """With no request in flight, close after `IDLE_CLOSE_S` unless one opens."""
        if not self._inboxes and not self.closed and self._idle is None:
            self._idle = self.loop.call_later(IDLE_CLOSE_S, self._close_idle)

    def _close_idle(self) -> None:
        self._idle = None
        if not self._inboxes and not self.closed:
            self.close()

    def close(self) -> None:
        """Stop reading: cancel the subscription (the replica's end stops what is left of
        the channel's requests and drops its outbox); a request still here gets
        `ReplicaFailed` (its `GuardedStream` re-plans it). Callable from any event loop."""
        self._end(ReplicaFailed(f"the channel from replica {self.replica_id!r} was closed"))
        if self._stream is not None:
            self._stream.cancel()

    def _end(self, error: BaseException) -> tuple[Dispatch, ...]:
        """Mark the channel closed (once), stop its idle timer and give every request
        still here `error`; returns their dispatches."""
        if not self.closed:
            self.closed = True
            self._on_close(self)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        entries, self._inboxes = self._inboxes, {}
        for _, inbox in entries.values():
            inbox.put([error])
        return tuple(d for d, _ in entries.values())

    async def _start(self, dispatch: Dispatch, streamed: bool, inbox: Inbox) -> None:
        try:
            await self._submit.submit((dispatch, streamed))
        except Exception as exc:  # refused here, or the call failed: this request only
            if self._inboxes.pop(dispatch.order.request_id, None) is not None:
                inbox.put([exc])
            self._watch_idle()

    async def _settle_one(self, dispatch: Dispatch) -> None:
        try:
            await self._settle.submit(dispatch)
        except Exception as exc:  # the lease is the backstop
            log.warning("settling request %d failed: %s", dispatch.order.request_id, exc)

    async def _send_submissions(
        self, batch: list[tuple[Dispatch, bool]]
    ) -> list[BaseException | None]:
        dispatches = tuple(d for d, _ in batch)
        streamed = tuple(s for _, s in batch)
        sub = Submissions(self.replica_id, self.id, dispatches, streamed)
        results: list[BaseException | None] = await self._replicas.submit_many.remote(sub)
        return results

    async def _send_settlements(self, batch: list[Dispatch]) -> list[str]:
        answers: list[str] = await self._replicas.settle_many.remote(
            Settlements(self.replica_id, tuple(batch))
        )
        return answers

    async def _listen(self) -> None:
        """Read the replica's messages into the requests' inboxes until the stream breaks."""
        error: BaseException
        try:
            self._stream = self._replicas.options(stream=True).subscribe.remote(
                Subscription(self.replica_id, self.id)
            )
            async for message in self._stream:
                self.messages += 1
                if self._counter is not None:
                    self._counter.inc()
                for rid, items in message.items():
                    entry = self._inboxes.get(rid)
                    if entry is None:  # cancelled meanwhile
                        continue
                    if _ends(items[-1]):
                        del self._inboxes[rid]
                    entry[1].put(items)
                self._watch_idle()
            # the replica ends a stream idle for long: requests racing that end re-plan
            error = ReplicaFailed(f"replica {self.replica_id!r} ended its stream to this ingress")
        except asyncio.CancelledError:  # its event loop is shutting down
            self.close()
            raise
        except Exception as exc:
            error = exc
        self._close(error)

    def _close(self, error: BaseException) -> None:
        """The stream broke (or, closed for idleness, was cancelled): every request gets
        `error`; those the replica may still run are settled there (best effort: it may
        be gone)."""
        dispatches = self._end(error)
        if dispatches:
            detached(self._settle_all(dispatches), self._tasks)

    async def _settle_all(self, dispatches: tuple[Dispatch, ...]) -> None:
        try:
            await self._send_settlements(list(dispatches))
        except Exception as exc:
            log.info("replica %s: settling after its stream broke failed: %s", self.replica_id, exc)
