"""`EngineEndpoint`: an in-process `Engine` in a Ray actor whose cache entries move to
and from other endpoints (`EntryEndpoint`). The transfer benchmark and the transfer
tests run the real engine, store and cache on both sides of a move through it; a
replica's shard actor mixes the same `EntryEndpoint` in."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from marconi_ray.engine.engine import Engine
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.replica.entry_endpoint import EntryEndpoint, EntryEngine


class EngineEndpoint(EntryEndpoint):
    """An `Engine` (keyword arguments as `Engine`'s) behind Ray: `generate` runs greedy
    requests, `export_*` / `import_entry` move its entries, `accounting` tells whether
    its store holds exactly what its cache accounts."""

    def __init__(self, model_dir: str, **engine_kw: Any) -> None:
        torch.set_num_threads(1)
        self.engine = Engine(model_dir, **engine_kw)

    def _entry_engine(self) -> EntryEngine:
        return self.engine

    def generate(self, tokens: list[int], max_tokens: int) -> tuple[list[int], int]:
        """Greedy tokens for `tokens` and how many of its tokens came from the cache."""
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        got = self.engine.generate(tokens, params)
        return list(got.tokens), got.usage.cached_tokens

    def accounting(self) -> dict[str, int]:
        """The store's bytes, the cache's, the cache's open plans and whether the store's
        state ids and slots are exactly those the cache references (1) or not (0); raises
        AssertionError when the store's own invariant is broken."""
        store, cache = self.engine.store, self.engine.cache
        store.check()
        states, slots = cache.referenced()
        same = set(store.state_ids()) == states and set(store.used_slots().tolist()) == slots
        return {
            "store_bytes": int(store.bytes_used),
            "cache_bytes": int(cache.bytes_used),
            "open_plans": int(cache.open_plans),
            "exact": int(same),
        }

    def fill(self, nbytes: int, seed: int) -> npt.NDArray[np.int32]:
        """Serve one random prompt long enough that its cached entry holds about
        `nbytes` (KV and state), for a benchmark to move; returns prompt + output."""
        store = self.engine.store
        per_token = max(store.kv_bytes_per_token, 1)
        n = max(8, (nbytes - store.state_bytes) // per_token)
        rng = np.random.default_rng(seed)
        prompt = rng.integers(3, self.engine.config.vocab_size, int(n)).tolist()
        out, _ = self.generate(prompt, 2)
        return np.asarray(prompt + out, dtype=np.int32)
