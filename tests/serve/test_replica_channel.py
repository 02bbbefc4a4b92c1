"""The multiplexed replica -> ingress stream, driven without Ray so each fault lands at a
chosen step: the real `RayBackend`, `ReplicaChannel`, `GuardedStream` and `ModelReplica`
(its loop, outboxes, `subscribe` / `submit_many` / `settle_many`), with the Serve handle,
the coordinator and the shards replaced by in-process stand-ins.

The same path over real Ray and HTTP is in test_openai_e2e.py (one message per step for
concurrent streams), test_dropped_clients.py (clients leaving at every point) and
test_faults.py (a shard lost mid-stream).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from ray.exceptions import ActorDiedError
from serve_helpers import read_tokens

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
from marconi_ray.serve.ingress import ray_backend, replica_channel
from marconi_ray.serve.ingress.ray_backend import GuardedStream, RayBackend
from marconi_ray.serve.messages import Completed, Dispatch, RelayedCommit, ReplicaFailed
from marconi_ray.serve.replica import deployment
from marconi_ray.serve.replica.deployment import ModelReplica
from marconi_ray.serve.settings import ServeSettings

T0 = Timings(0.0, 0.0, 0.0, 0.0)


class _Call:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class CountingShards:
    """A shard group whose running requests each emit token 100 + k at their k-th step
    and finish after `max_new` tokens (early on a stop); `fail_at`: the first step that
    finds that many requests running, each with two tokens out at least, raises
    `ReplicaFailed`, as a lost shard makes every request fail."""

    def __init__(self, fail_at: int = 0) -> None:
        self.names: list[str] = []
        self.info: dict[str, Any] = {}
        self.running: dict[int, tuple[int, int]] = {}  # rid -> (emitted, max_new)
        self.steps = 0
        self.fail_at = fail_at
        self.stopped: list[int] = []

    async def advance(self, step: StepInput) -> StepOutput:
        self.steps += 1
        for order in step.start:
            self.running[order.request_id] = (0, order.max_new)
        out = [emitted for emitted, _ in self.running.values()]
        if self.fail_at and len(out) == self.fail_at and min(out) >= 2:
            self.fail_at = 0
            self.running.clear()
            raise ReplicaFailed("replica r0 lost a shard")
        finished = []
        for rid in step.stop:
            if rid in self.running:
                emitted, _ = self.running.pop(rid)
                self.stopped.append(rid)
                finished.append(_finished(rid, emitted, "stop"))
        events = []
        for rid, (emitted, max_new) in list(self.running.items()):
            last = emitted + 1 == max_new
            events.append(TokenEvent(rid, 100 + emitted, last))
            self.running[rid] = (emitted + 1, max_new)
            if last:
                del self.running[rid]
                finished.append(_finished(rid, max_new, "length"))
        return StepOutput(events=tuple(events), finished=tuple(finished))

    async def call(self, method: str, *args: Any) -> Any:
        if method == "cancel":
            self.running.pop(args[0], None)
        return [] if method == "release" else None  # nothing refused

    async def rank0(self, method: str, *args: Any) -> Any:
        empty = np.empty(0, np.int64)
        return ([], empty, [], empty) if method == "holdings" else None

    async def alive(self) -> bool:
        return True


def _finished(rid: int, n: int, reason: str) -> Finished:
    return Finished(rid, tuple(range(100, 100 + n)), reason, {}, np.empty(0, np.int64), T0)


class Coordinator:
    """Plans every request on replica r0 (fresh request ids); records the rest."""

    def __init__(self) -> None:
        self.ids = itertools.count(1000)
        self.plans: list[tuple[list[int], int]] = []
        self.abandoned: list[int] = []
        self.aborted: list[int] = []
        self.committed: list[tuple[int, str]] = []
        self.plan_many = _Call(self._plan_many)
        self.abandon = _Call(self._abandon)
        self.abort = _Call(self._abort)
        self.report_unreachable = _Call(self._nothing)
        self.commit_many = _Call(self._commit_many)
        self.step_many = _Call(self._step_many)
        self.drain = _Call(self._release)
        self.heartbeat = _Call(self._heartbeat)
        self.reconcile = _Call(self._reconcile)

    async def _plan_many(self, batch: list[tuple[Any, SamplingParams, float]]) -> list[Dispatch]:
        out = []
        for prompt, params, _ in batch:
            self.plans.append(([int(t) for t in prompt], params.max_tokens))
            order = PrefillOrder(
                next(self.ids), np.asarray(prompt, np.int32), params, params.max_tokens
            )
            out.append(Dispatch("r0", order))
        return out

    async def _step_many(
        self, commits: list[RelayedCommit], batch: list[tuple[Any, SamplingParams, float]]
    ) -> tuple[list[bool], list[Dispatch]]:
        """Relayed commits are recorded as committed (as `_commit_many` records the
        replica's own), then the plans."""
        self.committed += [(c.done.request_id, c.done.finish_reason) for c in commits]
        return [True] * len(commits), await self._plan_many(batch)

    async def _abandon(self, dispatch: Dispatch) -> None:
        self.abandoned.append(dispatch.order.request_id)

    async def _abort(
        self, replica_id: str, rid: int, applied: int = 0, generation: int | None = None
    ) -> Releases:
        self.aborted.append(rid)
        return Releases()

    async def _nothing(self, *args: Any) -> None:
        return None

    async def _commit_many(
        self,
        replica_id: str,
        finished: list[Finished],
        applied: int = 0,
        generation: int | None = None,
    ) -> Releases:
        self.committed += [(f.request_id, f.finish_reason) for f in finished]
        return Releases()

    async def _release(self, *args: Any) -> Releases:
        return Releases()

    async def _heartbeat(self, *args: Any) -> tuple[str, int]:
        return "ok", 0

    async def _reconcile(self, *args: Any) -> tuple[int, Releases]:
        return 0, Releases()


class Handle:
    """A `DeploymentHandle` of one in-process replica: `.remote` calls its method.
    `break_after`: the first subscription raises `ActorDiedError` after that many
    messages (its replica side is closed, as Ray cancels a stream whose caller is gone)."""

    def __init__(self, replica: ModelReplica, break_after: int = 0) -> None:
        self.replica = replica
        self.break_after = break_after
        self.subscriptions = 0

    def options(self, stream: bool = False) -> Handle:
        return self

    def __getattr__(self, name: str) -> _Call:
        if name == "subscribe":
            return _Call(lambda sub: Subscribed(self._subscribe(sub)))
        return _Call(getattr(self.replica, name))

    async def _subscribe(self, sub: Any) -> AsyncIterator[Any]:
        self.subscriptions += 1
        breaks = self.break_after if self.subscriptions == 1 else 0
        inner = self.replica.subscribe(sub)
        try:
            n = 0
            async for message in inner:
                yield message
                n += 1
                if n == breaks:
                    raise ActorDiedError()
        finally:
            await inner.aclose()


class Subscribed:
    """A subscription as the ingress holds it: read it, or `cancel` it (its replica-side
    generator is closed, as Serve cancels a request)."""

    def __init__(self, gen: Any) -> None:
        self.gen = gen
        self.reading: asyncio.Future[Any] | None = None

    def __aiter__(self) -> Subscribed:
        return self

    async def __anext__(self) -> Any:
        self.reading = asyncio.ensure_future(self.gen.__anext__())
        return await self.reading

    def cancel(self) -> None:
        if self.reading is not None:
            self.reading.cancel()  # raised inside the replica's generator, as Ray does


def _replica(coordinator: Coordinator, shards: CountingShards) -> ModelReplica:
    replica = object.__new__(ModelReplica)
    replica.replica_id = "r0"
    replica.settings = ServeSettings(model_dir="unused", model_name="tiny", heartbeat_s=60.0)
    replica.shards = shards
    replica.coordinator = coordinator
    replica.init_loop(0)
    return replica


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_backend, "RETRY_BACKOFF_S", 0.0)


async def _start(backend: RayBackend, n: int, prompt: list[int]) -> GuardedStream:
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    dispatch = await backend.plan(np.asarray(prompt, np.int32), params, 0.0)
    stream = backend.generate(dispatch)
    assert isinstance(stream, GuardedStream)
    return stream


async def _start_all(backend: RayBackend, n: int, prompts: list[list[int]]) -> list[GuardedStream]:
    """Plan and start requests together (one `plan_many`, one `submit_many`)."""
    return list(await asyncio.gather(*(_start(backend, n, p) for p in prompts)))


def _stop(replica: ModelReplica) -> None:
    for task in (replica._loop_task, replica._beat_task):
        if task is not None:
            task.cancel()


def _setup(
    fail_at: int = 0, break_after: int = 0
) -> tuple[Coordinator, CountingShards, ModelReplica, Handle, RayBackend]:
    coordinator, shards = Coordinator(), CountingShards(fail_at)
    replica = _replica(coordinator, shards)
    handle = Handle(replica, break_after)
    return coordinator, shards, replica, handle, RayBackend(coordinator, handle)


def test_concurrent_requests_share_one_message_per_step() -> None:
    async def main() -> None:
        coordinator, shards, replica, handle, backend = _setup()
        streams = await _start_all(backend, 5, [[1, 2, i] for i in range(6)])
        results = await asyncio.wait_for(asyncio.gather(*(read_tokens(s) for s in streams)), 10)
        for tokens, done in results:
            assert tokens == [100, 101, 102, 103, 104]
            assert done.usage.completion_tokens == 5 and done.finish_reason == "length"
        (channel,) = backend.channels.values()
        assert handle.subscriptions == 1
        # 30 tokens and 6 ends in at most one message per step
        assert 1 <= channel.messages <= shards.steps < 30
        assert sorted(coordinator.committed) == sorted((d, "length") for d in range(1000, 1006))
        assert not replica._orders and not replica._queues
        (outbox,) = replica._outboxes.values()
        assert not outbox.rids
        _stop(replica)

    asyncio.run(main())


def test_a_client_leaving_mid_stream_stops_only_its_request() -> None:
    async def main() -> None:
        coordinator, shards, replica, _, backend = _setup()
        leaving = await _start(backend, 50, [1, 2, 3])
        staying = await _start(backend, 6, [4, 5, 6])
        first = await asyncio.wait_for(leaving.__anext__(), 10)
        assert isinstance(first, TokenEvent) and first.token == 100
        leaving.cancel()
        tokens, done = await asyncio.wait_for(read_tokens(staying), 10)
        assert tokens == list(range(100, 106)) and done.finish_reason == "length"
        for _ in range(100):  # the settle reaches the replica, its next step stops it
            if (1000, "stop") in coordinator.committed:
                break
            await asyncio.sleep(0.01)
        assert (1000, "stop") in coordinator.committed and shards.stopped == [1000]
        assert not replica._orders and 1000 not in shards.running
        _stop(replica)

    asyncio.run(main())


def test_a_shard_lost_mid_stream_resumes_every_request_with_its_tokens() -> None:
    async def main() -> None:
        coordinator, _, replica, _, backend = _setup(fail_at=3)
        streams = await _start_all(backend, 20, [[7, 8, i] for i in range(3)])
        results = await asyncio.wait_for(asyncio.gather(*(read_tokens(s) for s in streams)), 10)
        for i, ((tokens, done), stream) in enumerate(zip(results, streams, strict=True)):
            assert stream.attempts == 2
            assert len(tokens) == 20 and done.usage.completion_tokens == 20
            assert done.usage.prompt_tokens == 3
            # k >= 2 tokens before the loss; the continuation's prompt carries them and
            # it generates the rest (counting from 100 again, as a fresh request here)
            (k,) = [20 - n for p, n in coordinator.plans if p[:3] == [7, 8, i] and n < 20]
            assert k >= 2 and tokens == [*range(100, 100 + k), *range(100, 120 - k)]
            assert ([7, 8, i, *tokens[:k]], 20 - k) in coordinator.plans
        # the replica that failed them aborted their plans: the ingress guessed nothing
        assert sorted(coordinator.aborted) == [1000, 1001, 1002]
        assert coordinator.abandoned == []
        _stop(replica)

    asyncio.run(main())


def test_a_broken_channel_fails_over_to_a_new_one_and_settles_the_old_requests() -> None:
    async def main() -> None:
        coordinator, shards, replica, handle, backend = _setup(break_after=2)
        streams = await _start_all(backend, 30, [[3, i] for i in range(4)])
        results = await asyncio.wait_for(asyncio.gather(*(read_tokens(s) for s in streams)), 10)
        for tokens, done in results:
            assert len(tokens) == 30 and done.usage.completion_tokens == 30
            assert done.usage.prompt_tokens == 2
        assert handle.subscriptions == 2 and all(s.attempts == 2 for s in streams)
        # the first channel's requests were stopped at the replica, not left running; the
        # replica said so (they ran), so their plans end in commits, none abandoned
        assert sorted(shards.stopped) == [1000, 1001, 1002, 1003]
        assert coordinator.abandoned == []
        assert {rid for rid, _ in coordinator.committed} >= {1000, 1001, 1002, 1003}
        assert not replica._orders and not shards.running
        assert len(replica._outboxes) == 1  # the broken channel's outbox is gone
        _stop(replica)

    asyncio.run(main())


def test_a_whole_answer_comes_in_the_message_of_its_end() -> None:
    async def main() -> None:
        _, _, replica, _, backend = _setup()
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        dispatch = await backend.plan(np.asarray([1, 2], np.int32), params, 0.0)
        stream = backend.stream(dispatch, stream=False)
        first = await asyncio.wait_for(stream.__anext__(), 10)
        assert [e.token for e in first] == [100, 101, 102, 103]  # type: ignore[union-attr]
        assert stream.ready()  # its Completed came in the same message
        done = await stream.__anext__()
        assert isinstance(done, Completed) and done.usage.completion_tokens == 4
        _stop(replica)

    asyncio.run(main())


def test_an_idle_channel_closes_and_the_next_request_opens_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No request in flight for `IDLE_CLOSE_S`: the ingress cancels its subscription (so
    the replica holds no open call and Serve can drain it), and the replica drops the
    channel's outbox; the next request subscribes again."""
    monkeypatch.setattr(replica_channel, "IDLE_CLOSE_S", 0.05)

    async def main() -> None:
        _, _, replica, handle, backend = _setup()
        (stream,) = await _start_all(backend, 3, [[1, 2]])
        tokens, _ = await asyncio.wait_for(read_tokens(stream), 10)
        assert tokens == [100, 101, 102]
        (first,) = backend.channels.values()
        for _ in range(100):
            if first.closed and not replica._outboxes:
                break
            await asyncio.sleep(0.01)
        assert first.closed and not backend.channels and not replica._outboxes
        (again,) = await _start_all(backend, 2, [[3, 4]])
        assert (await asyncio.wait_for(read_tokens(again), 10))[0] == [100, 101]
        assert handle.subscriptions == 2 and backend.channels[replica.replica_id] is not first
        _stop(replica)

    asyncio.run(main())


def test_an_idle_stream_ends_at_the_replica_when_its_ingress_never_closes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The backstop for an ingress that died: a channel with nothing in flight for
    `IDLE_END_S` ends on the replica's side (outbox dropped); a live ingress then sees
    its stream end and the next request subscribes again. `RayBackend.close` (the
    ingress stopping) closes every channel."""
    monkeypatch.setattr(replica_channel, "IDLE_CLOSE_S", 60.0)  # the ingress never does
    monkeypatch.setattr(deployment, "IDLE_END_S", 0.05)

    async def main() -> None:
        _, _, replica, handle, backend = _setup()
        (stream,) = await _start_all(backend, 3, [[1, 2]])
        assert (await asyncio.wait_for(read_tokens(stream), 10))[0] == [100, 101, 102]
        (first,) = backend.channels.values()
        for _ in range(100):
            if first.closed:
                break
            await asyncio.sleep(0.01)
        assert first.closed and not replica._outboxes and not backend.channels
        (again,) = await _start_all(backend, 2, [[3, 4]])
        assert (await asyncio.wait_for(read_tokens(again), 10))[0] == [100, 101]
        assert handle.subscriptions == 2
        (second,) = backend.channels.values()
        (waiting,) = await _start_all(backend, 50, [[5, 6]])
        assert isinstance(await asyncio.wait_for(waiting.__anext__(), 10), TokenEvent)
        backend.close()  # the ingress stops with a request in flight: it re-plans
        assert second.closed and not backend.channels
        tokens, done = await asyncio.wait_for(read_tokens(waiting), 10)
        assert len(tokens) == 49 and waiting.attempts == 2 and done.usage.completion_tokens == 50
        _stop(replica)

    asyncio.run(main())
