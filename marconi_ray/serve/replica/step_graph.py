"""`StepGraph`: a TP group's per-step fan-out over a Ray Compiled Graph.

One `advance` writes the `StepInput` once into a shared-memory channel that every shard
reads (`ShardActor.advance_packed`), and reads every shard's `StepOutput` back from its
own channel: no task submission per step. Only pickled bytes cross (no tensors: the
shards' all-reduces run on their own process group), so the channels are shared memory
only; Ray resizes a channel when a message outgrows it (a 32k-token prompt, a release).

Ray 2.60 facts this relies on (checked against `ray/dag/compiled_dag_node.py`):

- An asyncio graph (`enable_asyncio=True`) starts its channel reader and writer as tasks
  of the loop that compiles it and must be executed from that loop only.
- A shard's graph tasks run on its `_ray_system` thread, its other calls on its main
  thread (hence `ShardActor`'s lock).
- A channel deserializes numpy arrays zero-copy, and a buffer a reader still references
  is never written again: a shard keeping a step's prompt array stalls the graph for
  good `max_inflight_executions` (10) steps later, with no error and no timeout. So
  steps and outputs cross as pickled bytes, which Ray copies out of the channel.
- When a shard dies, what the execution raises is not a `RayActorError`: a
  `RuntimeError('DAG execution cancelled')` once Ray's monitor tore the graph down, a
  `TypeError` wrapping a `RayChannelError` mid-step, and an execution whose input write
  or output read was cut short by the teardown may never complete at all. So every
  execution races a watch on the shards' graph loops (`CompiledDAG.worker_task_refs`, the
  `do_exec_tasks` task of each actor: it ends only when its actor dies or the graph is
  torn down), and every failure but a rank's own exception becomes `ShardLost`.
- `CompiledDAG.teardown` blocks (up to 30 s per shard by default) while a live shard is
  still in a step; `teardown` here bounds it to `TEARDOWN_S`.
- A live graph's channel readers busy-wait: about one CPU core in all (the replica's
  reader thread, or the shards) even while no step runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import threading
from typing import Any, Final

from ray.dag import InputNode, MultiOutputNode
from ray.exceptions import RayActorError, RayTaskError

from marconi_ray.protocol.orders import StepInput, StepOutput

TEARDOWN_S: Final = 2.0
"""How long `teardown` waits for the graph's own teardown before leaving it to finish in
the background (the caller kills the shard actors next, which ends it)."""


class ShardLost(RayActorError):
    """A shard of the TP group died, or its step graph broke (a channel closed, the graph
    was torn down). A `RayActorError`, so the replica checks its shards and rebuilds."""

    def __init__(self, message: str) -> None:
        super().__init__(error_msg=message)


class StepGraph:
    """`advance` on every shard as one compiled-graph execution; rank 0's answer. The
    actors need `advance_packed` (pickled `StepInput` in, pickled `StepOutput` out).

    Contract:
        - Compiled on the first `advance`, in the running event loop (which that blocks
          for about 0.2 s, once); every `advance` must come from that loop (a
          RuntimeError otherwise), one at a time.
        - A rank's own exception (`RayTaskError`, as an instance of its cause too) is
          raised as is: the graph keeps running, as a plain call would.
        - Any other failure breaks the graph for good: that `advance` and every later one
          raise `ShardLost`, and `broken` is True. A broken graph is never
          executed again; `teardown` it (the group's `kill` does).
        - `teardown` is idempotent, never blocks more than about `TEARDOWN_S`, and
          leaves the graph broken.
    """

    def __init__(self, actors: list[Any]) -> None:
        self.actors = actors
        self._graph: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: asyncio.Future[Any] | None = None
        self._loop_ends: list[asyncio.Future[Any]] = []
        self._broken: str = ""

    @property
    def broken(self) -> bool:
        return bool(self._broken)

    async def advance(self, step: StepInput) -> StepOutput:
        graph, watch = self._ready()
        run = asyncio.ensure_future(self._execute(graph, step))
        try:
            await asyncio.wait((run, watch), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not run.done():
                run.cancel()
        if watch.done():
            raise self._break(f"a shard's graph loop ended: {self._loop_end()}")
        try:
            out: StepOutput = run.result()
        except RayTaskError:
            raise
        except Exception as exc:
            raise self._break(f"step graph failed: {type(exc).__name__}: {exc}") from exc
        return out

    def teardown(self) -> None:
        """Stop the graph (its shards' loops exit; waits at most `TEARDOWN_S`)."""
        self._broken = self._broken or "the step graph was torn down"
        graph, self._graph = self._graph, None
        self._stop_watch()
        if graph is None:
            return
        thread = threading.Thread(target=graph.teardown, name="step-graph-teardown", daemon=True)
        thread.start()
        thread.join(TEARDOWN_S)

    # ------------------------------------------------------------------ internals
    def _ready(self) -> tuple[Any, asyncio.Future[Any]]:
        if self._broken:
            raise ShardLost(self._broken)
        loop = asyncio.get_running_loop()
        if self._graph is None:
            try:
                self._compile(loop)
            except Exception as exc:
                raise self._break(f"compiling the step graph failed: {exc}") from exc
        elif loop is not self._loop:
            raise RuntimeError("a step graph runs in the event loop that compiled it")
        assert self._watch is not None
        return self._graph, self._watch

    def _compile(self, loop: asyncio.AbstractEventLoop) -> None:
        with InputNode() as step:
            dag = MultiOutputNode([actor.advance_packed.bind(step) for actor in self.actors])
        self._graph = dag.experimental_compile(enable_asyncio=True)
        self._loop = loop
        refs = getattr(self._graph, "worker_task_refs", {})
        self._loop_ends = [asyncio.wrap_future(ref.future()) for ref in refs.values()]
        if self._loop_ends:
            self._watch = asyncio.ensure_future(
                asyncio.wait(self._loop_ends, return_when=asyncio.FIRST_COMPLETED)
            )
        else:  # no way to watch this Ray's graph loops: failures surface as errors only
            self._watch = loop.create_future()

    @staticmethod
    async def _execute(graph: Any, step: StepInput) -> StepOutput:
        futures = await graph.execute_async(pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL))
        outputs = [await future for future in futures]
        out: StepOutput = pickle.loads(outputs[0])
        return out

    def _stop_watch(self) -> None:
        """Cancel the watch's futures in their loop (thread-safe; none once it closed)."""
        futures = [f for f in (self._watch, *self._loop_ends) if f is not None]
        self._watch, self._loop_ends = None, []
        loop = self._loop
        if not futures or loop is None or loop.is_closed():
            return

        def cancel() -> None:
            for future in futures:
                future.cancel()

        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            cancel()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(cancel)

    def _loop_end(self) -> str:
        for end in self._loop_ends:
            if end.done() and not end.cancelled():
                exc = end.exception()
                return f"{type(exc).__name__}: {exc}" if exc else "it exited"
        return "unknown"

    def _break(self, why: str) -> ShardLost:
        self._broken = self._broken or why
        return ShardLost(why)
