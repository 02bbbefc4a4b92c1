"""Radix tree value types: nodes, match results, what a mutation frees."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Tokens = npt.NDArray[np.int32]
KVHandle = Any  # an opaque sliceable per-token handle (e.g. KV slot ids), or None
NO_STATE = -1


class Node:
    """One radix tree node. `state` is the SSM checkpoint id, or NO_STATE.

    Tiers (a two-tier cache, `core.cache.host_tier`): `host` is None when every KV token of the
    edge is on the device, else a bool array as long as the edge, True where that
    token's KV is on the host (a merge can join edges of both tiers); `state_host` is
    True when the state is on the host (False when there is no state).

    Invariant: `key == edge.tobytes()` with `edge` int32 (the setter keeps them equal), so
    a walk compares an edge with a slice of the input's bytes (one memcmp) instead of
    three numpy calls per node."""

    __slots__ = (
        "_edge",
        "children",
        "depth",
        "host",
        "key",
        "kv",
        "lock",
        "parent",
        "slot",
        "state",
        "state_host",
    )

    def __init__(
        self,
        parent: Node | None,
        edge: Tokens,
        kv: KVHandle,
        depth: int,
        slot: int,
        key: bytes | None = None,
        state: int = NO_STATE,
    ) -> None:
        """`key`: `edge.tobytes()` when the caller has it (then `edge` must already be a
        1-D int32 array); None computes it."""
        self.parent = parent
        if key is None:
            self.edge = edge
        else:
            self._edge = edge
            self.key = key
        self.kv = kv
        self.depth = depth
        self.slot = slot
        self.state = state
        self.lock = 0
        self.children: dict[int, Node] = {}
        self.host: npt.NDArray[np.bool_] | None = None
        self.state_host = False

    @property
    def host_tokens(self) -> int:
        """Edge tokens whose KV is on the host."""
        return 0 if self.host is None else int(np.count_nonzero(self.host))

    @property
    def edge(self) -> Tokens:
        """The tokens on the edge from the parent to this node (int32)."""
        return self._edge

    @edge.setter
    def edge(self, edge: Tokens) -> None:
        self._edge = np.asarray(edge, dtype=np.int32)
        self.key = self._edge.tobytes()

    def __repr__(self) -> str:
        return f"Node(depth={self.depth}, edge_len={len(self.edge)}, state={self.state})"


@dataclass(frozen=True)
class Match:
    """Result of walking a token sequence down the tree.

    Attributes:
        hit_node: deepest fully matched node holding a state (the root when none).
        hit_len: tokens reusable from the cache = hit_node.depth.
        matched_len: tokens present in the tree along the path, partial edge included.
        path: fully matched non-root nodes, root to leaf order.
        partial: the child whose edge matched only partly (or where the input ended
            inside the edge), else None.
    """

    hit_node: Node
    hit_len: int
    matched_len: int
    path: tuple[Node, ...]
    partial: Node | None

    @property
    def attach_node(self) -> Node:
        """The deepest node touched by the walk: where new tokens would attach."""
        if self.partial is not None:
            return self.partial
        return self.path[-1] if self.path else self.hit_node

    def node_above(self, depth: int) -> Node | None:
        """The deepest node of `path` shallower than `depth` (None when none is: the
        root), e.g. where an insert of the walked tokens can start (`RadixTree.insert`)."""
        for node in reversed(self.path):
            if node.depth < depth:
                return node
        return None


@dataclass(frozen=True)
class TierMove:
    """State ids and KV handles a mutation moved to the host (`to_host`) or back to the
    device; their ids stay the same. `n_bytes`: what the copy moves."""

    to_host: bool
    states: tuple[int, ...]
    kv: tuple[KVHandle, ...]
    n_bytes: int


@dataclass
class Reclaimed:
    """What a cache mutation reclaimed (evicted, rejected or merged away): state ids and
    KV handles the state store must free, and before that, in order, the tier moves it
    made (`moves`). The planner turns it into the worker's `protocol.orders.Release`."""

    states: list[int] = field(default_factory=list)
    kv: list[KVHandle] = field(default_factory=list)
    n_tokens: int = 0
    moves: list[TierMove] = field(default_factory=list)

    def extend(self, other: Reclaimed) -> None:
        self.states.extend(other.states)
        self.kv.extend(other.kv)
        self.n_tokens += other.n_tokens
        self.moves.extend(other.moves)


def common_prefix_len(a: Tokens, b: Tokens) -> int:
    """Length of the longest common prefix of two 1-D token arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = a[:n] != b[:n]
    first = int(differ.argmax())  # the first True, or 0 when none is
    return first if differ[first] else n


def tokens_bytes(tokens: Tokens) -> bytes:
    """`tokens` as int32 bytes (4 per token), comparable with `Node.key` slices."""
    return np.ascontiguousarray(tokens, dtype=np.int32).tobytes()
