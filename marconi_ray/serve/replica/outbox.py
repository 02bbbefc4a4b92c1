"""`Outbox`: what a replica has for one ingress channel, until that ingress reads it.

A replica multiplexes the events of every request an ingress runs on it into one stream
(`ModelReplica.subscribe`): the loop puts each request's items into the channel's outbox
as they come (`OutboxSink.put_nowait`, the interface of the per-request `asyncio.Queue`
the replica uses for `generate`), and the subscriber takes all of them at once, so one
message per step leaves the replica for the channel instead of one per request, and a
subscriber that reads late gets several steps in one message.

Invariants:
- a request's items are in order, tokens first, then exactly one end (`Completed` or
  an exception); nothing is put for a request after its end;
- `rids` is the set of accepted requests whose end has not been put yet;
- a request whose client wants the whole answer (`streamed=False`) has its tokens held
  here and put with its end: one list, in the message that carries the end.
"""

from __future__ import annotations

import asyncio
import time

from marconi_ray.protocol.orders import TokenEvent
from marconi_ray.serve.messages import StepMessage, StreamItem


class Outbox:
    """The items of one channel's requests since its subscriber last took them."""

    def __init__(self) -> None:
        self._items: StepMessage = {}
        self._held: dict[int, list[StreamItem]] = {}
        self._ready = asyncio.Event()
        self.rids: set[int] = set()
        """Requests accepted for the channel whose end has not been put."""
        self.subscribed = False
        """A subscriber reads this outbox (set by `subscribe`, never cleared: a channel
        whose subscriber left is dropped with its outbox)."""
        self.closed = False
        """Its subscriber left: nothing put from now on is read."""
        self.touched = time.monotonic()
        """When a request was last accepted for it (see `ModelReplica._prune_outboxes`)."""

    def sink(self, rid: int, streamed: bool) -> OutboxSink:
        """Where the loop puts request `rid`'s items (`rid` joins `rids`)."""
        self.rids.add(rid)
        self.touched = time.monotonic()
        if not streamed:
            self._held[rid] = []
        return OutboxSink(self, rid)

    def put(self, rid: int, item: StreamItem) -> None:
        """Add one item of `rid` (ignored once its end was put)."""
        if rid not in self.rids:
            return
        end = not isinstance(item, TokenEvent)
        held = self._held.get(rid)
        if held is not None:
            held.append(item)
            if not end:
                return
            del self._held[rid]
            self._items.setdefault(rid, []).extend(held)
        else:
            self._items.setdefault(rid, []).append(item)
        if end:
            self.rids.discard(rid)
        self._ready.set()

    async def take(self, timeout_s: float | None = None) -> StepMessage:
        """Every item put since the last `take` (waits for at least one request's, or
        `timeout_s`: then the message is empty)."""
        if not self._ready.is_set():  # a step's items usually wait already: no timer then
            try:
                await asyncio.wait_for(self._ready.wait(), timeout_s)
            except TimeoutError:
                return {}
        self._ready.clear()
        message, self._items = self._items, {}
        return message


class OutboxSink:
    """One request's entry into an `Outbox`, used like its `asyncio.Queue`."""

    __slots__ = ("_outbox", "_rid")

    def __init__(self, outbox: Outbox, rid: int) -> None:
        self._outbox = outbox
        self._rid = rid

    def put_nowait(self, item: StreamItem) -> None:
        self._outbox.put(self._rid, item)

    @property
    def read(self) -> bool:
        """Whether an ingress reads the channel now (what is put reaches it, unless the
        channel breaks on the way)."""
        return self._outbox.subscribed and not self._outbox.closed
