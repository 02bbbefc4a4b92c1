"""The replica's continuous-batching loop, driven without Ray so a race can be staged.

The real loop runs against real shards and a real coordinator in test_serve_runtime.py;
here the shards and the coordinator are in-process stand-ins whose calls can be held
open, to pin one interleaving: a dispatch arriving while the idle loop awaits the
coordinator's `drain` must still be served (CI once hung 15 minutes on this lost wakeup).
"""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import numpy as np
import pytest

from marconi_ray.protocol.orders import (
    Finished,
    PrefillOrder,
    StepInput,
    StepOutput,
    TokenEvent,
)
from marconi_ray.protocol.release_log import Releases
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.messages import Completed, Dispatch, MisroutedDispatch
from marconi_ray.serve.replica.deployment import ModelReplica
from marconi_ray.serve.settings import ServeSettings


class _Call:
    """`obj.method.remote(*args)` -> awaitable, like a Ray actor method."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kw: Any) -> Any:
        return self.fn(*args, **kw)


class OneTokenShards:
    """A shard group whose every started request emits one token and finishes in the
    same step (the `ShardGroup` interface)."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.info: dict[str, Any] = {}

    async def advance(self, step: StepInput) -> StepOutput:
        rids = [order.request_id for order in step.start]
        return StepOutput(
            events=tuple(TokenEvent(rid, 42, True) for rid in rids),
            finished=tuple(
                Finished(rid, (42,), "length", {}, np.empty(0, np.int64), T0) for rid in rids
            ),
        )

    async def call(self, method: str, *args: Any) -> None:
        return None

    async def rank0(self, method: str, *args: Any) -> None:
        return None


class GatedCoordinator:
    """`drain` waits on `gate` (and reports that it was entered); `commit` frees nothing."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.draining = asyncio.Event()
        self.drain = _Call(self._drain)
        self.commit_many = _Call(self._commit_many)
        self.heartbeat = _Call(self._heartbeat)
        self.abandoned: list[int] = []
        self.commit_contexts: list[str | None] = []
        self.abandon = _Call(self._abandon)

    async def _abandon(self, dispatch: Dispatch) -> None:
        self.abandoned.append(dispatch.order.request_id)

    async def _drain(
        self, replica_id: str, applied: int = 0, generation: int | None = None
    ) -> Releases:
        self.draining.set()
        await self.gate.wait()
        return Releases()

    async def _commit_many(
        self,
        replica_id: str,
        finished: list[Finished],
        applied: int = 0,
        generation: int | None = None,
    ) -> Releases:
        self.commit_contexts.append(REQUEST.get())
        return Releases()

    async def _heartbeat(
        self, replica_id: str, live: list[int], started: list[int] | None = None
    ) -> tuple[str, int]:
        return "ok", 0


T0 = Timings(0.0, 0.0, 0.0, 0.0)
REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar("request", default=None)
"""Stands for Ray Serve's request context, through which it cancels a departed client's
Ray calls."""


def _replica(coordinator: GatedCoordinator) -> ModelReplica:
    replica = object.__new__(ModelReplica)
    replica.replica_id = "r0"
    replica.settings = ServeSettings(model_dir="unused", model_name="tiny", heartbeat_s=60.0)
    replica.shards = OneTokenShards()
    replica.coordinator = coordinator
    replica.init_loop(0)
    return replica


def _dispatch(rid: int) -> Dispatch:
    params = SamplingParams(max_tokens=1, temperature=0.0)
    return Dispatch("r0", PrefillOrder(rid, np.arange(7, 12, dtype=np.int32), params, 1))


async def _collect(replica: ModelReplica, rid: int) -> list[Any]:
    return [event async for event in replica.generate(_dispatch(rid))]


def test_dispatch_arriving_during_idle_drain_is_served():
    async def main() -> list[Any]:
        coordinator = GatedCoordinator()
        replica = _replica(coordinator)
        first = await asyncio.wait_for(_collect(replica, 0), 5)
        assert isinstance(first[-1], Completed)
        # the loop is now idle and blocked in `drain`; a dispatch arrives meanwhile
        await asyncio.wait_for(coordinator.draining.wait(), 5)
        second = asyncio.ensure_future(_collect(replica, 1))
        await asyncio.sleep(0.01)
        coordinator.gate.set()
        events = await asyncio.wait_for(second, 5)
        assert replica._loop_task is not None
        replica._loop_task.cancel()
        assert replica._beat_task is not None
        replica._beat_task.cancel()
        return events

    events = asyncio.run(main())
    assert [t.token for batch in events[:-1] for t in batch] == [42]
    assert isinstance(events[-1], Completed) and events[-1].request_id == 1


def test_settle_stops_what_runs_abandons_what_never_arrived_and_refuses_it_later():
    """The ingress settles a dispatch whose client left before any event came back (the
    real path, over HTTP with Ray, is tests/serve/test_dropped_clients.py)."""

    async def main() -> None:
        coordinator = GatedCoordinator()
        coordinator.gate.set()
        replica = _replica(coordinator)
        done = await asyncio.wait_for(_collect(replica, 0), 5)
        assert isinstance(done[-1], Completed)
        assert await replica.settle(_dispatch(0)) == "ended"  # committed: left alone
        assert await replica.settle(_dispatch(5)) == "abandoned"
        assert coordinator.abandoned == [5]
        with pytest.raises(MisroutedDispatch, match="already reached"):
            await _collect(replica, 5)  # arriving after its settle: never started
        elsewhere = Dispatch("r9", _dispatch(6).order)
        assert await replica.settle(elsewhere) == "misrouted"
        replica._orders[7] = _dispatch(7)  # as `generate` registers a running request
        assert await replica.settle(_dispatch(7)) == "stopped" and 7 in replica._stops
        assert coordinator.abandoned == [5]
        for task in (replica._loop_task, replica._beat_task):
            assert task is not None
            task.cancel()

    asyncio.run(main())


def test_the_step_loop_runs_outside_the_request_that_started_it():
    """The loop (and its commit_many) serves every request: a request's cancellation
    must not reach it (the soak once failed 8 requests at once that way)."""

    async def main() -> list[str | None]:
        coordinator = GatedCoordinator()
        coordinator.gate.set()
        replica = _replica(coordinator)
        REQUEST.set("client 0")
        done = await asyncio.wait_for(_collect(replica, 0), 5)
        assert isinstance(done[-1], Completed)
        for task in (replica._loop_task, replica._beat_task):
            assert task is not None
            task.cancel()
        return coordinator.commit_contexts

    assert asyncio.run(main()) == [None]
