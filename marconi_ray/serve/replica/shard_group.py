"""A replica's tensor-parallel group behind one interface: `LocalShard` (tp 1: the worker
lives in the replica's own process, no extra hop per step) or `ActorShards` (tp > 1: one
Ray actor per rank, called in lockstep, rank 0's answers used; the per-step `advance`
goes over a Ray Compiled Graph, `StepGraph`, everything else over plain actor calls).

Both run the same `ShardActor` code (set-up binds the device, loads the shard and warms
the kernels up; `advance` is the one call per step). The local shard runs its calls in a
worker thread (`asyncio.to_thread`; torch releases the GIL while it computes), one at a
time, so the replica's event loop keeps streaming and heartbeating during a step.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, Protocol

import ray
from ray.exceptions import RayActorError

from marconi_ray.protocol.orders import StepInput, StepOutput
from marconi_ray.serve.replica.shard import ShardActor
from marconi_ray.serve.replica.step_graph import ShardLost, StepGraph
from marconi_ray.serve.settings import NAMESPACE, ServeSettings


def compiled_steps(settings: ServeSettings) -> bool:
    """Does a tp > 1 group of `settings` step over a compiled graph (`step_graph`)?"""
    if settings.step_graph not in ("auto", "compiled", "plain"):
        raise ValueError(f"step_graph must be auto, compiled or plain, got {settings.step_graph!r}")
    return settings.step_graph == "compiled" or (
        settings.step_graph == "auto" and settings.device == "cuda"
    )


SHARD_PING_S: Final = 30.0
"""How long every shard gets to answer before the TP group is declared broken."""


class ShardGroup(Protocol):
    """What a replica needs of its model shards."""

    info: dict[str, Any]
    names: list[str]

    async def advance(self, step: StepInput) -> StepOutput: ...

    async def call(self, method: str, *args: Any) -> Any:
        """`ShardActor.method(*args)` on every rank, in the same order; rank 0's result."""
        ...

    async def rank0(self, method: str, *args: Any) -> Any:
        """`ShardActor.method(*args)` on rank 0 only (views: holdings, store stats)."""
        ...

    async def alive(self) -> bool: ...

    def kill(self) -> None: ...


def _setup_args(settings: ServeSettings, address: str) -> tuple[Any, ...]:
    s = settings
    return (
        s.model_dir,
        address,
        s.dtype,
        s.device,
        s.max_batch,
        s.kernels,
        s.max_batch_tokens,
        s.hub_model,
        s.host_cache_bytes,
        s.max_running_tokens,
        s.kv_memory,
        s.cache_bytes,
        s.cuda_graphs,
        s.speculative,
    )


class LocalShard:
    """tp 1: the shard in this process."""

    def __init__(self, settings: ServeSettings) -> None:
        self.shard = ShardActor(0, 1)
        self.info: dict[str, Any] = self.shard.setup(*_setup_args(settings, ""))
        self.names: list[str] = []
        self._lock = asyncio.Lock()

    async def advance(self, step: StepInput) -> StepOutput:
        out: StepOutput = await self.call("advance", step)
        return out

    async def call(self, method: str, *args: Any) -> Any:
        async with self._lock:
            return await asyncio.to_thread(getattr(self.shard, method), *args)

    async def rank0(self, method: str, *args: Any) -> Any:
        return await self.call(method, *args)

    async def alive(self) -> bool:
        return True

    def kill(self) -> None:
        self.shard.shutdown()


class ActorShards:
    """tp > 1: named `ShardActor`s in the replica's placement group, one GPU (or CPU) each.

    The constructor creates them; `ready` (from an event loop, which it never blocks) or
    `wait` (from a constructor) runs their set-up and returns the group.

    `advance` fans the step out over a compiled graph (`StepGraph`: compiled on the first
    `advance`, which must then always come from the same event loop), or over plain actor
    calls with `compiled=False` (the old path, kept to measure against). When a shard
    dies, `advance` raises a `RayActorError` (a step that fails while a shard is dead
    does too) and `alive` is False from then on; `kill` tears the graph down (bounded by
    `step_graph.TEARDOWN_S`) and kills the actors; the graph never runs after it."""

    def __init__(self, settings: ServeSettings, names: list[str], compiled: bool = True) -> None:
        gpu = 1 if settings.device == "cuda" else 0
        actor = ray.remote(num_cpus=1, num_gpus=gpu, max_restarts=0)(ShardActor)
        self.settings = settings
        self.names = names
        self.actors: list[Any] = [
            actor.options(name=name, namespace=NAMESPACE).remote(rank, len(names))
            for rank, name in enumerate(names)
        ]
        self.info: dict[str, Any] = {}
        self.graph: StepGraph | None = StepGraph(self.actors) if compiled else None

    def _setup(self, address: str) -> list[Any]:
        return [a.setup.remote(*_setup_args(self.settings, address)) for a in self.actors]

    async def ready(self) -> ActorShards:
        address = await self.actors[0].address.remote()
        infos = await asyncio.gather(*self._setup(address))
        self.info = infos[0]
        return self

    def wait(self) -> ActorShards:
        address = ray.get(self.actors[0].address.remote())
        self.info = ray.get(self._setup(address))[0]
        return self

    async def advance(self, step: StepInput) -> StepOutput:
        try:
            if self.graph is not None:
                return await self.graph.advance(step)
            out: StepOutput = await self.call("advance", step)
            return out
        except RayActorError:
            raise
        except Exception as exc:  # a rank failed: on its own, or because a peer died?
            if await self.alive():
                raise
            raise ShardLost(f"a shard died during a step: {exc}") from exc

    async def call(self, method: str, *args: Any) -> Any:
        results = await asyncio.gather(*(getattr(a, method).remote(*args) for a in self.actors))
        return results[0]

    async def rank0(self, method: str, *args: Any) -> Any:
        return await getattr(self.actors[0], method).remote(*args)

    async def alive(self) -> bool:
        """Is the step graph intact, and does every shard answer within `SHARD_PING_S`?"""
        if self.graph is not None and self.graph.broken:
            return False
        try:
            await asyncio.wait_for(
                asyncio.gather(*(a.store_stats.remote() for a in self.actors)), SHARD_PING_S
            )
        except (RayActorError, TimeoutError):
            return False
        return True

    def kill(self) -> None:
        if self.graph is not None:
            self.graph.teardown()
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
