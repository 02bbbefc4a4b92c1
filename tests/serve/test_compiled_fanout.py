"""The per-step fan-out of a TP group over a Ray Compiled Graph (`StepGraph`), with real
Ray: tp 2 `ActorShards` on the tiny model give the same step outputs over the graph as
over plain actor calls (a 20k-token prompt and a >1 MB step included); a shard killed
mid-step surfaces as a `RayActorError` and `kill` returns promptly. Echo actors (no model)
check what the model cannot make cheaply: multi-megabyte outputs, arrays kept past the
graph's channel buffers, a rank's own error, and a teardown bounded while a live shard is
stuck in a step. Last, `ShardActor`'s lock (no Ray)."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from ray import cloudpickle
from ray.exceptions import RayActorError, RayTaskError
from serve_helpers import local_ray

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.orders import Finished, PrefillOrder, StepInput, StepOutput
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.replica.shard import ShardActor
from marconi_ray.serve.replica.shard_group import ActorShards
from marconi_ray.serve.replica.step_graph import TEARDOWN_S, ShardLost, StepGraph
from marconi_ray.serve.settings import ServeSettings

pytestmark = [pytest.mark.ray, pytest.mark.slow]

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
LONG = 20_000  # tokens of the long prompt
HUGE = 32_768  # tokens of each prompt of the >1 MB step
T0 = Timings(0.0, 0.0, 0.0, 0.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("fanout") / "tiny")


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    # the echo shard is defined here, and Ray workers cannot import test modules
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    with local_ray():
        yield


def _groups(model_dir: Path, tag: str, **kw: Any) -> tuple[ActorShards, ActorShards]:
    settings = ServeSettings(str(model_dir), "tiny", tp=2, max_batch=4, **kw)
    compiled = ActorShards(settings, [f"{tag}-graph-{r}" for r in range(2)])
    plain = ActorShards(settings, [f"{tag}-plain-{r}" for r in range(2)], compiled=False)
    return compiled, plain


def _order(rid: int, prompt: np.ndarray, max_new: int, **kw: Any) -> PrefillOrder:
    return PrefillOrder(rid, prompt.astype(np.int32), GREEDY, max_new, **kw)


def _steps(rng: np.random.Generator) -> list[StepInput]:
    """Two requests, a third joining, one stopped early, all run out; then a 20k-token
    prompt, stopped after three chunks of its prefill (so cancelled); then one step over
    1 MB (ten 32k-token prompts whose hit is inconsistent: every start fails, reported)."""

    def prompt(n: int) -> np.ndarray:
        return rng.integers(3, 500, n)

    steps = [StepInput(start=(_order(1, prompt(30), 6), _order(2, prompt(45), 12)))]
    steps += [StepInput(), StepInput(start=(_order(3, prompt(20), 4, checkpoints=(10,)),))]
    steps += [StepInput(), StepInput(stop=(2,))] + [StepInput()] * 5
    steps += [StepInput(start=(_order(4, prompt(LONG), 3),))] + [StepInput()] * 3
    steps += [StepInput(stop=(4,)), StepInput()]
    bad = tuple(_order(10 + i, prompt(HUGE), 1, hit_len=8) for i in range(10))
    return [*steps, StepInput(start=bad)]


def _plain(out: StepOutput) -> tuple[Any, ...]:
    """A step output without its wall-clock timings, comparable with `==`."""
    done = tuple(
        (f.request_id, f.tokens, f.finish_reason, f.state_ids, f.kv_slots.tolist())
        for f in out.finished
    )
    return out.events, done, out.failed, out.cancelled


def test_compiled_and_plain_fanout_give_identical_steps(ray_session, model_dir):
    """The same StepInputs through a compiled graph and through plain calls: every
    StepOutput equal, the requests ran as ordered, and the stores hold the same bytes."""

    async def main() -> tuple[list[list[Any]], list[Any]]:
        groups = _groups(model_dir, "same")
        try:
            await asyncio.gather(*(g.ready() for g in groups))
            steps = _steps(np.random.default_rng(5))

            async def run(group: ActorShards) -> list[Any]:
                return [_plain(await asyncio.wait_for(group.advance(s), 30)) for s in steps]

            outs = list(await asyncio.gather(*(run(g) for g in groups)))
            stats = [await g.rank0("store_stats") for g in groups]
            return outs, stats
        finally:
            for g in groups:
                g.kill()

    (graph, plain), stats = asyncio.run(main())
    assert graph == plain
    assert stats[0] == stats[1] and stats[0]["running"] == 0
    events = [e for out in graph for e in out[0]]
    tokens: dict[int, list[int]] = {}
    for e in events:
        tokens.setdefault(e.request_id, []).append(e.token)
    # request 2: its first token and one decode in step 0, one in each of steps 1-3
    assert {rid: len(t) for rid, t in tokens.items()} == {1: 6, 2: 5, 3: 4}
    finished = {f[0]: f[2] for out in graph for f in out[1]}
    assert finished == {1: "length", 2: "stop", 3: "length"}
    assert [rid for out in graph for rid in out[3]] == [4]
    failed = graph[-1][2]
    assert [rid for rid, _ in failed] == list(range(10, 20))
    assert all("8 tokens" in message for _, message in failed), failed[0]


def test_shard_killed_mid_step_raises_actor_error_and_kill_is_prompt(ray_session, model_dir):
    """Kill rank 1 while a 20k-token prefill step runs: `advance` raises a RayActorError
    (compiled graph and plain calls alike), `alive` is False, `kill` returns within the
    teardown bound, and an `advance` after it fails at once."""

    async def kill_mid_step(group: ActorShards) -> dict[str, Any]:
        await group.advance(StepInput())
        long = StepInput(start=(_order(1, np.arange(LONG) % 400 + 3, 2),))
        step = asyncio.ensure_future(group.advance(long))
        await asyncio.sleep(0.3)
        ray.kill(group.actors[1])
        killed = time.monotonic()
        with pytest.raises(RayActorError):
            await asyncio.wait_for(step, 30)
            # the step beat the kill: the next ones must fail
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await group.advance(StepInput())
                await asyncio.sleep(0.05)
        raised_s = time.monotonic() - killed
        alive = await group.alive()
        t0 = time.monotonic()
        group.kill()
        kill_s = time.monotonic() - t0
        t0 = time.monotonic()
        with pytest.raises(RayActorError):
            await asyncio.wait_for(group.advance(StepInput()), 30)
        after_s = time.monotonic() - t0
        return {"raised_s": raised_s, "alive": alive, "kill_s": kill_s, "after_s": after_s}

    async def main() -> list[dict[str, Any]]:
        groups = _groups(model_dir, "kill", max_batch_tokens=LONG)  # one 2 s prefill
        try:
            await asyncio.gather(*(g.ready() for g in groups))
            return [await kill_mid_step(g) for g in groups]
        finally:
            for g in groups:
                g.kill()

    for result in asyncio.run(main()):
        assert result["raised_s"] < 15, result
        assert result["alive"] is False
        assert result["kill_s"] < TEARDOWN_S + 1.0, result
        assert result["after_s"] < 5, result


# ---------------------------------------------------------------------- echo shards
class EchoShard:
    """A stand-in shard (`advance_packed`, like `ShardActor`): it keeps every order it is
    started with, as a worker keeps its running requests, and finishes each at once with
    its prompt as the KV slot ids. `step.stop == (s,)` sleeps s seconds first;
    `step.cancel == (-1,)` makes rank 1 raise ValueError. `calls` counts the steps run."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.calls = 0
        self.kept: list[PrefillOrder] = []

    def advance_packed(self, step: bytes) -> bytes:
        return pickle.dumps(self.advance(pickle.loads(step)))

    def advance(self, step: StepInput) -> StepOutput:
        self.calls += 1
        if step.stop:
            time.sleep(step.stop[0])
        if step.cancel == (-1,) and self.rank == 1:
            raise ValueError("rank 1 refuses this step")
        self.kept += step.start
        finished = tuple(
            Finished(o.request_id, (), "length", {}, o.prompt.astype(np.int64), T0)
            for o in step.start
        )
        return StepOutput(finished=finished)

    def count(self) -> int:
        return self.calls


def _echoes() -> list[Any]:
    actor = ray.remote(num_cpus=0, max_restarts=0)(EchoShard)
    return [actor.remote(rank) for rank in range(2)]


def test_step_graph_carries_megabytes_keeps_running_and_survives_a_rank_error(ray_session):
    """A 1.3 MB step (ten 32k-token prompts) answered with 2.6 MB (channels grow past their
    1 MB start); 25 steps while both ends keep every array a step carried (more than the
    graph's 10 channel buffers); a rank's own exception is raised as itself, and the
    graph runs on."""
    actors = _echoes()
    graph = StepGraph(actors)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(3, 500, HUGE).astype(np.int32) for _ in range(10)]

    async def step(start: tuple[PrefillOrder, ...] = (), **kw: Any) -> StepOutput:
        return await asyncio.wait_for(graph.advance(StepInput(start=start, **kw)), 20)

    async def main() -> dict[str, Any]:
        big = await step(tuple(_order(i, p, 1) for i, p in enumerate(prompts)))
        kept = [await step((_order(100 + i, prompts[i % 10][: 50 + i], 1),)) for i in range(25)]
        error: BaseException | None = None
        try:
            await step(cancel=(-1,))
        except Exception as exc:
            error = exc
        after = await step((_order(7, prompts[7], 1),))
        return {"big": big, "kept": kept, "error": error, "after": after, "broken": graph.broken}

    try:
        result = asyncio.run(main())
    finally:
        graph.teardown()
    kept = ray.get([a.count.remote() for a in actors])
    for actor in actors:
        ray.kill(actor)
    assert [f.kv_slots.tolist() for f in result["big"].finished] == [p.tolist() for p in prompts]
    for i, out in enumerate(result["kept"]):
        assert out.finished[0].kv_slots.tolist() == prompts[i % 10][: 50 + i].tolist()
    error = result["error"]
    assert isinstance(error, ValueError) and isinstance(error, RayTaskError), error
    assert "rank 1 refuses" in str(error)
    assert result["after"].finished[0].kv_slots.tolist() == prompts[7].tolist()
    assert not result["broken"] and graph.broken  # it ran on, until torn down
    assert kept == [28, 28]


def test_step_graph_teardown_is_bounded_with_a_stuck_shard(ray_session):
    """Rank 1 dies while rank 0 is stuck in a 60 s step: the step raises ShardLost within
    seconds, `teardown` returns within its bound, and the graph never runs again."""
    actors = _echoes()
    graph = StepGraph(actors)

    async def main() -> dict[str, Any]:
        await graph.advance(StepInput())
        step = asyncio.ensure_future(graph.advance(StepInput(stop=(60.0,))))
        await asyncio.sleep(0.5)
        ray.kill(actors[1])
        killed = time.monotonic()
        with pytest.raises(ShardLost):
            await asyncio.wait_for(step, 30)
        raised_s = time.monotonic() - killed
        t0 = time.monotonic()
        graph.teardown()
        teardown_s = time.monotonic() - t0
        calls = await actors[0].count.remote()
        with pytest.raises(ShardLost):
            await graph.advance(StepInput())
        return {
            "raised_s": raised_s,
            "teardown_s": teardown_s,
            "calls": calls,
            "calls_after": await actors[0].count.remote(),
        }

    try:
        result = asyncio.run(main())
    finally:
        graph.teardown()
        for actor in actors:
            ray.kill(actor)
    assert result["raised_s"] < 10, result
    assert result["teardown_s"] < TEARDOWN_S + 1.0, result
    assert result["calls"] == result["calls_after"] == 2, result
    assert graph.broken


@pytest.mark.parametrize(
    ("method", "args"),
    [
        ("advance", (StepInput(),)),
        ("advance_packed", (pickle.dumps(StepInput()),)),
        ("release", (StepInput().release,)),
        ("stop", (1,)),
        ("cancel", (1,)),
        ("holdings", ()),
        ("store_stats", ()),
        ("tier_stats", ()),
        ("shutdown", ()),
    ],
)
def test_shard_methods_wait_for_the_shard_lock(method: str, args: tuple[Any, ...]) -> None:
    """Each worker-touching `ShardActor` method waits while another thread holds the lock
    (a compiled-graph step and a plain call never interleave), then runs."""
    shard = ShardActor(0, 1)  # no set-up: the worker's methods raise once they run
    done = threading.Event()

    def call() -> None:
        with contextlib.suppress(RuntimeError):
            getattr(shard, method)(*args)
        done.set()

    with shard.lock:
        thread = threading.Thread(target=call, daemon=True)
        thread.start()
        assert not done.wait(0.2), f"{method} ran while the lock was held"
    assert done.wait(5), f"{method} did not run once the lock was free"


def test_step_graph_setting_picks_the_fanout() -> None:
    from marconi_ray.serve.replica.shard_group import compiled_steps

    def pick(step_graph: str, device: str) -> bool:
        s = ServeSettings(model_dir="u", model_name="t", device=device, step_graph=step_graph)
        return compiled_steps(s)

    assert pick("auto", "cuda") and not pick("auto", "cpu")  # busy-waiting costs a CPU box
    assert pick("compiled", "cpu") and not pick("plain", "cuda")
    with pytest.raises(ValueError, match="step_graph must be auto, compiled or plain, got 'x'"):
        pick("x", "cpu")
