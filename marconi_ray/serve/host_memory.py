"""Free host memory for the prefix cache's host tier (`host_cache_bytes`), checked at start.

`host_cache_bytes` is per replica and per tensor-parallel rank: every shard process keeps
its own shard's host copies, and a replica's shards share one node (its placement group
is STRICT_PACK), so one replica may take `tp x host_cache_bytes` of its node's memory.
A start is refused when no node can give it that much, twice:

- on the driver, before any actor starts (`check_model_nodes`, called by
  `app.start_actors`): one tiny Ray task per node a replica may run on reads its free
  memory; refused when even the node with the most cannot hold one replica's share
  (no such node alive yet: left to the shards);
- in every shard at set-up, before the model loads (`check_this_node`): its own node.

Free memory is the kernel's MemAvailable (`/proc/meminfo`: what can be allocated
without swapping). Where it cannot be read (not Linux) the check is skipped, with a
warning. Replicas that share a node each check at their own start against what is free
then, and their host pools fill as the cache demotes, so such a node needs
`replicas on it x tp x host_cache_bytes` (`model_resource` bounds how many replicas a
node holds).
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any, Final

log = logging.getLogger(__name__)

MEMINFO: Final = Path("/proc/meminfo")
PROBE_TIMEOUT_S: Final = 60.0
"""How long the driver waits for the nodes' free memory (nodes that do not answer in
time are left to their shards' own check)."""


def mem_available(meminfo: Path = MEMINFO) -> int | None:
    """This node's free memory in bytes (MemAvailable), or None when it cannot be read."""
    try:
        lines = meminfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key == "MemAvailable":
            number, _, unit = value.strip().partition(" ")
            scale = 1024 if unit.strip().lower() == "kb" else 1
            try:
                return int(number) * scale
            except ValueError:
                return None
    return None


def check_host_memory(host_cache_bytes: int, ranks: int, available: int, node: str) -> None:
    """Refuse a host tier that one replica (`ranks` shards of `host_cache_bytes` each) cannot
    have on `node`, whose free memory is `available` bytes: ValueError naming both."""
    needed = host_cache_bytes * ranks
    if needed <= available:
        return
    share = f"host_cache_bytes={host_cache_bytes}"
    if ranks > 1:
        share += f" x {ranks} ranks = {needed} bytes"
    raise ValueError(
        f"{share} exceeds the {available} bytes of free memory (MemAvailable) on node {node}"
    )


def node_name() -> str:
    """The name errors give this node (its hostname)."""
    return socket.gethostname()


def check_this_node(host_cache_bytes: int, ranks: int) -> None:
    """`check_host_memory` against this node's free memory (skipped, with a warning, where
    it cannot be read); nothing to check without a host tier."""
    if host_cache_bytes <= 0:
        return
    available = mem_available()
    if available is None:
        log.warning("free memory unknown (no %s): host_cache_bytes not checked", MEMINFO)
        return
    check_host_memory(host_cache_bytes, ranks, available, node_name())


def _node_free_memory() -> tuple[str, int | None]:
    """Run on a node: its name and free memory."""
    return node_name(), mem_available()


def model_node_ids(nodes: list[dict[str, Any]], model_resource: str | None, gpu: bool) -> list[str]:
    """The ids of the alive nodes (entries of `ray.nodes()`) a replica may run on: those
    advertising `model_resource` when set, and a GPU when the shards need one."""
    out = []
    for node in nodes:
        resources = node.get("Resources", {})
        if not node.get("Alive", False):
            continue
        if model_resource is not None and resources.get(model_resource, 0) <= 0:
            continue
        if gpu and resources.get("GPU", 0) <= 0:
            continue
        out.append(str(node["NodeID"]))
    return out


def free_memory_of(node_ids: list[str], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, int]:
    """Node name -> free memory, read by one task (no CPU) pinned to each node; nodes that
    do not answer within `timeout_s` or cannot tell are left out."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = ray.remote(num_cpus=0, max_retries=0)(_node_free_memory)
    refs = [
        probe.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote()
        for nid in node_ids
    ]
    ready, late = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    for ref in late:
        ray.cancel(ref, force=True)
    out = {}
    for name, available in ray.get(ready):
        if available is not None:
            out[name] = available
    return out


def check_model_nodes(
    host_cache_bytes: int, ranks: int, model_resource: str | None, gpu: bool
) -> None:
    """Refuse (ValueError naming both numbers and the node) a host tier that no node a
    replica may run on can hold for one replica; needs a connected Ray. Nothing to check
    without a host tier, or while no such node is alive (the shards check at start)."""
    if host_cache_bytes <= 0:
        return
    import ray

    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    ids = model_node_ids(nodes, model_resource, gpu)
    free = free_memory_of(ids) if ids else {}
    if not free:
        log.warning("no model node reported its free memory: host_cache_bytes checked by shards")
        return
    node, most = max(free.items(), key=lambda item: item[1])
    where = node if len(free) == 1 else f"{node} (the most of any of {len(free)} model nodes)"
    check_host_memory(host_cache_bytes, ranks, most, where)
