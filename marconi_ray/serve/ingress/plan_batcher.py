"""`PlanBatcher`: plans and relayed commits that arrive together leave for the coordinator
in one call.

A `Coalescer` with one call in flight: a lone item leaves at the end of the event-loop
turn; items that arrive while a call is out leave together when it returns. A batch of
plans only is one `coordinator.plan_many`; a batch holding commits the replicas relayed
through this ingress (`settings.commit_relay`) is one `coordinator.step_many`, which
applies the commits before the plans. Each caller gets its own `Dispatch` (or whether
its commit was applied) or its own exception back (`plan_many` returns per-request errors
as values, so one bad request never fails the others). Under load this turns N actor
round trips into one, and the coordinator's per-call cost (Ray's task execution, ~0.5 ms
on a small CPU) stops growing with the request rate: a request's plan and its commit
ride in calls that carry others' too. A failure of the call itself (the coordinator
died, Ray's own errors) reaches every caller of that batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress.coalescer import Coalescer
from marconi_ray.serve.messages import Dispatch, RelayedCommit
from marconi_ray.serve.transfer_messages import Staged

PlanArgs = tuple[npt.NDArray[np.int32], SamplingParams, float]
Item = PlanArgs | RelayedCommit
Answer = Dispatch | Staged | bool


class PlanBatcher:
    """Coalesces concurrent `plan` and `commit` calls into `plan_many` / `step_many`."""

    def __init__(self, coordinator: Any, max_in_flight: int = 1) -> None:
        self.coordinator = coordinator
        self._coalescer: Coalescer[Item, Answer] = Coalescer(self._send, max_in_flight)
        self.commits = 0
        """Relayed commits sent."""

    @property
    def calls(self) -> int:
        """Coordinator calls made."""
        return self._coalescer.calls

    @property
    def planned(self) -> int:
        """Plans sent in them."""
        return self._coalescer.items - self.commits

    async def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float
    ) -> Dispatch | Staged:
        """Route and plan one request at the coordinator (see `CacheCoordinator.plan`:
        `Staged` when an entry must move first)."""
        answer = await self._coalescer.submit((prompt, params, submitted))
        assert isinstance(answer, Dispatch | Staged)
        return answer

    async def commit(self, commit: RelayedCommit) -> bool:
        """Send a relayed commit with the next call; whether the coordinator applied it
        (`CacheCoordinator.relayed_commit`). Returns once it was applied or dropped, so a
        caller that answers its client afterwards knows the client's next turn will be
        planned on a tree that holds it."""
        answer = await self._coalescer.submit(commit)
        return bool(answer)

    async def _send(self, batch: list[Item]) -> list[Answer | BaseException]:
        commits = [i for i, item in enumerate(batch) if isinstance(item, RelayedCommit)]
        if not commits:
            planned: list[
                Dispatch | Staged | BaseException
            ] = await self.coordinator.plan_many.remote(batch)
            return list(planned)
        self.commits += len(commits)
        relayed = set(commits)
        plans = [i for i in range(len(batch)) if i not in relayed]
        applied, dispatches = await self.coordinator.step_many.remote(
            [batch[i] for i in commits], [batch[i] for i in plans]
        )
        out: list[Answer | BaseException] = [False] * len(batch)
        for i, a in zip(commits, applied, strict=True):
            out[i] = bool(a)
        for i, d in zip(plans, dispatches, strict=True):
            out[i] = d
        return out
