"""Where the service's pieces run on a multi-node Ray cluster.

Two kinds of node:
- control nodes run the cache coordinator, the tuner actor and the OpenAI ingress (and,
  by Ray Serve's own rules, the Serve controller and the HTTP proxy, on the head). Losing
  a model node then never loses the cache metadata, the tuner or the HTTP connections.
  `ServeSettings.control_resource` names them: `auto` (the default) is Ray's head-node
  resource `node:__internal_head__` (every cluster started with `ray start --head` has
  it), `none` lets Ray place them anywhere, and any other value is a custom resource that
  the control nodes advertise (`ray start --resources '{"marconi_control": 1}'`).
  Each of those actors takes `CONTROL_SHARE` of it, so it pins without counting.
- model nodes run the model replicas. `ServeSettings.model_resource` names a custom
  resource that they advertise, one unit per replica the node may hold
  (`ray start --resources '{"marconi_model": 2}'` on a node for two replicas); every
  replica's placement group takes one unit in its first bundle, so replicas never land
  on a node without it and at most that many share a node. None (the default): replicas
  go wherever their CPUs / GPUs fit (on a cluster with a CPU-only head and `device:
  cuda`, that already means the GPU nodes).

The tuner's grid tasks take one CPU and no GPU each and are spread over every node
(`TUNER_TASK_OPTIONS`): they are short, retried by Ray if their node dies, and use the
CPUs that the model nodes leave idle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

HEAD_RESOURCE: Final = "node:__internal_head__"
"""The resource Ray gives the head node (1.0), and only it."""
AUTO: Final = "auto"
NONE: Final = "none"
CONTROL_SHARE: Final = 0.001
"""How much of the control resource each control-plane actor takes (pins, never fills)."""
RESERVED: Final = frozenset({"CPU", "GPU", "memory", "object_store_memory"})
"""Ray's built-in resources: every node has them, so they cannot single nodes out."""

TUNER_TASK_OPTIONS: Final[Mapping[str, Any]] = {
    "num_cpus": 1,
    "num_gpus": 0,
    "scheduling_strategy": "SPREAD",
}
"""Ray options of one tuner grid task: one CPU, no GPU, spread across nodes."""


def check_resource_name(name: str, key: str) -> str:
    """`name` if it can name a Ray custom resource; ValueError naming `key` otherwise
    (empty, whitespace, or one of Ray's built-in resources)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{key} must be a non-empty resource name, got {name!r}")
    if any(c.isspace() for c in name):
        raise ValueError(f"{key} must be a resource name without spaces, got {name!r}")
    if name in RESERVED:
        raise ValueError(
            f"{key} must be a custom resource that only some nodes advertise, got {name!r} "
            f"(every node has {', '.join(sorted(RESERVED))})"
        )
    return name


def check_placement(control_resource: str, model_resource: str | None) -> None:
    """Validate the two placement settings together (see the module docstring).

    Raises:
        ValueError: naming the bad value: an invalid resource name, or the same
            resource for control and model nodes (a model node's loss would then take
            the control plane with it).
    """
    if control_resource not in (AUTO, NONE):
        check_resource_name(control_resource, "control_resource")
    if model_resource is None:
        return
    check_resource_name(model_resource, "model_resource")
    control = HEAD_RESOURCE if control_resource == AUTO else control_resource
    if model_resource == control:
        raise ValueError(
            f"model_resource and control_resource both name {model_resource!r}: model "
            "nodes must not be control nodes"
        )


def control_resources(
    control_resource: str, cluster: Mapping[str, float] | None = None
) -> dict[str, float]:
    """The `resources` option that pins a control-plane actor (coordinator, tuner,
    ingress) to the control nodes; {} when they may run anywhere.

    `cluster` is the cluster's total resources (default `ray.cluster_resources()`, which
    needs a connected Ray); it is read only for `auto` and named resources.

    Raises:
        ValueError: a named `control_resource` that no node of the cluster advertises.
    """
    if control_resource == NONE:
        return {}
    if cluster is None:
        import ray

        cluster = ray.cluster_resources()  # type: ignore[no-untyped-call]
    if control_resource == AUTO:
        return {HEAD_RESOURCE: CONTROL_SHARE} if cluster.get(HEAD_RESOURCE) else {}
    if not cluster.get(control_resource):
        custom = sorted(k for k in cluster if k not in RESERVED and not k.startswith("node:"))
        raise ValueError(
            f"control_resource {control_resource!r} is advertised by no node of the Ray "
            f"cluster (custom resources: {custom or 'none'}); start the control nodes with "
            f"`ray start --resources '{{\"{control_resource}\": 1}}'`, or set "
            "control_resource to auto (the head node) or none"
        )
    return {control_resource: CONTROL_SHARE}


def model_bundle_resources(model_resource: str | None) -> dict[str, float]:
    """What a replica's first placement-group bundle adds to its CPU / GPU: one unit of
    `model_resource` ({} when None)."""
    return {} if model_resource is None else {model_resource: 1.0}
