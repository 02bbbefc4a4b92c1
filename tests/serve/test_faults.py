"""Faults with real Ray and a real `redis-server`: the coordinator actor killed between
two turns, a shard actor killed mid-run, the journal's Redis killed and brought back.
Requests go through `RayBackend` (the ingress's path: re-planning, resumption)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from llguidance import LLMatcher
from serve_helpers import local_ray, replicas_app

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress.ray_backend import RayBackend
from marconi_ray.serve.messages import Completed
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PARAMS = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
# every other token fixed by the grammar: a resume that restarted it would differ
GRAMMAR = LLMatcher.grammar_from_lark('start: /[a-z]/ "1" /[a-z]/ "2" /[a-z]/ "3" /[a-z]/ "4"')
CONSTRAINED = dataclasses.replace(PARAMS, grammar=GRAMMAR)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("faults") / "tiny")


@pytest.fixture(scope="module")
def reference(model_dir: Path) -> Engine:
    return Engine(model_dir, system="vanilla", cache_bytes=10**8)


@pytest.fixture(scope="module")
def ray_session() -> Iterator[None]:
    with local_ray():
        yield


def _settings(model_dir: Path, app: str, **kw: Any) -> ServeSettings:
    base: dict[str, Any] = {
        "model_dir": str(model_dir),
        "model_name": "tiny",
        "cache_bytes": 2_000_000,
        "alpha": 1.0,
        "heartbeat_s": 0.2,
        "lease_s": 10.0,
        "app_name": app,
    }
    return ServeSettings(**{**base, **kw})


async def _request(
    backend: RayBackend, prompt: list[int], stream: bool = True, params: SamplingParams = PARAMS
) -> tuple[list[int], Completed]:
    """One request; `stream=False` has the replica send its tokens with its end, in one
    message, so a resume after a fault restarts it from scratch instead of continuing."""
    dispatch = await backend.plan(np.asarray(prompt, np.int32), params, time.time())
    tokens: list[int] = []
    done: Completed | None = None
    async for event in backend.generate(dispatch, stream):
        if isinstance(event, Completed):
            done = event
        else:
            tokens.append(event.token)
    assert done is not None
    return tokens, done


def _turns(backend: RayBackend, histories: list[list[int]], rng: Any) -> list[Completed]:
    """One turn of every session, concurrently; histories grow by output + a new user turn."""

    async def main() -> list[tuple[list[int], Completed]]:
        return await asyncio.gather(*(_request(backend, h) for h in histories))

    out = []
    for i, (tokens, done) in enumerate(asyncio.run(main())):
        histories[i] += tokens + rng.integers(7, 263, 5).tolist()
        out.append(done)
    return out


def _check_against(
    reference: Engine, prompt: list[int], tokens: list[int], params: SamplingParams = PARAMS
) -> None:
    assert tokens == list(reference.generate(prompt, params).tokens)


def test_coordinator_killed_between_turns_recovers_from_redis(
    ray_session, model_dir, reference, redis_server
):
    """Kill the coordinator actor between two turns: Ray restarts it, it replays the Redis
    journal, the replica reconciles, and the next turn of every session still hits with
    unchanged outputs."""
    settings = _settings(model_dir, "faults-coord", redis_url=redis_server.url)
    rng = np.random.default_rng(11)
    histories = [rng.integers(7, 263, 30).tolist() for _ in range(4)]
    with replicas_app(settings) as (coordinator, handle):
        backend = RayBackend(coordinator, handle)
        _turns(backend, histories, rng)
        nodes = ray.get(coordinator.check_invariants.remote())
        ray.kill(coordinator, no_restart=False)
        killed = time.monotonic()
        prompts = [list(h) for h in histories]
        dones = _turns(backend, histories, rng)
        recovered_in = time.monotonic() - killed
        status = ray.get(coordinator.journal_status.remote())
        assert status["recovery"]["ok"] and status["recovery"]["records"] > 0
        assert status["recovery"]["nodes"] == nodes
        for prompt, history, done in zip(prompts, histories, dones, strict=True):
            assert done.usage.cached_tokens > 0, "the restored tree still serves hits"
            _check_against(reference, prompt, history[len(prompt) : len(prompt) + 8])
        assert ray.get(coordinator.check_invariants.remote()) > nodes
        assert recovered_in < 30


def test_shard_killed_mid_run_rebuilds_and_outputs_match_vanilla(ray_session, model_dir, reference):
    """2 replicas x 2 shards, 6 sessions x 4 turns; a shard is killed while the second turn
    runs: every request still succeeds with the vanilla output, the replica rebuilds its
    TP group under a new generation, and the caches stay consistent. Then a shard of the
    idle replica is killed: its health check finds the loss and the replica rebuilds in
    place (not replaced by Serve). The steps go over the compiled graph (the GPU default;
    the plain path runs in the other tp 2 tests)."""
    settings = _settings(model_dir, "faults-shard", replicas=2, tp=2, step_graph="compiled")
    rng = np.random.default_rng(12)
    histories = [rng.integers(7, 263, 30).tolist() for _ in range(6)]
    with replicas_app(settings) as (coordinator, handle):
        backend = RayBackend(coordinator, handle)
        _turns(backend, histories, rng)
        victim = _shard_names(settings.app_name)[0]

        async def kill_when_busy() -> None:
            while sum(st.in_flight for st in await coordinator.stats.remote()) < 3:
                await asyncio.sleep(0.01)
            ray.kill(ray.get_actor(victim, namespace=NAMESPACE))

        async def second_turn() -> list[tuple[list[int], Completed]]:
            killer = asyncio.ensure_future(kill_when_busy())
            # half the sessions stream, half take the one-object answer: both resume;
            # two of the streamed ones are constrained by a grammar, which resumes too
            out = await asyncio.gather(
                *(_request(backend, h, i % 2 == 0, second[i]) for i, h in enumerate(histories))
            )
            await killer
            return out

        prompts = [list(h) for h in histories]
        second = [CONSTRAINED if i in (0, 2) else PARAMS for i in range(len(histories))]
        for i, (tokens, _) in enumerate(asyncio.run(second_turn())):
            _check_against(reference, prompts[i], tokens, second[i])
            histories[i] += tokens + rng.integers(7, 263, 5).tolist()
        prompts = [list(h) for h in histories]
        dones = _turns(backend, histories, rng)
        for prompt, history in zip(prompts, histories, strict=True):
            _check_against(reference, prompt, history[len(prompt) : len(prompt) + 8])
        assert any(d.usage.cached_tokens > 0 for d in dones), "the surviving cache still hits"
        names = _shard_names(settings.app_name)
        assert victim not in names and any(n.endswith("-1") for n in names), names
        replica_ids = sorted(ray.get(coordinator.replicas.remote()))
        assert len(replica_ids) == 2
        assert ray.get(coordinator.check_invariants.remote()) > 0
        for st in ray.get(coordinator.stats.remote()):
            assert st.in_flight == 0 and st.reserved == 0

        # a shard of the idle replica dies: its health check finds it and the replica
        # rebuilds in place (Serve keeps it: same replica ids), then serves the next turn
        idle_victim = next(n for n in names if n.endswith("-0"))
        ray.kill(ray.get_actor(idle_victim, namespace=NAMESPACE))
        rebuilt = idle_victim[: -len("0")] + "1"
        deadline = time.monotonic() + 40
        while rebuilt not in _shard_names(settings.app_name):
            assert time.monotonic() < deadline, _shard_names(settings.app_name)
            time.sleep(0.2)
        prompts = [list(h) for h in histories]
        _turns(backend, histories, rng)
        for prompt, history in zip(prompts, histories, strict=True):
            _check_against(reference, prompt, history[len(prompt) : len(prompt) + 8])
        assert sorted(ray.get(coordinator.replicas.remote())) == replica_ids


def _shard_names(app: str) -> list[str]:
    actors = ray.util.list_named_actors(all_namespaces=True)
    return sorted(
        a["name"]
        for a in actors
        if a["namespace"] == NAMESPACE and a["name"].startswith(f"{app}-") and "-shard" in a["name"]
    )


def test_redis_killed_service_degrades_then_catches_up(
    ray_session, model_dir, reference, redis_server
):
    """Kill the journal's Redis: requests keep succeeding (journal degraded, records
    queued); bring it back: the backlog is flushed, and a coordinator restarted from it
    still serves every session's next turn from the cache."""
    settings = _settings(model_dir, "faults-redis", redis_url=redis_server.url)
    rng = np.random.default_rng(13)
    histories = [rng.integers(7, 263, 30).tolist() for _ in range(3)]
    with replicas_app(settings) as (coordinator, handle):
        backend = RayBackend(coordinator, handle)
        _turns(backend, histories, rng)
        redis_server.stop()
        prompts = [list(h) for h in histories]
        _turns(backend, histories, rng)
        for prompt, history in zip(prompts, histories, strict=True):
            _check_against(reference, prompt, history[len(prompt) : len(prompt) + 8])
        status = ray.get(coordinator.journal_status.remote())
        assert not status["healthy"] and status["backlog"] > 0
        redis_server.start()
        time.sleep(1.2)  # the journal retries Redis at most once a second
        _turns(backend, histories, rng)
        status = ray.get(coordinator.journal_status.remote())
        assert status["healthy"] and status["backlog"] == 0 and status["outages"] == 1
        nodes = ray.get(coordinator.check_invariants.remote())
        ray.kill(coordinator, no_restart=False)
        dones = _turns(backend, histories, rng)
        status = ray.get(coordinator.journal_status.remote())
        assert status["recovery"]["nodes"] == nodes
        assert all(d.usage.cached_tokens > 0 for d in dones)


def test_idle_replica_keeps_its_registration_past_the_lease(ray_session, model_dir):
    """No request at all for 3 leases: the health check started the heartbeats, so the
    coordinator still routes to the replica."""
    settings = _settings(model_dir, "faults-idle", lease_s=1.5, heartbeat_s=0.3)
    with replicas_app(settings) as (coordinator, handle):
        time.sleep(4.5)
        assert len(ray.get(coordinator.replicas.remote())) == 1
        backend = RayBackend(coordinator, handle)
        tokens, done = asyncio.run(_request(backend, list(range(7, 40))))
        assert len(tokens) == 8 and done.finish_reason == "length"


def _generations(coordinator: Any) -> dict[str, int]:
    """Replica id -> its registration generation at the coordinator (a drop and a new
    registration, or a reset, changes it)."""
    return ray.get(
        coordinator.__ray_call__.remote(
            lambda c: {rid: info.generation for rid, info in c.replica_info.items()}
        )
    )


def test_a_paused_then_restarted_coordinator_with_a_host_tier_loses_nothing(
    ray_session, model_dir, reference, redis_server
):
    """The host tier on (a small device cache: demotions and promotions all along), 2
    replicas, Redis journal, a 2 s lease. Under load, the coordinator's process is
    stopped (SIGSTOP) for longer than a lease, then killed and restarted from the
    journal. Every request of every session completes with the uncached output (no
    stream error: what would be an HTTP 500), no healthy replica is dropped by the paused
    coordinator, no store refuses a release, and the tiers agree at the end."""
    settings = _settings(
        model_dir,
        "faults-pause",
        redis_url=redis_server.url,
        replicas=2,
        cache_bytes=150_000,
        host_cache_bytes=4_000_000,
        host_placement="lru",
        lease_s=2.0,
        heartbeat_s=0.2,
    )
    rng = np.random.default_rng(17)
    histories = [rng.integers(7, 263, 30).tolist() for _ in range(6)]
    with replicas_app(settings) as (coordinator, handle):
        backend = RayBackend(coordinator, handle)
        _turns(backend, histories, rng)
        before = _generations(coordinator)
        pid = ray.get(coordinator.__ray_call__.remote(lambda c: os.getpid()))
        errors: list[BaseException] = []
        checked = 0

        async def load(turns: int) -> None:
            nonlocal checked
            for _ in range(turns):
                prompts = [list(h) for h in histories]
                results = await asyncio.gather(
                    *(_request(backend, p) for p in prompts), return_exceptions=True
                )
                for i, result in enumerate(results):
                    if isinstance(result, BaseException):
                        errors.append(result)
                        continue
                    tokens, _ = result
                    _check_against(reference, prompts[i], tokens)
                    checked += 1
                    histories[i] += tokens + rng.integers(7, 263, 5).tolist()

        async def faults() -> None:
            await asyncio.sleep(0.5)
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(settings.lease_s * 1.75)  # past every lease and its grace
            os.kill(pid, signal.SIGCONT)
            await asyncio.sleep(1.0)
            assert _generations(coordinator) == before, "the paused coordinator dropped one"
            stalls = ray.get(coordinator.__ray_call__.remote(lambda c: c.stall_watch.stalls))
            assert stalls >= 1
            ray.kill(coordinator, no_restart=False)

        async def main() -> None:
            await asyncio.gather(load(4), faults())

        asyncio.run(main())
        assert errors == [] and checked == 4 * len(histories)
        _turns(backend, histories, rng)  # after the restart the replicas reconciled
        stats = ray.get(coordinator.stats.remote())
        assert sum(s.refused_releases for s in stats) == 0
        # the restored trees matched the stores, tiers included (a mismatch resets a tree
        # under a new generation), and no replica was dropped
        assert _generations(coordinator) == before
        assert ray.get(coordinator.check_invariants.remote()) > 0


def test_a_coordinator_without_a_journal_killed_while_hits_decode(
    ray_session, model_dir, reference
):
    """Issue 54 on real Ray: the coordinator (in-memory journal) is killed while requests
    that hit the cache decode; Ray restarts it empty, the replica registers again and
    reconciles, freeing every row its old tree held, the running hits' rows among them.
    Those frees wait for the requests that read the rows, so every request's tokens are
    the vanilla ones, and afterwards the store holds exactly what the new tree accounts."""
    settings = _settings(model_dir, "faults-reset", replicas=1)
    rng = np.random.default_rng(54)
    histories = [rng.integers(7, 263, 30).tolist() for _ in range(4)]
    long = dataclasses.replace(PARAMS, max_tokens=64)
    with replicas_app(settings) as (coordinator, handle):
        backend = RayBackend(coordinator, handle)
        _turns(backend, histories, rng)  # cached: the next turns hit and read in place
        killed: list[float] = []

        async def kill_when_decoding() -> None:
            while sum(st.in_flight for st in await coordinator.stats.remote()) < 3:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # a few tokens into the hits
            ray.kill(coordinator, no_restart=False)
            killed.append(time.monotonic())

        async def one(history: list[int]) -> tuple[list[int], Completed, float]:
            tokens, done = await _request(backend, history, True, long)
            return tokens, done, time.monotonic()

        async def hit_turn() -> list[tuple[list[int], Completed, float]]:
            killer = asyncio.ensure_future(kill_when_decoding())
            out = await asyncio.gather(*(one(h) for h in histories))
            await killer
            return out

        answers = asyncio.run(hit_turn())
        assert any(end > killed[0] for _, _, end in answers), "all ended before the kill"
        for history, (tokens, done, _) in zip(histories, answers, strict=True):
            assert done.usage.cached_tokens > 0  # planned on the old tree: it hit
            _check_against(reference, history, tokens, long)
        deadline = time.monotonic() + 60
        while True:  # the replica registered again, reconciled, freed what it let go of
            stats = ray.get(coordinator.stats.remote())
            held = handle.stats.remote().result(timeout_s=30)["bytes_used"]
            if stats and held == stats[0].bytes_used and not stats[0].in_flight:
                break
            assert time.monotonic() < deadline, (held, stats)
            time.sleep(0.2)
        ray.get(coordinator.check_invariants.remote())
