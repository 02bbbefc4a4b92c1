"""`LocalCluster`: a multi-node Ray cluster on this one machine (a head raylet and worker
raylets, `ray.cluster_utils.Cluster`), for node-loss runs (`benchmarks/node_loss.py`,
`tests/serve/test_node_loss.py`).

The head is the control node (Ray gives it `node:__internal_head__`); every worker
advertises `model_resource` (one unit per replica it may hold). Killing a worker's raylet
(`kill_worker`) is how a node is lost: its processes die with it, and the GCS marks it
dead after missing its health checks (`fast_detection`: about 1.5 s instead of Ray's
default of about 15 s). CPUs are logical: they may exceed the machine's cores.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

import ray

FAST_DETECTION = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
"""GCS health checks that declare a silent raylet dead after about 1.5 s."""


@dataclass(frozen=True)
class ClusterSpec:
    """The cluster's shape.

    Attributes:
        head_cpus: logical CPUs of the head (the ingress takes one; tuner tasks the rest).
        workers: worker nodes; worker_cpus: logical CPUs of each (a tp-1 replica takes
            one; tuner tasks the rest).
        model_resource: the custom resource each worker advertises, `model_slots` units
            (replicas it may hold).
        fast_detection: shorten the GCS health checks (`FAST_DETECTION`).
    """

    head_cpus: int = 3
    workers: int = 2
    worker_cpus: int = 2
    model_resource: str = "marconi_model"
    model_slots: int = 1
    fast_detection: bool = True

    def __post_init__(self) -> None:
        if self.head_cpus < 1 or self.workers < 1 or self.worker_cpus < 1:
            raise ValueError(f"every node needs >= 1 CPU and >= 1 worker node: {self}")
        if self.model_slots < 1:
            raise ValueError(f"model_slots must be >= 1, got {self.model_slots}")


class LocalCluster:
    """Start the cluster and connect this process to it (`namespace`); `close` (or the
    `with` block's end) disconnects and stops every raylet, also after a failure."""

    def __init__(self, spec: ClusterSpec, namespace: str) -> None:
        from ray.cluster_utils import Cluster

        head_args: dict[str, Any] = {"num_cpus": spec.head_cpus, "include_dashboard": False}
        if spec.fast_detection:
            head_args["_system_config"] = dict(FAST_DETECTION)
        self.spec = spec
        self.cluster = Cluster(initialize_head=True, head_node_args=head_args)
        try:
            self.workers = [
                self.cluster.add_node(
                    num_cpus=spec.worker_cpus, resources={spec.model_resource: spec.model_slots}
                )
                for _ in range(spec.workers)
            ]
            self.cluster.wait_for_nodes()
            ray.init(address=self.cluster.address, namespace=namespace, log_to_driver=False)
        except BaseException:
            self.cluster.shutdown()
            raise
        self.killed: list[str] = []

    @property
    def head_id(self) -> str:
        return str(self.cluster.head_node.node_id)

    @property
    def worker_ids(self) -> list[str]:
        return [str(w.node_id) for w in self.workers]

    def kill_worker(self, node_id: str) -> float:
        """SIGKILL the raylet of worker `node_id` (its processes die with it); returns
        the `time.monotonic()` of the kill."""
        (node,) = [w for w in self.workers if w.node_id == node_id]
        node.kill_raylet()
        self.killed.append(node_id)
        return time.monotonic()

    def wait_dead(self, node_id: str, timeout_s: float = 60.0) -> float:
        """Seconds until the GCS reports `node_id` dead (TimeoutError after `timeout_s`)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes()):
                return time.monotonic() - t0
            time.sleep(0.1)
        raise TimeoutError(f"node {node_id} still alive after {timeout_s} s")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            ray.shutdown()
        self.cluster.shutdown()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def actor_nodes(class_name: str) -> dict[str, str]:
    """Name -> node id of every live actor of `class_name` (the GCS actor table; works
    without the dashboard). Serve replica actors are named
    `SERVE_REPLICA::<app>#<deployment>#<replica id>`."""
    from ray._private.state import actors

    out: dict[str, str] = {}
    for info in actors().values():
        if info.get("ActorClassName", "").endswith(class_name) and info["State"] == "ALIVE":
            out[str(info.get("Name", ""))] = str(info["Address"]["NodeID"])
    return out
