"""The values of the prefix cache's request protocol: its config, a `Plan`, a
`CommitResult`, and the token-array check every entry point applies."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from marconi_ray.core.cache.admission import Checkpoint
from marconi_ray.core.cache.eviction import validate_alpha
from marconi_ray.core.cache.host_tier import NO_HOST_TIER, HostTier
from marconi_ray.core.model.cost_model import DEFAULT_EFFICIENCY, validate_efficiency
from marconi_ray.core.tree.tree_types import Node, Reclaimed, Tokens


@dataclass(frozen=True)
class CacheConfig:
    """A cache's policies and budget.

    Attributes:
        capacity_bytes: hard limit on KV + SSM bytes held.
        admission: `marconi`, `marconi+[:BLOCK]`, `fine_grained:BLOCK`,
            `fine_grained_refill:BLOCK` or `none` (see `core.cache.admission`).
        eviction: `lru` or `flop_aware`.
        alpha: weight of FLOP efficiency in `flop_aware` eviction.
        recency: `timestamp` (paper) or `inverse_age` (artifact), for `flop_aware`.
        efficiency: the FLOP-efficiency formula of `flop_aware`: `freed`, `paper`,
            `artifact` or `uniform` (`cost_model.EFFICIENCY_FORMULAS`).
        host: the host tier (`core.cache.host_tier`); its default holds 0 bytes: one tier,
            `capacity_bytes` of device memory.
    """

    capacity_bytes: int
    admission: str = "marconi"
    eviction: str = "flop_aware"
    alpha: float = 0.0
    recency: str = "timestamp"
    efficiency: str = DEFAULT_EFFICIENCY
    host: HostTier = NO_HOST_TIER

    def __post_init__(self) -> None:
        if not self.capacity_bytes > 0:
            raise ValueError(f"capacity_bytes must be > 0, got {self.capacity_bytes}")
        validate_alpha(self.alpha)
        validate_efficiency(self.efficiency)
        if not isinstance(self.host, HostTier):
            raise ValueError(f"host must be a HostTier, got {type(self.host).__name__}")


@dataclass(frozen=True)
class Plan:
    """What `plan` decided for one request (valid until its commit or abort).

    `reserved`: bytes held back for this request's states and KV until it commits or
    aborts. `freed`: what planning evicted to make that room (the caller frees it).
    """

    plan_id: int
    tokens: Tokens
    hit_len: int
    hit_node: Node
    checkpoints: tuple[Checkpoint, ...]
    reserved: int = 0
    freed: Reclaimed = field(default_factory=Reclaimed)
    hit_reason: str = ""
    """Why the hit's state was admitted ("" without a hit or when unknown)."""
    host_tokens: int = 0
    """Hit tokens whose KV was on the host tier when planned (0 in a one-tier cache)."""
    host_bytes: int = 0
    """Host bytes the hit reads (its host KV and state), promoted before its prefill
    (`freed.moves`) or, where the device had no room, read straight from the host."""
    matched_len: int = 0
    """Input tokens the tree held along the request's path when planned, with or without
    a state at their end (`hit_len` is the part a state makes reusable)."""

    @property
    def hit_state(self) -> int:
        return self.hit_node.state


@dataclass(frozen=True)
class CommitResult:
    """Outcome of a commit: admitted (depth, state id, reason), ids to free, evictions."""

    admitted: tuple[tuple[int, int, str], ...]
    rejected_states: tuple[int, ...]
    freed: Reclaimed
    dropped: int
    kv_used: tuple[int, int] = (0, 0)
    """Positions [start, end) of the committed tokens whose KV handles (from `kv`) the
    tree now holds: new edges; the caller frees the rest of `kv`."""


_INT32_MAX = int(np.iinfo(np.int32).max)


def as_tokens(tokens: object, what: str = "tokens") -> Tokens:
    """Validate a 1-D sequence of non-negative token ids and return it as int32 (the
    array itself when it already is one). ValueError names what is wrong.

    Every request walks through here several times, so the common dtypes take a short
    path: an int32 array needs one reduction (its minimum), as no int32 exceeds the
    limit; an unsigned one needs only its maximum."""
    arr = np.asarray(tokens)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{what} must be a non-empty 1-D sequence, got shape {arr.shape}")
    dtype = arr.dtype
    kind = dtype.kind
    if kind == "i" and dtype.itemsize <= 4:
        bad = arr.min() < 0
    elif kind == "u":
        bad = dtype.itemsize >= 4 and arr.max() > _INT32_MAX
    elif np.issubdtype(dtype, np.integer):
        bad = arr.min() < 0 or arr.max() > _INT32_MAX
    else:
        raise ValueError(f"{what} must be integers, got dtype {arr.dtype}")
    if bad:
        raise ValueError(f"{what} ids must be in [0, 2**31), got {arr.min()}..{arr.max()}")
    return arr.astype(np.int32, copy=False)
