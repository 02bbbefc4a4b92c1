"""`GuardedStream` (no Ray cluster): a replica lost with its node (an actor error, Serve's
replica-unavailable error, a dead node) mid-stream makes the request continue on another
dispatch with the tokens streamed so far, the old dispatch is settled at its replica
(never abandoned on a guess), and the coordinator is told so it drops the silent
replica; after `MAX_ATTEMPTS` dispatches the request fails with `ReplicaUnavailable`."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError, NodeDiedError, RayTaskError
from ray.serve.exceptions import ReplicaUnavailableError
from serve_helpers import read_tokens

from marconi_ray.protocol.orders import PrefillOrder, TokenEvent
from marconi_ray.protocol.results import Timings, Usage
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress import ray_backend
from marconi_ray.serve.ingress.ray_backend import GuardedStream, ReplicaUnavailable
from marconi_ray.serve.messages import Completed, Dispatch

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
LOST = [
    ActorUnavailableError("connection refused", b"\x00" * 16),
    ActorDiedError(),
    NodeDiedError("node gone"),
    ReplicaUnavailableError("replica gone"),
]


class Method:
    def __init__(self, calls: list[tuple[str, Any]], name: str, result: Any = None) -> None:
        self.calls, self.name, self.result = calls, name, result

    async def remote(self, arg: Any) -> Any:
        self.calls.append((self.name, arg))
        return self.result


class Coordinator:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.abandon = Method(self.calls, "abandon")
        self.report_unreachable = Method(self.calls, "report_unreachable", True)


class Stream:
    """Yields `tokens` (one list per step) then raises `error` or completes."""

    def __init__(self, rid: int, tokens: list[int], error: BaseException | None) -> None:
        self.rid, self.tokens, self.error = rid, list(tokens), error

    async def __anext__(self) -> list[TokenEvent] | Completed:
        if self.tokens:
            return [TokenEvent(self.rid, self.tokens.pop(0), False)]
        if self.error is not None:
            raise self.error
        return Completed(self.rid, "length", Usage(0, 0, 0), Timings(0.0, 0.0, 0.0, 0.0))

    def cancel(self) -> None:
        pass


def _dispatch(
    replica: str, prompt: np.ndarray, max_new: int, params: SamplingParams = PARAMS
) -> Dispatch:
    order = PrefillOrder(7, np.asarray(prompt, np.int32), params, max_new)
    return Dispatch(replica, order)


class Backend:
    """Replica `a` fails with `error` after two tokens; re-plans go to `b` (or fail
    again with `error` when `b_fails`)."""

    def __init__(self, error: BaseException, b_fails: bool = False) -> None:
        self.coordinator = Coordinator()
        self.error, self.b_fails = error, b_fails
        self.plans: list[tuple[np.ndarray, int]] = []
        self.params: list[SamplingParams] = []

    async def plan(self, prompt: np.ndarray, params: SamplingParams, _: float) -> Dispatch:
        self.plans.append((prompt, params.max_tokens))
        self.params.append(params)
        return _dispatch("b", prompt, params.max_tokens)

    async def plan_shielded(
        self, prompt: np.ndarray, params: SamplingParams, _: float, whole: bool = False
    ) -> Dispatch:
        assert whole  # a re-plan runs the rest where it is planned (no P/D hand-off)
        return await self.plan(prompt, params, _)

    async def settle_failed(self, dispatch: Dispatch, cause: BaseException) -> None:
        self.coordinator.calls.append(("settle", dispatch))

    def coordinator_of(self, dispatch: Dispatch) -> Coordinator:
        return self.coordinator

    def stream(self, dispatch: Dispatch, _: bool = True) -> Stream:
        if self.b_fails:
            return Stream(7, [], self.error)
        return Stream(7, [30, 40][: dispatch.order.max_new], None)


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray_backend, "RETRY_BACKOFF_S", 0.0)


@pytest.mark.parametrize("error", LOST, ids=lambda e: type(e).__name__)
def test_a_lost_replica_mid_stream_continues_elsewhere(error: BaseException) -> None:
    backend = Backend(error)
    first = _dispatch("a", np.arange(5), 4)
    guarded = GuardedStream(Stream(7, [10, 20], error), backend, first)  # type: ignore[arg-type]
    tokens, done = asyncio.run(read_tokens(guarded))
    assert tokens == [10, 20, 30, 40] and guarded.attempts == 2
    ((prompt, max_new),) = backend.plans
    assert prompt.tolist() == [0, 1, 2, 3, 4, 10, 20] and max_new == 2  # the continuation
    assert done.usage.prompt_tokens == 5 and done.usage.completion_tokens == 4
    # the replica may be alive and may have started it: its word is asked, no guess made
    assert ("settle", first) in backend.coordinator.calls
    assert ("abandon", first) not in backend.coordinator.calls
    assert ("report_unreachable", "a") in backend.coordinator.calls


def test_a_lost_replica_inside_a_task_error_is_replanned_too() -> None:
    error = RayTaskError("generate", "traceback", ActorDiedError())
    backend = Backend(error)
    guarded = GuardedStream(Stream(7, [10], error), backend, _dispatch("a", np.arange(3), 3))  # type: ignore[arg-type]
    tokens, _ = asyncio.run(read_tokens(guarded))
    assert tokens == [10, 30, 40]


def test_every_dispatch_lost_ends_in_replica_unavailable() -> None:
    error = ActorUnavailableError("connection refused", b"\x00" * 16)
    backend = Backend(error, b_fails=True)
    guarded = GuardedStream(Stream(7, [], error), backend, _dispatch("a", np.arange(3), 3))  # type: ignore[arg-type]
    with pytest.raises(ReplicaUnavailable, match="connection refused"):
        asyncio.run(read_tokens(guarded))
    assert guarded.attempts == ray_backend.MAX_ATTEMPTS


@pytest.mark.parametrize("streamed", [0, 1])
def test_a_replan_scores_the_prompt_again_only_if_no_token_came(streamed: int) -> None:
    """The prompt's log-probabilities ride on the first token: a re-plan after it has no
    prompt to score (its prompt is the original plus the tokens so far), one before it
    asks again."""
    error = ActorDiedError()
    backend = Backend(error)
    echo = SamplingParams(max_tokens=4, temperature=0.0, prompt_logprobs=2, logprobs=1)
    first = _dispatch("a", np.arange(3), 4, echo)
    guarded = GuardedStream(Stream(7, [10][:streamed], error), backend, first)  # type: ignore[arg-type]
    asyncio.run(read_tokens(guarded))
    (params,) = backend.params
    assert params.logprobs == 1
    assert params.prompt_logprobs == (None if streamed else 2)
