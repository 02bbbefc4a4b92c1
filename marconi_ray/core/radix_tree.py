"""Radix tree of cached token sequences with SSM checkpoints on some of its nodes.

Each non-root node owns the KV of its edge tokens (every attention layer) and, optionally,
one SSM checkpoint: the SSM + conv state after the last token of its edge, i.e. after
`depth` tokens. A prefix `t[:h]` is reusable ("a hit of length h") iff the node at depth
h on t's path holds a state: attention needs the KV of every edge above it, which the
tree always has, and the SSM layers need exactly that state.

Invariants (all checked by `check_invariants`):
1. Radix shape: children are keyed by the first token of their edge, no two share it, and
   no non-root edge is empty; `depth(n) = depth(parent) + len(edge)`.
2. A non-root node without a state has >= 2 children, unless it is locked (a locked node
   is tidied when its last lock is released). So every leaf holds a state, and every
   path of KV ends in a usable checkpoint.
3. `n_tokens` and `n_states` equal the sums over nodes; bytes follow from the cost model.
4. The node table's masks and efficiencies match the nodes (see `node_table`).
A locked node is never removed, merged away or evicted.

Eviction primitives: a leaf gives back its state and its edge's KV; a node with one child
gives back its state and its edge is merged into the child (the KV moves, nothing else
is lost). Either may leave a state-less node with < 2 children, which is then merged or
removed so that invariant 2 holds again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.node_table import NodeTable
from marconi_ray.core.tree_types import (
    NO_STATE,
    Freed,
    KVHandle,
    Match,
    Node,
    Tokens,
    common_prefix_len,
)


def _concat_kv(a: KVHandle, b: KVHandle) -> KVHandle:
    if a is None or b is None:
        return None
    return np.concatenate([a, b])


class RadixTree:
    """The tree plus its node table. Mutations keep the table current.

    All methods are single-threaded; the cache coordinator serialises access.
    """

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.table = NodeTable()
        self.root = Node(None, np.zeros(0, dtype=np.int32), None, 0, self.table.alloc())
        self.nodes: dict[int, Node] = {self.root.slot: self.root}
        self.n_tokens = 0
        self.n_states = 0

    # ----------------------------------------------------------------- queries
    @property
    def kv_bytes(self) -> int:
        return self.cost.kv_bytes(self.n_tokens)

    @property
    def ssm_bytes(self) -> int:
        return self.n_states * self.cost.state_bytes

    @property
    def bytes_used(self) -> int:
        return self.kv_bytes + self.ssm_bytes

    def match(self, tokens: Tokens) -> Match:
        """Walk `tokens` down the tree. A divergence inside an edge stops the walk there."""
        node = self.root
        hit = self.root
        pos = 0
        end = len(tokens)
        path: list[Node] = []
        while pos < end:
            child = node.children.get(int(tokens[pos]))
            if child is None:
                break
            n = len(child.edge)
            if n <= end - pos and (n == 1 or bool((child.edge == tokens[pos : pos + n]).all())):
                pos += n
                node = child
                path.append(child)
                if child.state != NO_STATE:
                    hit = child
                continue
            k = common_prefix_len(child.edge, tokens[pos:])
            return Match(hit, hit.depth, pos + k, tuple(path), child)
        return Match(hit, hit.depth, pos, tuple(path), None)

    def anchor_depth(self, node: Node) -> int:
        """Depth of the nearest state-holding proper ancestor (0 if none)."""
        up = node.parent
        while up is not None and up.state == NO_STATE:
            up = up.parent
        return 0 if up is None else up.depth

    def path_tokens(self, node: Node) -> Tokens:
        """All tokens from the root to the end of `node`."""
        parts: list[Tokens] = []
        cur: Node | None = node
        while cur is not None:
            parts.append(cur.edge)
            cur = cur.parent
        return np.concatenate(parts[::-1]) if parts else np.zeros(0, dtype=np.int32)

    def iter_nodes(self) -> list[Node]:
        """Every node, root first, in depth-first order (iterative: chains can be deep)."""
        out: list[Node] = []
        stack = [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    # --------------------------------------------------------------- mutations
    def touch(self, node: Node, now: float) -> None:
        if node is not self.root:
            self.table.last_access[node.slot] = now

    def lock(self, node: Node) -> None:
        if node is not self.root:
            node.lock += 1
            self._refresh(node)

    def unlock(self, node: Node) -> Freed:
        """Release one lock; a state-less node left with < 2 children is tidied away."""
        freed = Freed()
        if node is self.root:
            return freed
        if node.lock <= 0:
            raise RuntimeError(f"unlock of an unlocked node {node!r}")
        node.lock -= 1
        self._tidy(node, freed)
        return freed

    def insert(
        self,
        tokens: Tokens,
        checkpoints: list[tuple[int, int]],
        now: float,
        kv: KVHandle = None,
        kv_start: int = 0,
    ) -> tuple[list[tuple[int, int]], list[int]]:
        """Insert `tokens` with SSM checkpoints; return (admitted, duplicate state ids).

        Args:
            tokens: the sequence to insert; it must end at the last checkpoint.
            checkpoints: (depth, state id) pairs, depths strictly increasing, in
                (0, len(tokens)], the last one equal to len(tokens).
            now: access time stamped on new nodes and nodes that gain a state.
            kv: per-token KV handle for positions [kv_start, len(tokens)); the tree
                slices it for new edges. Positions below the matched length are not read.
        Returns:
            admitted (depth, state id) pairs, and ids whose depth already held a state
            (the caller frees those).
        """
        end = len(tokens)
        if not checkpoints or checkpoints[-1][0] != end:
            raise ValueError(f"the last checkpoint must be at len(tokens)={end}: {checkpoints}")
        admitted: list[tuple[int, int]] = []
        duplicates: list[int] = []
        node = self.root
        pos = 0
        ci = 0
        while pos < end:
            cp, sid = checkpoints[ci]
            child = node.children.get(int(tokens[pos]))
            if child is None:
                for cp, sid in checkpoints[ci:]:
                    if pos < kv_start and kv is not None:
                        raise ValueError(f"kv starts at {kv_start} but new tokens start at {pos}")
                    edge_kv = None if kv is None else kv[pos - kv_start : cp - kv_start]
                    node = self._add_child(node, tokens[pos:cp], edge_kv, now)
                    self._set_state(node, sid, now)
                    admitted.append((cp, sid))
                    pos = cp
                break
            n = len(child.edge)
            k = common_prefix_len(child.edge, tokens[pos : pos + n])
            if cp < pos + n and cp <= pos + k:
                node = self._split(child, cp - pos)
                self._set_state(node, sid, now)
                admitted.append((cp, sid))
                pos = cp
                ci += 1
            elif k == n:
                node = child
                pos += n
                if cp == pos:
                    if node.state == NO_STATE:
                        self._set_state(node, sid, now)
                        admitted.append((cp, sid))
                    else:
                        duplicates.append(sid)
                    ci += 1
            else:
                node = self._split(child, k)
                pos += k
        return admitted, duplicates

    def evict(self, node: Node) -> Freed:
        """Evict a candidate (state-holding, <= 1 child, unlocked) node."""
        if node is self.root or node.state == NO_STATE or node.lock or len(node.children) > 1:
            raise RuntimeError(f"{node!r} is not an eviction candidate")
        freed = Freed(states=[node.state])
        node.state = NO_STATE
        self.n_states -= 1
        if node.children:
            self._merge_into_child(node)
        else:
            self._remove_leaf(node, freed)
        return freed

    # ---------------------------------------------------------------- helpers
    def _add_child(self, parent: Node, edge: Tokens, kv: KVHandle, now: float) -> Node:
        child = Node(parent, edge, kv, parent.depth + len(edge), self.table.alloc())
        parent.children[int(edge[0])] = child
        self.nodes[child.slot] = child
        self.n_tokens += len(edge)
        self.table.last_access[child.slot] = now
        self._refresh(parent)
        return child

    def _set_state(self, node: Node, state: int, now: float) -> None:
        node.state = state
        self.n_states += 1
        self.table.last_access[node.slot] = now
        self._refresh_down(node)

    def _split(self, child: Node, k: int) -> Node:
        """Cut `child`'s edge after k tokens; return the new state-less middle node."""
        parent = child.parent
        assert parent is not None and 0 < k < len(child.edge)
        head_kv = None if child.kv is None else child.kv[:k]
        depth = child.depth - len(child.edge) + k
        mid = Node(parent, child.edge[:k], head_kv, depth, self.table.alloc())
        self.nodes[mid.slot] = mid
        self.table.last_access[mid.slot] = self.table.last_access[child.slot]
        child.edge = child.edge[k:]
        child.kv = None if child.kv is None else child.kv[k:]
        child.parent = mid
        mid.children[int(child.edge[0])] = child
        parent.children[int(mid.edge[0])] = mid
        self._refresh(mid)
        self._refresh(child)
        return mid

    def _merge_into_child(self, node: Node) -> None:
        """Remove a state-less single-child node by prepending its edge to the child."""
        parent = node.parent
        assert parent is not None and node.state == NO_STATE and len(node.children) == 1
        (child,) = node.children.values()
        child.edge = np.concatenate([node.edge, child.edge])
        child.kv = _concat_kv(node.kv, child.kv)
        child.parent = parent
        parent.children[int(child.edge[0])] = child
        self._drop(node)
        self._refresh_down(child)

    def _remove_leaf(self, node: Node, freed: Freed) -> None:
        self._tidy(self._detach_leaf(node, freed), freed)

    def _detach_leaf(self, node: Node, freed: Freed) -> Node:
        """Unlink a childless node, hand its edge's KV to `freed`; return its parent."""
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[int(node.edge[0])]
        self.n_tokens -= len(node.edge)
        freed.kv.append(node.kv)
        freed.n_tokens += len(node.edge)
        self._drop(node)
        return parent

    def _tidy(self, node: Node, freed: Freed) -> None:
        """Restore invariant 2 at `node` (cascading upwards), then refresh it."""
        while (
            node is not self.root
            and node.state == NO_STATE
            and node.lock == 0
            and len(node.children) < 2
        ):
            if node.children:
                self._merge_into_child(node)
                return
            node = self._detach_leaf(node, freed)
        self._refresh(node)

    def _drop(self, node: Node) -> None:
        del self.nodes[node.slot]
        self.table.release(node.slot)
        node.parent = None

    def _refresh(self, node: Node) -> None:
        """Recompute the node's candidate flags and efficiency in the table."""
        if node is self.root:
            return
        slot = node.slot
        n_children = len(node.children)
        candidate = node.state != NO_STATE and n_children <= 1 and node.lock == 0
        self.table.evictable[slot] = candidate
        self.table.leaf[slot] = candidate and n_children == 0
        if node.state != NO_STATE:
            self.table.efficiency[slot] = self.cost.efficiency(
                node.depth, self.anchor_depth(node), len(node.edge), n_children == 0
            )

    def _refresh_down(self, node: Node) -> None:
        """Refresh `node` and every descendant whose anchor is `node`'s (through state-less)."""
        self._refresh(node)
        stack = list(node.children.values())
        while stack:
            cur = stack.pop()
            self._refresh(cur)
            if cur.state == NO_STATE:
                stack.extend(cur.children.values())

    # ------------------------------------------------------------- pickling
    def __getstate__(self) -> dict[str, Any]:
        """Flatten the tree (pre-order, parent indices): deep chains must not recurse."""
        order = self.iter_nodes()
        index = {id(n): i for i, n in enumerate(order)}
        flat = [
            (
                -1 if n.parent is None else index[id(n.parent)],
                n.edge,
                n.kv,
                n.depth,
                n.state,
                n.lock,
                float(self.table.last_access[n.slot]),
            )
            for n in order
        ]
        return {"cost": self.cost, "flat": flat}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["cost"])  # type: ignore[misc]
        built: list[Node] = []
        for parent_i, edge, kv, depth, sid, lock, last in state["flat"]:
            if parent_i < 0:
                built.append(self.root)
                continue
            parent = built[parent_i]
            node = Node(parent, edge, kv, depth, self.table.alloc())
            node.state, node.lock = sid, lock
            parent.children[int(edge[0])] = node
            self.nodes[node.slot] = node
            self.table.last_access[node.slot] = last
            self.n_tokens += len(edge)
            self.n_states += sid != NO_STATE
            built.append(node)
        for node in built:
            self._refresh(node)
