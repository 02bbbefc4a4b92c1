"""Shared helpers for the Ray-backed serve tests: a local Ray, deployed apps, streaming."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import ray
from ray import serve

from marconi_ray.engine.sampling import SamplingParams
from marconi_ray.serve.app import shutdown_app, start_actors
from marconi_ray.serve.messages import Completed
from marconi_ray.serve.replica import replica_deployment
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@contextmanager
def local_ray(num_cpus: int = 12) -> Iterator[None]:
    """A fresh local Ray instance (logical CPUs may exceed the physical ones)."""
    ray.init(
        address="local",
        num_cpus=num_cpus,
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        serve.shutdown()
        ray.shutdown()


@contextmanager
def replicas_app(settings: ServeSettings) -> Iterator[tuple[Any, Any]]:
    """Deploy the coordinator, tuner and model replicas (no HTTP ingress); yields the
    coordinator actor and the replica deployment handle."""
    start_actors(settings)
    handle = serve.run(
        replica_deployment(settings).bind(settings), name=settings.app_name, route_prefix=None
    )
    coordinator = ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
    deadline = time.monotonic() + 60
    while len(ray.get(coordinator.replicas.remote())) < settings.replicas:
        assert time.monotonic() < deadline, "replicas did not register"
        time.sleep(0.2)
    try:
        yield coordinator, handle
    finally:
        shutdown_app(settings)


async def run_request(
    coordinator: Any, handle: Any, prompt: list[int], params: SamplingParams = GREEDY
) -> tuple[str, list[int], Completed]:
    """Plan at the coordinator, stream from the chosen replica; (replica, tokens, done)."""
    dispatch = await coordinator.plan.remote(np.asarray(prompt, np.int32), params, time.time())
    tokens: list[int] = []
    done: Completed | None = None
    async for event in handle.options(stream=True).generate.remote(dispatch):
        if isinstance(event, Completed):
            done = event
        else:
            tokens.append(event.token)
    assert done is not None
    return dispatch.replica_id, tokens, done
