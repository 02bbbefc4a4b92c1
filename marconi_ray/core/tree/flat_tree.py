"""A radix tree as columns (`FlatTree`, its snapshot form) and the checks of such
columns against each other (`RadixTree.flatten` / `RadixTree.from_flat` use them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from marconi_ray.core.tree.tree_types import NO_STATE, KVHandle, Node, Tokens


@dataclass(frozen=True)
class FlatTree:
    """A radix tree as columns (its snapshot form). Nodes are listed root first, in
    pre-order with children in their insertion order, so a parent precedes its children.

    Attributes:
        parent: int64[N], each node's parent index (-1 for the root, else < its own).
        slot: int64[N], each node's node-table slot.
        edge_len: int64[N], tokens on each edge (0 for the root).
        edges: int32[sum(edge_len)], the edges' tokens, concatenated in node order.
        has_kv: bool[N], whether a node's KV handle is an array (else None).
        kv: int64[sum(edge_len[has_kv])], those KV handles, concatenated.
        state: int64[N], SSM state id or NO_STATE.
        lock: int64[N], lock counts.
        last_access: float64[N], the nodes' last access times.
        n_slots: the node table's size.
        free: int64[n_slots - N], its free slots, in the order they are handed out last.
        host: bool[sum(edge_len)], per edge token: its KV is on the host tier.
        state_host: bool[N], a node's state is on the host tier (False without one).
    """

    parent: npt.NDArray[np.int64]
    slot: npt.NDArray[np.int64]
    edge_len: npt.NDArray[np.int64]
    edges: npt.NDArray[np.int32]
    has_kv: npt.NDArray[np.bool_]
    kv: npt.NDArray[np.int64]
    state: npt.NDArray[np.int64]
    lock: npt.NDArray[np.int64]
    last_access: npt.NDArray[np.float64]
    n_slots: int
    free: npt.NDArray[np.int64]
    host: npt.NDArray[np.bool_]
    state_host: npt.NDArray[np.bool_]


_INT64 = np.dtype(np.int64)
"""The native int64 dtype (an identity test is the cheap one; other int64 dtypes, e.g.
byte-swapped, take the checked path)."""


def kv_column(kv: KVHandle, edge: Tokens, node: Node) -> npt.NDArray[np.int64]:
    """`node`'s KV handle `kv` as an int64 column; ValueError unless it is a 1-D integer
    array (castable to int64) as long as the node's `edge`."""
    if type(kv) is np.ndarray and kv.dtype is _INT64 and kv.ndim == 1 and len(kv) == len(edge):
        return kv  # the usual handle, as a worker reports it: nothing to check or cast
    arr = np.asarray(kv)
    if (
        arr.ndim != 1
        or len(arr) != len(edge)
        or arr.dtype.kind not in "iu"
        or not np.can_cast(arr.dtype, np.int64)
    ):
        raise ValueError(
            f"{node!r}: KV handle must be None or a 1-D integer array as long as the edge, "
            f"got dtype {arr.dtype} shape {arr.shape}"
        )
    return arr.astype(np.int64, copy=False)


_FLAT_DTYPES = {
    "parent": np.int64,
    "slot": np.int64,
    "edge_len": np.int64,
    "edges": np.int32,
    "has_kv": np.bool_,
    "kv": np.int64,
    "state": np.int64,
    "lock": np.int64,
    "last_access": np.float64,
    "free": np.int64,
    "host": np.bool_,
    "state_host": np.bool_,
}
_PER_NODE = ("slot", "edge_len", "has_kv", "state", "lock", "last_access", "state_host")


def check_flat(flat: FlatTree) -> int:
    """Validate `flat`'s columns against each other; return the node count."""
    for name, dtype in _FLAT_DTYPES.items():
        column = getattr(flat, name)
        if not isinstance(column, np.ndarray) or column.ndim != 1 or column.dtype != dtype:
            raise ValueError(f"tree column {name!r} must be a 1-D {np.dtype(dtype)} array")
    n = len(flat.parent)
    if n == 0:
        raise ValueError("the tree has no root")
    for name in _PER_NODE:
        rows = len(getattr(flat, name))
        if rows != n:
            raise ValueError(f"tree column {name!r} has {rows} rows, expected {n}")
    if flat.parent[0] != -1:
        raise ValueError(f"the root (node 0) must have parent -1, got {flat.parent[0]}")
    bad = np.flatnonzero((flat.parent[1:] < 0) | (flat.parent[1:] >= np.arange(1, n))) + 1
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"node {i} has parent index {flat.parent[i]}, not in [0, {i})")
    if flat.edge_len[0] != 0 or flat.has_kv[0] or flat.state[0] != NO_STATE or flat.lock[0]:
        raise ValueError("the root must have an empty edge, no KV, no state and no lock")
    if n > 1 and flat.edge_len[1:].min() < 1:
        raise ValueError(f"node {int(np.argmin(flat.edge_len[1:])) + 1} has an empty edge")
    if flat.edge_len.max() > len(flat.edges) or len(flat.edges) != int(flat.edge_len.sum()):
        raise ValueError(f"{len(flat.edges)} edge tokens, but edge lengths sum to another count")
    if len(flat.edges) and flat.edges.min() < 0:
        raise ValueError("edge tokens must be >= 0")
    if len(flat.host) != len(flat.edges):
        raise ValueError(f"{len(flat.host)} host flags for {len(flat.edges)} edge tokens")
    if (flat.state_host & (flat.state == NO_STATE)).any():
        raise ValueError("a node without a state has its state on the host")
    if len(flat.kv) != int(flat.edge_len[flat.has_kv].sum()):
        raise ValueError(f"{len(flat.kv)} KV entries, but KV-holding edges hold another count")
    if flat.state.min() < NO_STATE:
        raise ValueError(f"state ids must be >= 0 (or {NO_STATE}: none)")
    held = flat.state[flat.state != NO_STATE]
    if len(np.unique(held)) != len(held):
        raise ValueError("a state id is held by two nodes")
    if flat.lock.min() < 0:
        raise ValueError("lock counts must be >= 0")
    if not np.isfinite(flat.last_access).all():
        raise ValueError("last access times must be finite")
    if flat.n_slots != n + len(flat.free):
        raise ValueError(f"n_slots {flat.n_slots} != {n} nodes + {len(flat.free)} free slots")
    if not np.array_equal(np.sort(np.concatenate([flat.slot, flat.free])), np.arange(flat.n_slots)):
        raise ValueError(f"node and free slots must be range({flat.n_slots}), each used once")
    return n
