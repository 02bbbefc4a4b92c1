"""A coordinator group on real Ray with a real `redis-server`: two coordinators, two
model replicas (one each, by Serve rank), sessions spread over both by the group key.
Killing one coordinator between two turns touches only its own replica: Ray restarts it,
it replays its own journal, its replica reconciles, and every session's next turn still
hits with unchanged outputs; the other coordinator keeps its process, its replica's
generation and its tree. Requests go through `RayBackend` (the ingress's path)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import pytest
import ray
from serve_helpers import group_app
from test_faults import _check_against, _settings, _turns
from test_faults import model_dir as model_dir  # the fixtures of those helpers
from test_faults import ray_session as ray_session
from test_faults import reference as reference

from marconi_ray.serve.ingress.group_key import group_of
from marconi_ray.serve.ingress.ray_backend import RayBackend

pytestmark = [pytest.mark.ray, pytest.mark.slow]

KEY = 8


def _sessions(rng: Any, per_group: int) -> list[list[int]]:
    """`per_group` sessions whose group key picks each of the two coordinators."""
    out: dict[int, list[list[int]]] = {0: [], 1: []}
    while min(len(v) for v in out.values()) < per_group:
        history = rng.integers(7, 263, 30).tolist()
        group = group_of(np.asarray(history, np.int32), 2, KEY)
        if len(out[group]) < per_group:
            out[group].append(history)
    return out[0] + out[1]


def _view(coordinator: Any) -> dict[str, Any]:
    """The coordinator's process, and its replicas' generations."""
    return ray.get(
        coordinator.__ray_call__.remote(
            lambda self: {
                "pid": os.getpid(),
                "generations": {r: i.generation for r, i in self.replica_info.items()},
            }
        )
    )


def test_killing_one_coordinator_of_two_touches_only_its_replicas(
    ray_session, model_dir, reference, redis_server
):
    settings = _settings(
        model_dir,
        "group-faults",
        redis_url=redis_server.url,
        coordinators=2,
        replicas=2,
        group_key_tokens=KEY,
    )
    rng = np.random.default_rng(5)
    histories = _sessions(rng, per_group=2)
    with group_app(settings) as (coordinators, handle):
        owned = [ray.get(c.replicas.remote()) for c in coordinators]
        assert [len(o) for o in owned] == [1, 1], "one replica each"
        backend = RayBackend(coordinators, handle, key_tokens=KEY)
        _turns(backend, histories, rng)
        stats = [ray.get(c.stats.remote()) for c in coordinators]
        assert all(s[0].stats["requests"] == 2 for s in stats), "each planned its sessions"
        before = [_view(c) for c in coordinators]
        nodes = ray.get(coordinators[1].check_invariants.remote())

        ray.kill(coordinators[1], no_restart=False)
        killed = time.monotonic()
        prompts = [list(h) for h in histories]
        dones = _turns(backend, histories, rng)
        assert time.monotonic() - killed < 30

        after = [_view(c) for c in coordinators]
        assert after[0] == before[0], "the other coordinator and its replica untouched"
        assert after[1]["pid"] != before[1]["pid"]
        status = ray.get(coordinators[1].journal_status.remote())
        assert status["recovery"]["ok"] and status["recovery"]["nodes"] == nodes
        for prompt, history, done in zip(prompts, histories, dones, strict=True):
            assert done.usage.cached_tokens > 0, "every session's next turn hits"
            _check_against(reference, prompt, history[len(prompt) : len(prompt) + 8])
        for c in coordinators:
            ray.get(c.check_invariants.remote())
