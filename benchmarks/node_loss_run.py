"""The steps of a node-loss run on a deployed service (`node_loss.run_node_loss` puts them
together): where everything runs, caches filled until they evict, closed-loop load with
one worker's raylet killed under it, and the check of every answer against an
uninterrupted greedy run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import ray
from local_cluster import LocalCluster, actor_nodes
from node_loss_client import USER_TOKENS, ClosedLoopClients, Outcome, Session

from marconi_ray.serve.ingress.group_key import group_of

FILLER_TOKENS = 2000


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll `cond` every 0.2 s; TimeoutError naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} (after {timeout_s:.0f} s)")
        time.sleep(0.2)


def health(url: str) -> dict[str, Any] | None:
    """`GET /health`'s report, or None when it is not a 200."""
    try:
        resp = httpx.get(f"{url}/health", timeout=5)
    except httpx.HTTPError:
        return None
    return resp.json() if resp.status_code == 200 else None


class HealthWatch(threading.Thread):
    """Polls /health from `start()` until `done` is set; `alone_at`: when it first
    reported one live and one registered replica (`time.monotonic()`)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="node-loss-health", daemon=True)
        self.url = url
        self.alone_at: float | None = None
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set() and self.alone_at is None:
            report = health(self.url)
            if report and report["replicas"] == 1 and report["registered"] == 1:
                self.alone_at = time.monotonic()
            self.done.wait(0.1)


def placement(cluster: LocalCluster) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """(node id -> label `head` / `worker-i`, replica id -> node id, where each actor
    runs by label)."""
    labels = {cluster.head_id: "head"} | {
        n: f"worker-{i}" for i, n in enumerate(cluster.worker_ids)
    }
    replicas = {name.rsplit("#", 1)[-1]: n for name, n in actor_nodes("ModelReplica").items()}
    where = {
        "coordinator": [labels[n] for n in actor_nodes("CacheCoordinator").values()],
        "tuner": [labels[n] for n in actor_nodes("TunerActor").values()],
        "ingress": [labels[n] for n in actor_nodes("OpenAIIngress").values()],
        "replicas": {labels[n]: rid for rid, n in replicas.items()},
    }
    return labels, replicas, where


def fill_caches(url: str, cache_bytes: int, kv_bytes_per_token: int, seed: int) -> None:
    """One-token requests with long unique prompts, 4 at a time, 2.5x what both caches
    hold: they fill them, so evictions start (and with them the tuner's window)."""
    n = -(-5 * cache_bytes // (FILLER_TOKENS * kv_bytes_per_token))
    rng = np.random.default_rng([seed, 99])
    prompts = [rng.integers(300, 500, FILLER_TOKENS).tolist() for _ in range(n)]
    body = {"model": "tiny", "max_tokens": 1, "temperature": 0.0, "ignore_eos": True}

    def send(prompt: list[int]) -> None:
        httpx.post(f"{url}/v1/completions", json={**body, "prompt": prompt}, timeout=120)

    for i in range(0, n, 4):
        threads = [threading.Thread(target=send, args=(p,)) for p in prompts[i : i + 4]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


@dataclass(frozen=True)
class Control:
    """The coordinators of the group (by index), their tuners, and the group key."""

    coordinators: list[Any]
    tuners: list[Any]
    key_tokens: int

    def stats(self) -> dict[str, dict[str, Any]]:
        """Replica id -> its cache counters (`CacheStats.to_dict()`), every coordinator's."""
        parts = ray.get([c.stats.remote() for c in self.coordinators])
        return {s.replica_id: dict(s.stats) for part in parts for s in part}

    def registered(self) -> int:
        return sum(len(r) for r in ray.get([c.replicas.remote() for c in self.coordinators]))

    def tuner_runs(self) -> int:
        return sum(ray.get([t.runs.remote() for t in self.tuners]))

    def tuner_history(self) -> list[Any]:
        return [h for part in ray.get([t.history.remote() for t in self.tuners]) for h in part]

    def homes(self, pool: list[Session]) -> dict[int, str]:
        """The replica each session's next turn is routed to (the one holding its last
        state: cache-aware routing keeps a session there), at the coordinator its group
        key picks."""
        k = len(self.coordinators)
        prompts = [np.asarray(s.history + [7] * USER_TOKENS, np.int32) for s in pool]
        chosen = ray.get(
            [self.coordinators[group_of(p, k, self.key_tokens)].route.remote(p) for p in prompts]
        )
        return {s.sid: str(rid) for s, rid in zip(pool, chosen, strict=True)}


def pick_victim(home: dict[int, str], replicas: dict[str, str]) -> str:
    """The replica whose node is lost: the one with fewer sessions (both must hold some)."""
    counts = {rid: sum(h == rid for h in home.values()) for rid in replicas}
    if len(counts) != 2 or min(counts.values()) == 0:
        raise RuntimeError(f"sessions per replica {counts}: need two replicas with sessions")
    return min(counts, key=lambda rid: (counts[rid], rid))


@dataclass(frozen=True)
class Timeline:
    """When things happened (`time.monotonic()`) and the coordinator's counters then."""

    t_warm: float
    t_kill: float
    node_dead_s: float
    health_at: float | None
    victim: str
    survivor: str
    homes: dict[int, str]
    stats_warm: dict[str, dict[str, Any]]
    stats_kill: dict[str, dict[str, Any]]
    stats_end: dict[str, dict[str, Any]]


def load_and_kill(
    cluster: LocalCluster,
    url: str,
    control: Control,
    pool: list[Session],
    replicas: dict[str, str],
    config: dict[str, Any],
) -> tuple[list[Outcome], Timeline]:
    """Run the clients: until every session has `warm_turns` turns and the tuner has run
    once per replica, then `before_s` seconds, then kill the raylet of the replica with
    fewer sessions (once a streamed request of one of its sessions is open) and go on
    for `after_s` seconds after the GCS declared it dead."""
    load = ClosedLoopClients(
        f"{url}/v1/completions", "tiny", pool, config["clients"], config["max_tokens"]
    ).start()
    watch = HealthWatch(url)
    try:
        wait_for(lambda: min(s.turns for s in pool) >= config["warm_turns"], 180, "warm-up")
        wait_for(lambda: control.tuner_runs() >= 2, 60, "a tuner run per replica")
        t_warm, stats_warm = time.monotonic(), control.stats()
        time.sleep(config["before_s"])
        home = control.homes(pool)
        victim = pick_victim(home, replicas)
        lost = {sid for sid, rid in home.items() if rid == victim}
        stats_kill = control.stats()  # first: nothing delays the kill once a request is open
        watch.start()
        _until_in_flight(load, lost)
        t_kill = cluster.kill_worker(replicas[victim])
        node_dead_s = cluster.wait_dead(replicas[victim])
        time.sleep(config["after_s"])
    finally:
        load.stop()
        watch.done.set()
    timeline = Timeline(
        t_warm=t_warm,
        t_kill=t_kill,
        node_dead_s=node_dead_s,
        health_at=watch.alone_at,
        victim=victim,
        survivor=next(r for r in replicas if r != victim),
        homes=home,
        stats_warm=stats_warm,
        stats_kill=stats_kill,
        stats_end=control.stats(),
    )
    return load.snapshot(), timeline


def _until_in_flight(load: ClosedLoopClients, sids: set[int], timeout_s: float = 10.0) -> None:
    """Return once a request of one of `sids` is open: a streamed one if that comes
    within `timeout_s`, any after it; at the latest after `3 * timeout_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 3 * timeout_s:
        open_now = [s for s in load.in_flight() if s.sid in sids]
        if any(s.stream for s in open_now) or (open_now and time.monotonic() - t0 > timeout_s):
            return
        time.sleep(0.005)


def mismatches(model_dir: Path, outcomes: list[Outcome], max_tokens: int) -> int:
    """How many ok outcomes differ from an uninterrupted greedy run of their prompt (the
    in-process engine, no cache)."""
    import torch

    from marconi_ray.engine.engine import Engine
    from marconi_ray.protocol.sampling import SamplingParams

    torch.set_num_threads(1)
    engine = Engine(model_dir, system="vanilla", cache_bytes=10**8)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    return sum(
        tuple(engine.generate(list(o.prompt), params).tokens) != o.output
        for o in outcomes
        if o.kind == "ok"
    )
