"""The variants and the workload of `bench_cluster.py`: the reference coordinator, the
multi-turn sessions spread over R replicas and the timed prompts cut from them.

Kept free of torch so that a coordinator actor importing `ReferenceCoordinator` from
here starts quickly.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from marconi_ray.protocol.orders import Finished, PrefillOrder
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.serve.coordinator.leases import LEASE_GRACE
from marconi_ray.serve.coordinator.routing.choose import choose_replica_reference
from marconi_ray.serve.ingress.group_key import group_of as group_of
from marconi_ray.serve.messages import Dispatch
from marconi_ray.serve.settings import ServeSettings

ID_LO, ID_HI = 7, 500
KV_BYTES, STATE_BYTES = 64, 4096
"""Byte prices of the fake replicas (the cache is big enough that nothing is evicted)."""


class ReferenceCoordinator(CacheCoordinator):
    """The coordinator with the former routing and expiry: `route` builds the view of
    every replica (`choose_replica_reference`) and each plan and heartbeat first scans
    every lease and every replica as `_expire` used to. Same state code as the indexed
    one (so it also keeps the routing index up to date)."""

    def route(self, prompt: Any) -> str:
        return choose_replica_reference(self.state, self._router, self.settings, prompt)

    def _expire(self) -> None:
        now, lease = self.clock(), self.settings.lease_s
        self.leases.scan_expired(now, lease * LEASE_GRACE)  # the former scans' cost
        [rid for rid, info in self.replica_info.items() if now - info.last_seen > lease]
        super()._expire()


VARIANTS: dict[str, type[CacheCoordinator]] = {
    "indexed": CacheCoordinator,
    "reference": ReferenceCoordinator,
}


def settings_for(model_dir: Path) -> ServeSettings:
    """A big cache (no evictions) and a long lease (fake replicas send no heartbeats)."""
    return ServeSettings(str(model_dir), "tiny", cache_bytes=10**13, lease_s=1e7)


def replica_ids(count: int) -> list[str]:
    return [f"replica-{i:03d}" for i in range(count)]


class Worker(Protocol):
    def finish(self, order: PrefillOrder, output: np.ndarray) -> Finished: ...


class Sessions:
    """`count` multi-turn sessions served by `replicas` replicas and the timed prompts
    cut from them (deterministic from `seed`: two variants built alike see the same
    prompts)."""

    def __init__(self, args: argparse.Namespace, replicas: int, count: int, seed: int = 0) -> None:
        self.args, self.rng = args, np.random.default_rng(seed)
        self.histories = [self.ids(args.first_tokens) for _ in range(count)]
        self.replicas = replicas
        self.params = SamplingParams(max_tokens=args.out_tokens, temperature=0.0, ignore_eos=True)

    def ids(self, n: int) -> np.ndarray:
        return self.rng.integers(ID_LO, ID_HI, n).astype(np.int32)

    def output(self, prompt: np.ndarray) -> np.ndarray:
        """The fake generated tokens of a prompt (deterministic)."""
        rng = np.random.default_rng(int(prompt[-8:].astype(np.int64).sum()) + len(prompt))
        return rng.integers(ID_LO, ID_HI, self.args.out_tokens).astype(np.int32)

    def warm(
        self,
        plan_batch: Callable[[list[np.ndarray]], list[Dispatch]],
        commit: Callable[[Dispatch, Finished], Any],
        worker: Worker,
        desc: str,
    ) -> None:
        """Serve every session's turns, each turn of `replicas` sessions planned before
        they commit (first turns spread one per replica, later ones stay with their
        holder); each history then gets the next user message."""
        n, step = len(self.histories), self.replicas
        batches = [
            range(i, min(i + step, n)) for _ in range(self.args.turns) for i in range(0, n, step)
        ]
        for batch in tqdm(batches, desc=desc, disable=None, leave=False):
            prompts = [self.histories[i] for i in batch]
            for i, p, d in zip(batch, prompts, plan_batch(prompts), strict=True):
                out = self.output(p)
                commit(d, worker.finish(d.order, out))
                self.histories[i] = np.concatenate([p, out, self.ids(self.args.turn_tokens)])

    def timed(self, count: int) -> list[np.ndarray]:
        """Prompts: a random session's history cut at a uniform random depth, then
        `fresh_tokens` new tokens."""
        out = []
        for _ in range(count):
            h = self.histories[int(self.rng.integers(len(self.histories)))]
            cut = int(self.rng.integers(1, len(h) + 1))
            out.append(np.concatenate([h[:cut], self.ids(self.args.fresh_tokens)]))
        return out
