"""`Coalescer`: concurrent calls leave in batches, at most `max_in_flight` batches at once.

Group commit, as databases do it: a lone call goes out at the end of the current event-
loop turn (`call_soon`, so it pays nothing extra); calls that arrive while
`max_in_flight` batches are already out wait, and all of them leave in one batch when a
slot frees. Under load the batch grows with the load, so the number of round trips per
call falls as the callers multiply, and nothing waits longer than one batch's trip.

Contract: `send(args)` returns one result per argument, in order; a result that is an
exception is raised to its caller only (one bad request never fails the others). An
exception raised by `send` itself reaches every caller of that batch. A caller that is
cancelled while it waits leaves its argument in the batch; its result is dropped. The
batch runs outside every caller's context (`detached`): a caller's cancellation never
cancels the call its batch-mates wait on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from marconi_ray.serve.detached import detached

A = TypeVar("A")
R = TypeVar("R")


class Coalescer(Generic[A, R]):
    """Batches concurrent `submit(arg)` calls into `send(list_of_args)` calls.

    Args:
        send: the batched call; one result (or exception instance) per argument.
        max_in_flight: most batches out at once (>= 1).
    """

    def __init__(
        self,
        send: Callable[[list[A]], Awaitable[Sequence[R | BaseException]]],
        max_in_flight: int = 1,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self._send = send
        self.max_in_flight = max_in_flight
        self._queue: list[tuple[A, asyncio.Future[R]]] = []
        self._in_flight = 0
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        """Batches sent so far."""
        self.items = 0
        """Arguments sent so far (`items / calls` is the mean batch)."""

    async def submit(self, arg: A) -> R:
        """`arg`'s result from the batch it leaves in."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        self._queue.append((arg, future))
        self._schedule(loop)
        return await future

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._queue and not self._scheduled and self._in_flight < self.max_in_flight:
            self._scheduled = True
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if not self._queue or self._in_flight >= self.max_in_flight:
            return
        batch, self._queue = self._queue, []
        self._in_flight += 1
        detached(self._run(batch), self._tasks)  # the batch belongs to no single caller

    async def _run(self, batch: list[tuple[A, asyncio.Future[R]]]) -> None:
        self.calls += 1
        self.items += len(batch)
        try:
            results = await self._send([arg for arg, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self._in_flight -= 1
            self._schedule(asyncio.get_running_loop())
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
