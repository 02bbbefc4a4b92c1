"""`RayBackend`: the ingress's `Backend` over the coordinator actor and the replica
deployment (pinned routing)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from ray.exceptions import RayTaskError
from ray.serve.handle import DeploymentHandle

from marconi_ray.engine.orders import TokenEvent
from marconi_ray.engine.sampling import SamplingParams
from marconi_ray.serve.generation import EventStream
from marconi_ray.serve.messages import Completed, Dispatch, MisroutedDispatch, ReplicaStats


class ReplicaUnavailable(RuntimeError):
    """The replica a request was planned on could not take it (HTTP 503)."""


class GuardedStream:
    """A replica's event stream. If the replica refuses the dispatch (it was planned for
    a replica that is gone), the plan is abandoned at the coordinator, so no lock,
    reservation or state is left behind, and the request fails as unavailable."""

    def __init__(self, stream: Any, coordinator: Any, dispatch: Dispatch) -> None:
        self._stream = stream
        self._coordinator = coordinator
        self._dispatch = dispatch
        self._first = True

    def __aiter__(self) -> GuardedStream:
        return self

    async def __anext__(self) -> TokenEvent | Completed:
        try:
            event: TokenEvent | Completed = await self._stream.__anext__()
        except RayTaskError as exc:
            if self._first and isinstance(exc.cause, MisroutedDispatch):
                await self._coordinator.abandon.remote(self._dispatch)
                raise ReplicaUnavailable(str(exc.cause)) from None
            raise
        self._first = False
        return event

    def cancel(self) -> None:
        self._stream.cancel()


class RayBackend:
    """`Backend` over the coordinator actor and the replica deployment."""

    def __init__(self, coordinator: Any, replicas: DeploymentHandle[Any]) -> None:
        self.coordinator = coordinator
        self.replicas = replicas

    async def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float
    ) -> Dispatch:
        """Route and plan; a ValueError raised by the coordinator is re-raised as such."""
        try:
            dispatch: Dispatch = await self.coordinator.plan.remote(prompt, params, submitted)
        except RayTaskError as exc:
            if isinstance(exc.cause, ValueError):
                raise ValueError(str(exc.cause)) from None
            raise
        return dispatch

    def generate(self, dispatch: Dispatch) -> EventStream:
        stream = self.replicas.options(stream=True).generate.remote(dispatch)
        return GuardedStream(stream, self.coordinator, dispatch)

    async def stats(self) -> list[ReplicaStats]:
        return list(await self.coordinator.stats.remote())

    async def tuner_runs(self) -> int:
        return int(await self.coordinator.tuner_runs.remote())
