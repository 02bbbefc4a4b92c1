"""`LocalBackend`: the ingress's `Backend` on an in-process `Engine` (no Ray), for tests and
single-process serving. It plays both roles of the Ray deployment: the coordinator
(`plan`: the engine's planner) and one replica (`generate`: the engine's worker).

Scheduling is cooperative continuous batching without a background task: a stream that
needs its next event takes the engine lock and runs one engine stage (its prefill, or one
batched decode step over every running request, in a worker thread); the events go to
each request's queue, so concurrent streams share decode steps. A finished request is
committed to the cache and its queue ends with a `Completed`.

Difference from the Ray replica: a cancelled request is aborted (its states freed, its
plan released), not committed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from marconi_ray.engine.engine import Engine
from marconi_ray.protocol.orders import Finished, TokenEvent
from marconi_ray.protocol.results import Usage
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.messages import Completed, Dispatch, ReplicaStats

Event = TokenEvent | Completed


class _Request:
    def __init__(self, dispatch: Dispatch) -> None:
        self.dispatch = dispatch
        self.events: deque[Event] = deque()
        self.started = False
        self.done = False
        self.error: BaseException | None = None


class LocalStream:
    """The events of one request: `TokenEvent`s, then one `Completed` (an `EventStream`)."""

    def __init__(self, backend: LocalBackend, request: _Request) -> None:
        self._backend = backend
        self._request = request

    def __aiter__(self) -> LocalStream:
        return self

    async def __anext__(self) -> Event:
        req = self._request
        while not req.events:
            if req.error is not None:
                raise RuntimeError(f"request failed: {req.error}") from req.error
            if req.done:
                raise StopAsyncIteration
            await self._backend.advance(req)
        return req.events.popleft()

    def ready(self) -> bool:
        """Whether an event is here already."""
        return bool(self._request.events)

    def cancel(self) -> None:
        """Stop the request; its plan is aborted before the engine's next stage."""
        self._backend.cancel(self._request)


class LocalBackend:
    """`Backend` over one `Engine`, as replica `replica_id`."""

    def __init__(self, engine: Engine, replica_id: str = "local") -> None:
        self.engine = engine
        self.replica_id = replica_id
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}
        """The engine lock of each event loop that drives this backend: an asyncio lock
        belongs to one loop, so a second `asyncio.run` (a test's, a CLI's) gets its own.
        Contract: one loop drives the backend at a time."""
        self._requests: dict[int, _Request] = {}
        self._cancelled: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_id = 0

    async def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float
    ) -> Dispatch:
        """Validate and plan one request (ValueError naming a bad value; nothing changes)."""
        async with self._engine_lock():
            arr, sp = self.engine.validate(cast(Sequence[int], prompt), params)
            rid = self._next_id
            self._next_id += 1
            order, release = self.engine.planner.order(rid, arr, sp, submitted)
            # applied now, in the order the cache decided (no step runs: the lock is held)
            self.engine.worker.release(release)
            dispatch = Dispatch(self.replica_id, order)
            self._requests[rid] = _Request(dispatch)
            return dispatch

    def _engine_lock(self) -> asyncio.Lock:
        """This event loop's engine lock (made on its first use; closed loops' dropped)."""
        loop = asyncio.get_running_loop()
        lock = self._locks.get(loop)
        if lock is None:
            self._locks = {lp: lk for lp, lk in self._locks.items() if not lp.is_closed()}
            lock = self._locks[loop] = asyncio.Lock()
        return lock

    def generate(self, dispatch: Dispatch, stream: bool = True) -> LocalStream:
        """The event stream of a planned request (in process: streamed either way)."""
        rid = dispatch.order.request_id
        if rid not in self._requests:
            raise ValueError(f"request {rid} was not planned by this backend")
        return LocalStream(self, self._requests[rid])

    async def stats(self) -> list[ReplicaStats]:
        """This engine's cache figures as one replica's `ReplicaStats` (with its store's
        tier figures when the cache has a host tier)."""
        async with self._engine_lock():
            cache = self.engine.cache
            planner = self.engine.planner
            store = self.engine.worker.store.tier_stats() if cache.host_capacity else None
            runs = self._tuner_runs()
            return [ReplicaStats.of(self.replica_id, cache, planner.open_requests, runs, store)]

    async def tuner_runs(self) -> int:
        """Alpha searches adopted so far."""
        return self._tuner_runs()

    async def health(self) -> dict[str, Any]:
        """One in-process replica, always live; no journal."""
        return {"replicas": 1, "registered": 1, "journal": None}

    def _tuner_runs(self) -> int:
        tuner = self.engine.tuner
        return 0 if tuner is None else len(tuner.history)

    # ------------------------------------------------------------------ driving
    def cancel(self, request: _Request) -> None:
        if request.done:
            return
        self._cancelled.add(request.dispatch.order.request_id)
        request.done = True
        request.events.clear()
        try:
            task = asyncio.get_running_loop().create_task(self._reap_locked())
        except RuntimeError:  # no loop: the next engine stage reaps it
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reap_locked(self) -> None:
        async with self._engine_lock():
            self._reap()

    def _reap(self) -> None:
        engine = self.engine
        for rid in sorted(self._cancelled):
            self._requests.pop(rid, None)
            engine.worker.cancel(rid)
            done = {d.request_id: d for d in engine.worker.take_finished()}
            engine.worker.release(engine.planner.abort(rid, done.pop(rid, None)))
            self._commit(list(done.values()))
        self._cancelled.clear()

    async def advance(self, request: _Request) -> None:
        """Run one engine stage for `request`: its prefill, or one batched decode step."""
        async with self._engine_lock():
            self._reap()
            if request.events or request.done:
                return
            try:
                if not request.started:
                    request.started = True
                    await asyncio.to_thread(self._start, request)
                else:
                    await asyncio.to_thread(self._step)
            except Exception as exc:
                self._fail(exc)

    def _start(self, request: _Request) -> None:
        worker = self.engine.worker
        self._route(worker.start(request.dispatch.order))
        self._commit(worker.take_finished())

    def _step(self) -> None:
        worker = self.engine.worker
        self._route(worker.step())
        self._commit(worker.take_finished())

    def _route(self, events: list[TokenEvent]) -> None:
        for event in events:
            req = self._requests.get(event.request_id)
            if req is not None and not req.done:
                req.events.append(event)

    def _commit(self, finished: list[Finished]) -> None:
        engine = self.engine
        for done in finished:
            engine.worker.release(engine.planner.commit(done))
            req = self._requests.pop(done.request_id, None)
            if req is None:
                continue
            order = req.dispatch.order
            usage = Usage(len(order.prompt), len(done.tokens), order.hit_len)
            req.events.append(
                Completed(done.request_id, done.finish_reason, usage, done.timings, done.spec)
            )
            req.done = True

    def _fail(self, exc: Exception) -> None:
        """After an engine error: abort every request no longer running, fail its stream."""
        worker = self.engine.worker
        running = set(worker.running_ids())
        finished = {d.request_id: d for d in worker.take_finished()}
        for rid, req in list(self._requests.items()):
            if rid in running or not req.started:
                continue
            worker.release(self.engine.planner.abort(rid, finished.get(rid)))
            req.error = exc
            del self._requests[rid]
