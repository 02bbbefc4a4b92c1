"""`CacheCoordinator`: the named Ray actor that owns every replica's prefix cache.

It is the only writer of tree metadata. Ray runs one method at a time on it (a plain,
synchronous actor), so concurrent requests for the same prefix are serialised: two plans
can never both admit the same node or corrupt one. Tensors never come here: replicas
report what they stored (state ids, KV slot ids) and receive what to free.

Routing (`plan`): each replica's usable hit (the longest state-backed cached prefix) is
weighed against its queue: score = hit_tokens - route_load_weight * in_flight; the best
score wins (ties: fewer in flight, then registration order).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import numpy.typing as npt
import ray

from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.hf_config import spec_from_hf_config
from marconi_ray.core.invariants import check_tree
from marconi_ray.core.tuner import TuneJob, TunerConfig, TuneResult
from marconi_ray.engine.engine import torch_dtype
from marconi_ray.engine.loader import read_config
from marconi_ray.engine.orders import Finished, Release
from marconi_ray.engine.planner import Planner
from marconi_ray.engine.sampling import SamplingParams
from marconi_ray.serve.messages import Dispatch, ReplicaStats
from marconi_ray.serve.settings import NAMESPACE, ServeSettings


class CacheCoordinator:
    """One `Planner` (prefix cache + bootstrap tuner) per registered replica."""

    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        cfg, raw = read_config(settings.model_dir)
        self.max_position = cfg.max_position
        spec = spec_from_hf_config(raw, dtype_bytes=torch_dtype(settings.dtype).itemsize)
        self.flops = spec.flops_coeffs()
        self.planners: dict[str, Planner] = {}
        self._next_request = 0
        self._tuner: Any = None
        self._queued: dict[str, Release] = {}

    # ------------------------------------------------------------------ replicas
    def register_replica(self, replica_id: str, kv_bytes_per_token: int, state_bytes: int) -> None:
        """Give a replica its own empty cache; its bytes are priced as its rank-0 shard's
        store holds them (every rank of a replica holds the same amount)."""
        if replica_id in self.planners:
            return
        s = self.settings
        t = s.tuner
        self.planners[replica_id] = Planner.for_system(
            s.system,
            self.flops,
            kv_bytes_per_token,
            state_bytes,
            s.cache_bytes,
            self.max_position,
            s.alpha,
            TunerConfig(t.multiplier, t.grid, retune_every=t.retune_every),
            on_tune_job=functools.partial(self._send_job, replica_id),
        )

    def unregister_replica(self, replica_id: str) -> None:
        """Forget a replica and its cache (its tensors died with it)."""
        self.planners.pop(replica_id, None)

    def replicas(self) -> list[str]:
        return list(self.planners)

    # ------------------------------------------------------------------ requests
    def route(self, prompt: npt.NDArray[np.int32]) -> str:
        """The replica whose usable cached prefix, net of its queue, is the best."""
        if not self.planners:
            raise RuntimeError("no model replica is registered yet")
        weight = self.settings.route_load_weight
        best: tuple[float, int, int] | None = None
        chosen = ""
        for order, (rid, planner) in enumerate(self.planners.items()):
            hit = planner.cache.lookup(prompt)
            load = planner.open_requests
            key = (hit - weight * load, -load, -order)
            if best is None or key > best:
                best, chosen = key, rid
        return chosen

    def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float = 0.0
    ) -> Dispatch:
        """Route and plan one validated request (match, checkpoints, reservation, lock)."""
        prompt = np.asarray(prompt, dtype=np.int32)
        replica_id = self.route(prompt)
        rid = self._next_request
        self._next_request += 1
        order, release = self.planners[replica_id].order(rid, prompt, params, submitted)
        return Dispatch(replica_id, order, release)

    def commit(self, replica_id: str, done: Finished) -> Release:
        """Admit what the cache keeps of a finished request; returns what to free. A
        commit that cannot be applied aborts the request instead (nothing is cached)."""
        planner = self.planners.get(replica_id)
        if planner is None:
            return Release(tuple(done.state_ids.values()), done.kv_slots)
        try:
            release = planner.commit(done)
        except (RuntimeError, ValueError):
            release = planner.abort(done.request_id, done)
        return release + self.drain(replica_id)

    def abort(self, replica_id: str, request_id: int, done: Finished | None = None) -> Release:
        """Release a request's plan (and what it stored, if it finished)."""
        planner = self.planners.get(replica_id)
        if planner is None:
            return (
                Release()
                if done is None
                else Release(tuple(done.state_ids.values()), done.kv_slots)
            )
        return planner.abort(request_id, done)

    def abandon(self, dispatch: Dispatch) -> None:
        """A dispatch never reached its replica: release its plan, and queue what the
        replica must free (what planning evicted, what the abort tidied) for its next
        `commit` or `drain`."""
        rid = dispatch.replica_id
        release = self.abort(rid, dispatch.order.request_id) + dispatch.release
        if rid in self.planners:
            self._queued[rid] = self._queued.get(rid, Release()) + release

    def drain(self, replica_id: str) -> Release:
        """What was released on a replica's behalf since its last commit or drain."""
        return self._queued.pop(replica_id, Release())

    # ------------------------------------------------------------------ tuning
    def _send_job(self, replica_id: str, job: TuneJob) -> None:
        if self._tuner is None:
            self._tuner = ray.get_actor(self.settings.tuner_name, namespace=NAMESPACE)
        self._tuner.tune.remote(replica_id, job)

    def adopt(self, replica_id: str, result: TuneResult) -> None:
        """Apply the tuner actor's winning alpha to a replica's cache."""
        planner = self.planners.get(replica_id)
        if planner is not None and planner.tuner is not None:
            planner.adopt(result)

    def tuner_runs(self) -> int:
        return sum(len(p.tuner.history) for p in self.planners.values() if p.tuner is not None)

    # ------------------------------------------------------------------ views
    def stats(self) -> list[ReplicaStats]:
        out = []
        for rid, planner in self.planners.items():
            runs = 0 if planner.tuner is None else len(planner.tuner.history)
            out.append(ReplicaStats.of(rid, planner.cache, planner.open_requests, runs))
        return out

    def cost(self, replica_id: str) -> CostModel:
        """The cost model a replica's cache prices FLOPs and bytes with."""
        return self.planners[replica_id].cache.cost

    def check_invariants(self) -> int:
        """Full-scan check of every replica's tree (radix shape, byte totals, locks);
        raises AssertionError on a violation. Returns the number of nodes checked."""
        total = 0
        for planner in self.planners.values():
            check_tree(planner.cache.tree)
            assert planner.cache.bytes_used + planner.cache.reserved <= planner.cache.capacity
            total += len(planner.cache.tree.iter_nodes())
        return total

    def locked_nodes(self, replica_id: str) -> int:
        """Nodes of a replica's tree held by a lock (0 when no request is in flight)."""
        return sum(n.lock > 0 for n in self.planners[replica_id].cache.tree.iter_nodes())
