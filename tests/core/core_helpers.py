"""Small builders shared by the core tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.host_tier import NO_HOST_TIER, HostTier
from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.model.cost_model import CostModel

# 1 KV token = 10 bytes, one SSM checkpoint = 100 bytes: small numbers, easy to reason about.
SMALL_COST = CostModel(
    flops_linear=1000.0, flops_quadratic=1.0, kv_bytes_per_token=10, state_bytes=100
)


def toks(*ids: int) -> npt.NDArray[np.int32]:
    return np.asarray(ids, dtype=np.int32)


def cache(
    capacity: int = 10**9,
    admission: str = "marconi",
    eviction: str = "flop_aware",
    alpha: float = 0.0,
    recency: str = "timestamp",
    cost: CostModel = SMALL_COST,
    host: HostTier = NO_HOST_TIER,
) -> PrefixCache:
    config = CacheConfig(capacity, admission, eviction, alpha, recency, host=host)
    return PrefixCache(cost, config)


@dataclass(frozen=True)
class Req:
    input_tokens: npt.NDArray[np.int32]
    output_tokens: npt.NDArray[np.int32]


def chat_requests(
    n_sessions: int, turns: int, seed: int = 0, vocab: int = 50, system_prompt: int = 6
) -> list[Req]:
    """Interleaved multi-turn sessions sharing a system prompt (branch + continuation)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, vocab, system_prompt).astype(np.int32)
    history = [prompt.copy() for _ in range(n_sessions)]
    out: list[Req] = []
    for _ in range(turns):
        for s in range(n_sessions):
            user = rng.integers(0, vocab, int(rng.integers(1, 12))).astype(np.int32)
            inp = np.concatenate([history[s], user])
            reply = rng.integers(0, vocab, int(rng.integers(1, 8))).astype(np.int32)
            out.append(Req(inp, reply))
            history[s] = np.concatenate([inp, reply])
    return out
