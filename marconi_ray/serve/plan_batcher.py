"""`PlanBatcher`: plans that arrive together leave for the coordinator in one call.

Every `plan` issued during one turn of the event loop is queued; at the end of the turn
the queue goes out as one `coordinator.plan_many` call, and each caller gets its own
`Dispatch` or its own exception back (`plan_many` returns per-request errors as values,
so one bad request never fails the others). Under load this turns N actor round trips
into one; a lone request pays nothing extra (the flush is scheduled with `call_soon`).
A failure of the call itself (the coordinator died, Ray's own errors) reaches every
caller of that batch.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import numpy.typing as npt

from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.messages import Dispatch

PlanArgs = tuple[npt.NDArray[np.int32], SamplingParams, float]


class PlanBatcher:
    """Coalesces concurrent `plan` calls into `coordinator.plan_many` calls."""

    def __init__(self, coordinator: Any) -> None:
        self.coordinator = coordinator
        self._queue: list[tuple[PlanArgs, asyncio.Future[Dispatch]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0
        self.planned = 0

    async def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float
    ) -> Dispatch:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Dispatch] = loop.create_future()
        if not self._queue:
            loop.call_soon(self._flush)
        self._queue.append(((prompt, params, submitted), future))
        return await future

    def _flush(self) -> None:
        batch, self._queue = self._queue, []
        task = asyncio.ensure_future(self._send(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: list[tuple[PlanArgs, asyncio.Future[Dispatch]]]) -> None:
        self.calls += 1
        self.planned += len(batch)
        try:
            results = await self.coordinator.plan_many.remote([args for args, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), result in zip(batch, results, strict=True):
            if future.done():
                continue
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)
