"""Plans that arrive together go to the coordinator in one `plan_many` call; each caller
gets its own dispatch or its own error. The coordinator is the real `CacheCoordinator`
(in process, behind a `.remote()` shim); every Ray test of the service goes through the
batcher over the real actor."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import MemoryJournal
from marconi_ray.serve.ingress.plan_batcher import PlanBatcher
from marconi_ray.serve.messages import Dispatch, NoReplicaAvailable
from marconi_ray.serve.settings import ServeSettings

GREEDY = SamplingParams(max_tokens=4, temperature=0.0)


class _Remote:
    """`actor.method.remote(*args)` -> an awaitable, over an in-process object."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.target, name)
        calls = self.calls

        class _M:
            @staticmethod
            async def remote(*args: Any) -> Any:
                calls.append(name)
                await asyncio.sleep(0)
                return method(*args)

        return _M


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("batcher") / "tiny")


def _coordinator(model_dir: Path) -> CacheCoordinator:
    settings = ServeSettings(model_dir=str(model_dir), model_name="tiny", cache_bytes=3_000_000)
    coord = CacheCoordinator(settings, MemoryJournal())
    coord.register_replica("r0", 64, 4096)
    return coord


def test_concurrent_plans_share_one_call_and_keep_their_own_results(model_dir: Path) -> None:
    coord = _coordinator(model_dir)
    remote = _Remote(coord)
    batcher = PlanBatcher(remote)
    prompts = [np.arange(3, 20 + i, dtype=np.int32) for i in range(6)]
    bad = np.asarray([], dtype=np.int32)  # planning an empty prompt is a ValueError

    async def main() -> list[Any]:
        calls = [batcher.plan(p, GREEDY, 0.0) for p in prompts]
        calls.insert(3, batcher.plan(bad, GREEDY, 0.0))
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(main())
    assert remote.calls == ["plan_many"] and (batcher.calls, batcher.planned) == (1, 7)
    assert isinstance(results[3], ValueError)
    dispatches = [r for i, r in enumerate(results) if i != 3]
    assert all(isinstance(d, Dispatch) for d in dispatches)
    assert [len(d.order.prompt) for d in dispatches] == [len(p) for p in prompts]
    assert len({d.order.request_id for d in dispatches}) == len(prompts)
    assert coord.check_invariants() >= 0 and len(coord.leases) == len(prompts)


def test_a_lone_plan_and_a_failed_call(model_dir: Path) -> None:
    coord = _coordinator(model_dir)
    remote = _Remote(coord)
    batcher = PlanBatcher(remote)
    d = asyncio.run(batcher.plan(np.arange(3, 30, dtype=np.int32), GREEDY, 0.0))
    assert isinstance(d, Dispatch) and remote.calls == ["plan_many"]
    coord.unregister_replica("r0")
    with pytest.raises(NoReplicaAvailable):
        asyncio.run(batcher.plan(np.arange(3, 30, dtype=np.int32), GREEDY, 0.0))

    class Broken:
        class plan_many:  # mimics an actor method
            @staticmethod
            async def remote(*args: Any) -> Any:
                raise ConnectionError("coordinator gone")

    async def both() -> list[Any]:
        b = PlanBatcher(Broken())
        p = np.arange(3, 9, dtype=np.int32)
        return await asyncio.gather(
            b.plan(p, GREEDY, 0.0), b.plan(p, GREEDY, 0.0), return_exceptions=True
        )

    assert all(isinstance(r, ConnectionError) for r in asyncio.run(both()))
