"""Assemble and run the service: coordinator and tuner actors, the model-replica
deployment and the OpenAI ingress in front of it.

Placement (`serve.placement`): the coordinator, the tuner actor and the ingress run on
the control nodes (`settings.control_resource`: the head by default), the replicas on the
model nodes (`settings.model_resource`), and `run_app` starts Serve's HTTP proxy on the
head only; so losing a model node loses only the replicas (and their caches) it held.

- `run_app(settings)`: start everything on the connected Ray instance; returns when the
  application is serving on `settings.host:settings.port`.
- `shutdown_app(settings)`: tear it all down (Serve app, coordinator, tuner).
- `app_builder(args)`: the `import_path` target of a Serve config file
  (`marconi_ray.serve.app:app_builder`), with `args` = the `ServeConfig` keys.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import ray
from ray import serve
from ray.serve.exceptions import RayServeException

from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.journal import clear_journal
from marconi_ray.serve.host_memory import check_model_nodes
from marconi_ray.serve.placement import control_resources
from marconi_ray.serve.replica.deployment import DRAIN_POLL_S, replica_deployment
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

INGRESS_MAX_ONGOING: Final = 1024
"""Requests one ingress replica holds at once (Serve's default of 5 would queue clients in
front of the ingress; the replicas batch and the coordinator routes what gets through)."""


def start_coordinator(settings: ServeSettings, resources: dict[str, float] | None = None) -> Any:
    """The named coordinator actor (created if absent; detached so it outlives drivers),
    pinned by `resources` (default: `control_resources(settings.control_resource)`).

    Ray restarts it whenever its process dies (`max_restarts=-1`); its constructor then
    replays the journal. Calls in flight at the crash are retried on the new instance
    (`max_task_retries=-1`): `commit` is idempotent, a retried `plan` leaves an orphan
    plan that its lease expires."""
    if resources is None:
        resources = control_resources(settings.control_resource)
    return (
        ray.remote(CacheCoordinator)
        .options(
            name=settings.coordinator_name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            resources=resources,
            max_restarts=-1,
            max_task_retries=-1,
        )
        .remote(settings)
    )


def build_app(settings: ServeSettings) -> Any:
    """The Serve application graph: ingress (on the control nodes) -> pinned-routed
    model replicas. The coordinator and tuner actors must exist (see `start_actors`).
    Needs a connected Ray (placement reads the cluster's resources)."""
    from marconi_ray.serve.ingress.api import OpenAIIngress

    replicas = replica_deployment(settings).bind(settings)
    actor_options: dict[str, Any] = {"num_cpus": 1}
    pinned = control_resources(settings.control_resource)
    if pinned:
        actor_options["resources"] = pinned
    return OpenAIIngress.options(
        ray_actor_options=actor_options,
        max_ongoing_requests=INGRESS_MAX_ONGOING,
        graceful_shutdown_wait_loop_s=DRAIN_POLL_S,
    ).bind(settings, replicas)


def start_actors(settings: ServeSettings) -> None:
    """Create the coordinator and the tuner actor on the control nodes (one of each per
    member of the coordinator group, `settings.coordinators`) and wait until the
    coordinators answer. ValueError, before anything starts, when no model node has the
    free memory for one replica's host tier (`serve.host_memory`); ValueError when
    `settings.control_resource` names a resource no node advertises."""
    from marconi_ray.serve.coordinator.tuner_actor import start_tuner

    check_model_nodes(
        settings.host_cache_bytes, settings.tp, settings.model_resource, settings.device == "cuda"
    )
    pinned = control_resources(settings.control_resource)
    group = settings.group()
    coordinators = [start_coordinator(member, pinned) for member in group]
    for member in group:
        start_tuner(member.tuner, member.coordinator_name, name=member.tuner_name, resources=pinned)
    ray.get([c.replicas.remote() for c in coordinators])


def run_app(settings: ServeSettings) -> None:
    """Deploy everything and return once it serves HTTP on host:port (one proxy, on the
    head node: `proxy_location` HeadOnly)."""
    start_actors(settings)
    serve.start(
        proxy_location="HeadOnly", http_options={"host": settings.host, "port": settings.port}
    )
    serve.run(build_app(settings), name=settings.app_name, route_prefix="/")


def shutdown_app(settings: ServeSettings) -> None:
    """Delete the application, kill the coordinator and tuner actors (every member of
    the group), and clear their Redis journals (the replicas' tensors are gone, so is
    what they described)."""
    try:
        with contextlib.suppress(RayServeException):  # no Serve instance: nothing to delete
            serve.delete(settings.app_name)
    finally:
        for member in settings.group():
            for name in (member.coordinator_name, member.tuner_name):
                with contextlib.suppress(ValueError):
                    ray.kill(ray.get_actor(name, namespace=NAMESPACE))
            if member.redis_url is not None:
                clear_journal(member.redis_url, member.journal_prefix)


def app_builder(args: dict[str, Any]) -> Any:
    """Serve config entry point: `import_path: marconi_ray.serve.app:app_builder` with
    `args:` holding `ServeConfig` keys (unknown keys are an error naming the key)."""
    from marconi_ray.serve.config import ServeConfig

    settings = ServeConfig(**args).to_settings()
    start_actors(settings)
    return build_app(settings)
