"""Routing across replicas (`serve.coordinator.routing.routers`): the strategies on
hand-made views, views read off real prefix caches, the `routing` setting (config, CLI),
and a real-Ray run of two replicas where cache_aware keeps each session on the replica
holding its state while round_robin alternates."""

from __future__ import annotations

import argparse
import asyncio
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marconi_ray.cli import serve as serve_cmd
from marconi_ray.cli.main import build_parser, main
from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.serve.config import ServeConfig, config_from_mapping, default_config
from marconi_ray.serve.coordinator.routing.routers import (
    ROUTERS,
    CacheAwareRouter,
    LeastLoadedRouter,
    ReplicaView,
    RoundRobinRouter,
    make_router,
)
from marconi_ray.serve.settings import ServeSettings

PROMPT = np.arange(7, 40, dtype=np.int32)
LINEAR = CostModel(flops_linear=1000.0, flops_quadratic=0.0, kv_bytes_per_token=10, state_bytes=100)
QUADRATIC = CostModel(flops_linear=1.0, flops_quadratic=1.0, kv_bytes_per_token=10, state_bytes=100)


def view(rid: str, **kw: object) -> ReplicaView:
    return ReplicaView(rid, **kw)  # type: ignore[arg-type]


def settings(**kw: object) -> ServeSettings:
    return ServeSettings(model_dir="/m", model_name="tiny", **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- cache_aware
def test_best_flops_net_of_queue_wins() -> None:
    router = CacheAwareRouter(load_tokens=10, max_imbalance=10)
    views = [
        view("a", hit_tokens=10, flops_saved=100.0, open_requests=2, queue_flops=30.0),  # 40
        view("b", hit_tokens=5, flops_saved=50.0, open_requests=0, queue_flops=30.0),  # 50
        view("c", hit_tokens=0, flops_saved=0.0, open_requests=0, queue_flops=30.0),  # 0
    ]
    assert router.choose(PROMPT, views) == "b"


def test_session_sticks_to_the_replica_holding_its_state() -> None:
    """The holder keeps the session although its score is worse (it is busier)."""
    router = CacheAwareRouter(max_imbalance=4)
    holder = view("a", hit_tokens=20, flops_saved=100.0, open_requests=4, queue_flops=50.0)
    idle = view("b", hit_tokens=0, flops_saved=0.0, open_requests=0, queue_flops=50.0)
    assert CacheAwareRouter.score(holder) < CacheAwareRouter.score(idle)
    sticky = ReplicaView("a", 20, 100.0, 4, 50.0, holds_session=True)
    assert router.choose(PROMPT, [sticky, idle]) == "a"
    assert router.choose(PROMPT, [idle, sticky]) == "a"
    assert router.choose(PROMPT, [holder, idle]) == "b"  # not the holder: the score decides


def test_overloaded_holder_spills_to_the_least_loaded() -> None:
    router = CacheAwareRouter(max_imbalance=2)
    busy = ReplicaView("a", 500, 1e9, 4, 1.0, holds_session=True)
    assert router.choose(PROMPT, [busy, view("b", open_requests=2)]) == "a"  # 4 <= 2 + 2
    # 5 > 2 + 2: overloaded, although its score is far better and it holds the session
    busier = ReplicaView("a", 500, 1e9, 5, 1.0, holds_session=True)
    assert router.choose(PROMPT, [busier, view("b", open_requests=2)]) == "b"
    # the bound holds for any choice: the best hit of a non-holder does not lift it either
    assert router.choose(PROMPT, [view("a", flops_saved=1e9, open_requests=3), view("b")]) == "b"


def test_flops_beat_tokens() -> None:
    """Replicas whose cost models differ: the hit that saves more FLOPs wins, not the
    longer one; and with a quadratic cost a long hit outweighs a queue that the same
    number of tokens would not."""
    router = CacheAwareRouter(load_tokens=0, max_imbalance=4)
    cheap_long = view("a", hit_tokens=100, flops_saved=1e3)
    dear_short = view("b", hit_tokens=60, flops_saved=5e3)
    assert router.choose(PROMPT, [cheap_long, dear_short]) == "b"

    caches = {
        "a": PrefixCache(QUADRATIC, CacheConfig(10**9)),
        "b": PrefixCache(QUADRATIC, CacheConfig(10**9)),
    }
    doc = np.arange(7, 607, dtype=np.int32)
    caches["a"].serve(doc[:600], np.zeros(0, np.int32))
    prompt = np.concatenate([doc, np.arange(7, 20, dtype=np.int32)])
    load = {"a": 3, "b": 0}
    replicas = [(rid, c, load[rid]) for rid, c in caches.items()]
    quadratic = CacheAwareRouter(load_tokens=256, max_imbalance=4)
    views = [ReplicaView.of(rid, c, n, prompt, 256) for rid, c, n in replicas]
    assert views[0].hit_tokens == 600 and views[1].hit_tokens == 0
    # in tokens: 600 - 3 * 256 < 0, the idle replica would win; in FLOPs the hit does
    assert 600 - 3 * 256 < 0
    assert views[0].flops_saved > 3 * views[0].queue_flops
    assert quadratic.route(prompt, replicas) == "a"


def test_ties_prefer_fewer_open_then_registration_order() -> None:
    router = CacheAwareRouter(load_tokens=0, max_imbalance=10)
    assert router.choose(PROMPT, [view("a"), view("b"), view("c")]) == "a"
    assert router.choose(PROMPT, [view("a", open_requests=1), view("b")]) == "b"
    assert router.choose(PROMPT, [view("a", open_requests=1), view("b", open_requests=1)]) == "a"


def test_views_from_real_caches_mark_the_session_holder() -> None:
    """The replica that served the previous turn holds the session (its state is a leaf
    the new prompt walks down to); a replica holding only a shared prefix does not."""
    shared = np.arange(7, 27, dtype=np.int32)
    turn1 = np.concatenate([shared, np.arange(100, 110, dtype=np.int32)])
    out1 = np.arange(200, 204, dtype=np.int32)
    a, b = PrefixCache(LINEAR, CacheConfig(10**9)), PrefixCache(LINEAR, CacheConfig(10**9))
    a.serve(turn1, out1)
    b.serve(np.concatenate([shared, np.arange(120, 130, dtype=np.int32)]), out1)
    b.serve(np.concatenate([shared, np.arange(140, 150, dtype=np.int32)]), out1)  # branch
    turn2 = np.concatenate([turn1, out1, np.arange(300, 305, dtype=np.int32)])
    va = ReplicaView.of("a", a, 0, turn2, 256)
    vb = ReplicaView.of("b", b, 0, turn2, 256)
    assert (va.hit_tokens, va.holds_session) == (len(turn1) + len(out1), True)
    assert (vb.hit_tokens, vb.holds_session) == (len(shared), False)
    assert va.flops_saved == LINEAR.prefill_flops(va.hit_tokens)
    assert va.queue_flops == LINEAR.prefill_flops(256)
    # a busy holder keeps the session within the bound and loses it beyond
    router = CacheAwareRouter(load_tokens=256, max_imbalance=3)
    assert router.route(turn2, [("b", b, 0), ("a", a, 3)]) == "a"
    assert router.route(turn2, [("b", b, 0), ("a", a, 4)]) == "b"


# ---------------------------------------------------------------------- others
def test_round_robin_cycles_in_registration_order() -> None:
    router = RoundRobinRouter()
    views = [view("a", hit_tokens=100, flops_saved=1e9, holds_session=True), view("b"), view("c")]
    assert [router.choose(PROMPT, views) for _ in range(7)] == list("abcabca")


def test_least_loaded() -> None:
    router = LeastLoadedRouter()
    assert router.choose(PROMPT, [view("a", open_requests=2), view("b", open_requests=1)]) == "b"
    tied = [view("a", open_requests=1), view("b", open_requests=1, hit_tokens=5)]
    assert router.choose(PROMPT, tied) == "b"
    assert router.choose(PROMPT, [view("a"), view("b")]) == "a"


def test_make_router_from_settings_and_bad_name() -> None:
    r = make_router("cache_aware", settings(route_load_weight=8.0, route_max_imbalance=1))
    assert isinstance(r, CacheAwareRouter) and (r.load_tokens, r.max_imbalance) == (8.0, 1)
    assert isinstance(make_router("round_robin", settings()), RoundRobinRouter)
    assert set(ROUTERS) == {"cache_aware", "round_robin", "least_loaded"}
    with pytest.raises(ValueError, match=r"'nearest'.*cache_aware"):
        make_router("nearest", settings())
    with pytest.raises(ValueError, match="no replica"):
        RoundRobinRouter().route(PROMPT, [])
    with pytest.raises(ValueError, match="max_imbalance"):
        CacheAwareRouter(max_imbalance=-1)


# ---------------------------------------------------------------------- config + CLI
def test_routing_settings_in_config() -> None:
    c = default_config()
    assert (c.routing, c.route_max_imbalance) == ("cache_aware", 4)
    s = config_from_mapping({"routing": "round_robin", "route_max_imbalance": 0}).to_settings()
    assert (s.routing, s.route_max_imbalance) == ("round_robin", 0)
    assert ServeSettings(model_dir="/m", model_name="m").routing == "cache_aware"


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        ({"routing": "nearest"}, ("routing", "'nearest'", "round_robin")),
        ({"route_max_imbalance": -1}, ("route_max_imbalance", "-1")),
        ({"route_max_imbalance": "many"}, ("route_max_imbalance", "many")),
    ],
)
def test_bad_routing_values_are_named(data: dict[str, object], needles: tuple[str, ...]) -> None:
    with pytest.raises(ValueError) as info:
        config_from_mapping(data, "serve.yaml")
    for needle in needles:
        assert needle in str(info.value)
    assert ServeConfig.model_fields["routing"].description


def test_routing_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["serve", "--routing", "round_robin"])
    assert serve_cmd.load_config(args).routing == "round_robin"
    bare = argparse.Namespace(config=None, port=None)  # flags absent: defaults
    assert serve_cmd.load_config(bare) == default_config()
    assert main(["serve", "--routing", "nearest"]) == 2
    assert "--routing" in capsys.readouterr().err
    assert main(["serve", "--help"]) == 0
    assert "--routing" in capsys.readouterr().out


# ---------------------------------------------------------------------- real Ray
@pytest.mark.ray
@pytest.mark.slow
def test_two_replicas_cache_aware_sticks_round_robin_alternates(tmp_path: Path) -> None:
    """3 sessions x 3 turns over 2 tiny replicas. cache_aware (each turn's requests sent
    together): first turns spread over both replicas by load, every later turn lands on
    the replica that served the previous one and resumes from its whole previous turn.
    round_robin (one request at a time): replicas alternate request by request, so each
    session changes replica every turn and never resumes a whole previous turn."""
    from serve_helpers import local_ray, replicas_app, run_request

    from marconi_ray.engine.presets.factory import make_model

    model_dir = make_model("tiny", "nemotron_h", tmp_path / "tiny")
    rng = np.random.default_rng(5)
    firsts = [rng.integers(7, 263, 16).tolist() for _ in range(3)]
    news = [[rng.integers(7, 263, 5).tolist() for _ in range(3)] for _ in range(2)]

    def app(routing: str) -> ServeSettings:
        return ServeSettings(
            model_dir=str(model_dir),
            model_name="tiny",
            replicas=2,
            cache_bytes=10**8,
            routing=routing,
            app_name=f"route-test-{routing}",
        )

    with local_ray():
        # cache_aware: each turn of the 3 sessions at once
        with replicas_app(app("cache_aware")) as (coordinator, handle):
            histories = [list(p) for p in firsts]
            served: list[list[tuple[str, int, int]]] = [[] for _ in range(3)]

            async def turn(i: int) -> None:
                replica, tokens, done = await run_request(coordinator, handle, histories[i])
                served[i].append((replica, len(histories[i]), done.usage.cached_tokens))
                histories[i] = histories[i] + tokens

            for k in range(3):
                if k:
                    histories = [h + news[k - 1][i] for i, h in enumerate(histories)]

                async def together() -> None:
                    await asyncio.gather(*(turn(i) for i in range(3)))

                asyncio.run(together())
            replicas = sorted(ray_list(coordinator.replicas.remote()))
        assert {turns[0][0] for turns in served} == set(replicas), "first turns spread"
        for turns in served:
            assert len({r for r, _, _ in turns}) == 1, f"a session moved: {turns}"
            for (_, n_prev, _), (_, n, cached) in itertools.pairwise(turns):
                # resumed from the previous turn's prompt + its 6 generated tokens
                assert cached == n_prev + 6 and cached < n
        # round_robin: one request at a time, sessions interleaved
        with replicas_app(app("round_robin")) as (coordinator, handle):
            order = ray_list(coordinator.replicas.remote())
            histories = [list(p) for p in firsts]
            seen: list[tuple[int, str, int, int]] = []
            for k in range(3):
                for i in range(3):
                    if k:
                        histories[i] = histories[i] + news[k - 1][i]
                    replica, tokens, done = asyncio.run(
                        run_request(coordinator, handle, histories[i])
                    )
                    seen.append((i, replica, len(histories[i]), done.usage.cached_tokens))
                    histories[i] = histories[i] + tokens
        assert [r for _, r, _, _ in seen] == [order[j % 2] for j in range(9)]
        for i in range(3):
            mine = [s for s in seen if s[0] == i]
            assert len({r for _, r, _, _ in mine[:2]}) == 2, "round robin moved the session"
            for prev, cur in itertools.pairwise(mine):
                assert cur[3] < prev[2] + 6, "no later turn resumes its whole previous turn"


def ray_list(ref: Any) -> list[str]:
    """`ray.get` of a list-valued object ref."""
    import ray

    return list(ray.get(ref))
