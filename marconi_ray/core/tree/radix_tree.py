"""Radix tree of cached token sequences with SSM checkpoints on some of its nodes.

Each non-root node owns the KV of its edge tokens (every attention layer) and, optionally,
one SSM checkpoint: the SSM + conv state after the last token of its edge, i.e. after
`depth` tokens. A prefix `t[:h]` is reusable ("a hit of length h") iff the node at depth
h on t's path holds a state: attention needs the KV of every edge above it, which the
tree always has, and the SSM layers need exactly that state.

Invariants (all checked by `core.cache.invariants.check_tree`):
1. Radix shape: children are keyed by the first token of their edge, no two share it, and
   no non-root edge is empty; `depth(n) = depth(parent) + len(edge)`; each node's `key`
   is its edge's int32 bytes (walks compare bytes, not arrays).
2. A non-root node without a state has >= 2 children, unless it is locked (a locked node
   is tidied when its last lock is released). So every leaf holds a state, and every
   path of KV ends in a usable checkpoint.
3. `n_tokens` and `n_states` equal the sums over nodes; bytes follow from the cost model.
4. The node table's masks, depth / anchor / edge columns and LRU heap match the nodes
   (see `node_table`).
5. Tiers: `n_host_tokens` and `n_host_states` equal the sums of the nodes' host flags
   (`Node.host`, `Node.state_host`), which the table's `host_tokens` and `state_host`
   columns mirror; a state-less node's `state_host` is False. Device bytes are
   `bytes_used - host_bytes`. Tiers never change the tree's shape: a hit may use KV and a
   state of either tier (the store reads each id where it lives).
A locked node is never removed, merged away or evicted.

Eviction primitives: a leaf gives back its state and its edge's KV; a node with one child
gives back its state and its edge is merged into the child (the KV moves, nothing else
is lost). Either may leave a state-less node with < 2 children, which is then merged or
removed so that invariant 2 holds again.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.tree.flat_tree import FlatTree, check_flat, kv_column
from marconi_ray.core.tree.node_table import NodeTable
from marconi_ray.core.tree.tree_types import (
    NO_STATE,
    KVHandle,
    Match,
    Node,
    Reclaimed,
    TierMove,
    Tokens,
    common_prefix_len,
    tokens_bytes,
)

_CHAIN_MIN = 2
"""New chains of at least this many nodes are built in one batch (`_add_chain`); shorter
ones node by node (`_add_child`, `_set_state`)."""


class Inserted(NamedTuple):
    """What `RadixTree.insert` did."""

    admitted: list[tuple[int, int]]
    """(depth, state id) pairs now held by the tree."""
    duplicates: list[int]
    """State ids whose depth already held a state (the caller frees them)."""
    new_from: int
    """Positions [new_from, len(tokens)) became new edges (len(tokens) when none did)."""


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
        self.n_host_tokens = 0
        self.n_host_states = 0
        self.version = 0
        """Bumped by every change of shape or states (insert, evict, unlock): a `Match`
        computed at version v is still the walk's answer while the version is v."""

    # ----------------------------------------------------------------- queries
    @property
    def kv_bytes(self) -> int:
        return self.cost.kv_bytes(self.n_tokens)

    @property
    def ssm_bytes(self) -> int:
        return self.n_states * self.cost.state_bytes

    @property
    def bytes_used(self) -> int:
        """Bytes held in both tiers."""
        return self.kv_bytes + self.ssm_bytes

    @property
    def host_bytes(self) -> int:
        """Bytes held in the host tier."""
        return self.cost.kv_bytes(self.n_host_tokens) + self.n_host_states * self.cost.state_bytes

    @property
    def device_bytes(self) -> int:
        """Bytes held in the device tier."""
        return self.bytes_used - self.host_bytes

    def match(self, tokens: Tokens) -> Match:
        """Walk `tokens` down the tree. A divergence inside an edge stops the walk there."""
        node = self.root
        hit = self.root
        pos = 0
        end = len(tokens)
        buf = tokens_bytes(tokens)
        ids = memoryview(buf).cast("i")
        path: list[Node] = []
        while pos < end:
            child = node.children.get(ids[pos])
            if child is None:
                break
            if buf.startswith(child.key, 4 * pos):  # the whole edge matches (no slice)
                pos = child.depth
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

    def efficiency(self, node: Node, formula: str = "freed") -> float:
        """FLOP efficiency of an eviction candidate by `formula` (see
        `cost_model.EFFICIENCY_FORMULAS`), from the table's columns."""
        slots = np.asarray([node.slot], dtype=np.int64)
        return float(self.table.efficiency(self.cost, formula, slots)[0])

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
            table = self.table
            slot = node.slot
            table.last_access[slot] = now
            if table.leaf[slot]:
                table.push_leaf(slot)

    def touch_many(self, nodes: Sequence[Node], now: float) -> None:
        """`touch` every node of `nodes` (a matched path: the root is never on one)."""
        if not nodes:
            return
        table = self.table
        slots = [n.slot for n in nodes if n is not self.root]
        table.last_access[slots] = now
        for i in np.flatnonzero(table.leaf[slots]).tolist():
            table.push_leaf(slots[i])

    def lock(self, node: Node) -> None:
        if node is not self.root:
            node.lock += 1
            self._refresh(node)

    def unlock(self, node: Node) -> Reclaimed:
        """Release one lock; a state-less node left with < 2 children is tidied away."""
        freed = Reclaimed()
        self.unlock_into(node, freed)
        return freed

    def unlock_into(self, node: Node, freed: Reclaimed) -> None:
        """`unlock`, adding what it reclaims to `freed`."""
        if node is self.root:
            return
        if node.lock <= 0:
            raise RuntimeError(f"unlock of an unlocked node {node!r}")
        node.lock -= 1
        self.version += 1
        self._tidy(node, freed)

    def insert(
        self,
        tokens: Tokens,
        checkpoints: list[tuple[int, int]],
        now: float,
        kv: KVHandle = None,
        kv_start: int = 0,
        start: Node | None = None,
    ) -> Inserted:
        """Insert `tokens` with SSM checkpoints; return what was admitted (`Inserted`).

        Args:
            tokens: the sequence to insert; it must end at the last checkpoint.
            checkpoints: (depth, state id) pairs, depths strictly increasing, in
                (0, len(tokens)], the last one equal to len(tokens).
            now: access time stamped on new nodes and nodes that gain a state.
            kv: per-token KV handle for positions [kv_start, len(tokens)); the tree
                slices it for new edges. Positions below the matched length are not read.
            start: where the walk down `tokens` begins (default: the root): a node of
                the tree's current walk of `tokens` (`Match.path`) shallower than the
                first checkpoint, so the caller's walk is not repeated.
        Returns:
            admitted (depth, state id) pairs, ids whose depth already held a state (the
            caller frees those), and where the new tokens begin: positions
            [new_from, len(tokens)) are new edges, holding `kv`'s handles for them.
        """
        end = len(tokens)
        if not checkpoints or checkpoints[-1][0] != end:
            raise ValueError(f"the last checkpoint must be at len(tokens)={end}: {checkpoints}")
        node = self.root if start is None else start
        if start is not None and start.depth >= checkpoints[0][0]:
            raise ValueError(f"start depth {node.depth} is not above the first checkpoint")
        admitted: list[tuple[int, int]] = []
        duplicates: list[int] = []
        self.version += 1
        pos = node.depth
        ci = 0
        tokens = np.asarray(tokens, dtype=np.int32)
        buf = tokens_bytes(tokens)
        ids = memoryview(buf).cast("i")
        while pos < end:
            cp, sid = checkpoints[ci]
            child = node.children.get(ids[pos])
            if child is None:
                if pos < kv_start and kv is not None:
                    raise ValueError(f"kv starts at {kv_start} but new tokens start at {pos}")
                new_from = pos
                rest = checkpoints[ci:]
                if len(rest) >= _CHAIN_MIN:
                    self._add_chain(node, tokens, buf, ids, rest, pos, now, kv, kv_start)
                    admitted.extend((cp, sid) for cp, sid in rest)
                    return Inserted(admitted, duplicates, new_from)
                for cp, sid in rest:
                    edge_kv = None if kv is None else kv[pos - kv_start : cp - kv_start]
                    node = self._add_child(node, tokens[pos:cp], edge_kv, now)
                    self._set_state(node, sid, now)
                    admitted.append((cp, sid))
                    pos = cp
                return Inserted(admitted, duplicates, new_from)
            n = len(child.key) >> 2
            same = buf.startswith(child.key, 4 * pos)
            k = n if same else common_prefix_len(child.edge, tokens[pos : pos + n])
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
        return Inserted(admitted, duplicates, end)

    def tidy(self, node: Node, freed: Reclaimed) -> None:
        """Restore invariant 2 at `node` and upwards (a caller's repair after a failed
        insert left a state-less node with < 2 children); what goes is added to `freed`."""
        self.version += 1
        self._tidy(node, freed)

    def evict(self, node: Node) -> Reclaimed:
        """Evict a candidate (state-holding, <= 1 child, unlocked) node."""
        freed = Reclaimed()
        self.evict_into(node, freed)
        return freed

    def evict_into(self, node: Node, freed: Reclaimed) -> None:
        """`evict`, adding what it reclaims to `freed`."""
        if node is self.root or node.state == NO_STATE or node.lock or len(node.children) > 1:
            raise RuntimeError(f"{node!r} is not an eviction candidate")
        freed.states.append(node.state)
        self.version += 1
        node.state = NO_STATE
        self.n_states -= 1
        if node.state_host:
            self._clear_state_host(node)
        if node.children:
            self._merge_into_child(node)
        else:
            self._tidy(self._detach_leaf(node, freed), freed)

    def evict_lru(self, max_bytes: int, freed: Reclaimed) -> tuple[int, bool]:
        """Evict the oldest leaf (`NodeTable.oldest_leaf`) while the tree holds more than
        `max_bytes`, adding what is freed to `freed`: LRU eviction, each step exactly
        `evict_into(nodes[oldest_leaf()])`, with the common case inlined (a leaf whose
        parent holds a state, or is the root). A parent that becomes a leaf older than
        the heap's top is the next victim without a trip through the heap. Returns
        (victims evicted, whether the leaves ran out first)."""
        table = self.table
        heap = table.lru
        leaf = table.leaf
        last = table.last_access
        evictable = table.evictable
        free = table._free
        nodes = self.nodes
        root = self.root
        states = freed.states
        kvs = freed.kv
        kv_per_token = self.cost.kv_bytes_per_token
        state_bytes = self.cost.state_bytes
        heappop = heapq.heappop
        heappush = heapq.heappush
        excess = self.n_tokens * kv_per_token + self.n_states * state_bytes - max_bytes
        n = 0
        pending = -1  # the next victim, known to be the oldest leaf, not in the heap
        try:
            while excess > 0:
                if pending >= 0:
                    slot = pending
                    pending = -1
                else:
                    while heap:
                        t, slot = heappop(heap)
                        if leaf[slot] and last[slot] == t:
                            break
                    else:
                        return n, True
                node = nodes[slot]
                parent = node.parent
                assert parent is not None
                n += 1
                states.append(node.state)
                node.state = NO_STATE
                if node.state_host:
                    self._clear_state_host(node)
                if node.host is not None:
                    self.n_host_tokens -= node.host_tokens
                siblings = parent.children
                if len(siblings) == 1:
                    siblings.clear()
                else:
                    del siblings[int(node.edge[0])]
                k = node.depth - parent.depth
                self.n_tokens -= k
                self.n_states -= 1
                excess -= k * kv_per_token + state_bytes
                kvs.append(node.kv)
                freed.n_tokens += k
                del nodes[slot]
                evictable[slot] = False
                leaf[slot] = False
                free.append(slot)
                node.parent = None
                if parent is root:
                    continue
                if parent.state == NO_STATE or parent.lock:
                    self._tidy(parent, freed)
                    heap = table.lru  # a heap rebuild replaces the list
                    excess = self.n_tokens * kv_per_token + self.n_states * state_bytes - max_bytes
                elif not siblings:  # a state-holding, unlocked parent becomes a leaf
                    slot = parent.slot
                    evictable[slot] = True
                    leaf[slot] = True
                    entry = (float(last[slot]), slot)
                    if not heap or entry < heap[0]:
                        pending = slot
                    else:
                        heappush(heap, entry)
                elif len(siblings) == 1:
                    evictable[parent.slot] = True
            return n, False
        finally:
            if pending >= 0:
                heappush(heap, (float(last[pending]), pending))
            self.version += n

    # ------------------------------------------------------------------ tiers
    def demote(self, node: Node, with_kv: bool = True) -> TierMove | None:
        """Move `node`'s state and (when `with_kv`) every KV token of its edge to the host
        tier; return what moved (None when nothing was on the device). The shape is
        unchanged."""
        table = self.table
        slot = node.slot
        n_dev = len(node.edge) - int(table.host_tokens[slot]) if with_kv else 0
        move_state = node.state != NO_STATE and not node.state_host
        if node is self.root or (not n_dev and not move_state):
            return None
        kv: tuple[KVHandle, ...] = ()
        if n_dev:
            if node.kv is not None:
                kv = (node.kv if node.host is None else node.kv[~node.host],)
            node.host = np.ones(len(node.edge), dtype=np.bool_)
            table.host_tokens[slot] = len(node.edge)
            self.n_host_tokens += n_dev
        states: tuple[int, ...] = ()
        if move_state:
            states = (node.state,)
            node.state_host = True
            table.state_host[slot] = True
            self.n_host_states += 1
        n_bytes = self.cost.kv_bytes(n_dev) + len(states) * self.cost.state_bytes
        return TierMove(True, states, kv, n_bytes)

    def promote(self, node: Node, with_state: bool) -> TierMove | None:
        """Move `node`'s host KV tokens (and its state, when `with_state` and it is on
        the host) to the device tier; return what moved (None when nothing did)."""
        table = self.table
        slot = node.slot
        n_host = int(table.host_tokens[slot])
        move_state = with_state and node.state_host
        if not n_host and not move_state:
            return None
        kv: tuple[KVHandle, ...] = ()
        if n_host:
            if node.kv is not None:
                assert node.host is not None
                kv = (node.kv[node.host],)
            node.host = None
            table.host_tokens[slot] = 0
            self.n_host_tokens -= n_host
        states: tuple[int, ...] = ()
        if move_state:
            states = (node.state,)
            self._clear_state_host(node)
        n_bytes = self.cost.kv_bytes(n_host) + len(states) * self.cost.state_bytes
        return TierMove(False, states, kv, n_bytes)

    def _clear_state_host(self, node: Node) -> None:
        """`node`'s state (on the host) is on the device now, or gone."""
        node.state_host = False
        self.table.state_host[node.slot] = False
        self.n_host_states -= 1

    # ---------------------------------------------------------------- helpers
    def _add_chain(
        self,
        parent: Node,
        tokens: Tokens,
        buf: bytes,
        ids: memoryview,
        checkpoints: list[tuple[int, int]],
        pos: int,
        now: float,
        kv: KVHandle,
        kv_start: int,
    ) -> None:
        """Hang a new chain under `parent`: one state-holding node per checkpoint, edges
        `tokens[pos:depth]` (what `_add_child` + `_set_state` per checkpoint would do, with
        the table's columns written once for the whole chain). The chain is built apart
        and then linked: should building fail, the tree is as it was."""
        table = self.table
        slots = table.alloc_many(len(checkpoints))
        top = parent
        start = pos
        first = ids[pos]
        chain: list[Node] = []
        rows: list[tuple[int, int, int]] = []  # (depth, anchor, edge_len) per new node
        anchor = self._anchor_below(top)
        try:
            for (cp, sid), slot in zip(checkpoints, slots, strict=True):
                edge_kv = None if kv is None else kv[pos - kv_start : cp - kv_start]
                child = Node(parent, tokens[pos:cp], edge_kv, cp, slot, buf[4 * pos : 4 * cp], sid)
                if chain:
                    parent.children[ids[pos]] = child
                chain.append(child)
                rows.append((cp, anchor, cp - pos))
                anchor = cp
                parent = child
                pos = cp
        except BaseException:
            table._free.extend(reversed(slots))
            raise
        # link: plain stores from here on
        self.nodes.update(zip(slots, chain, strict=True))
        if len(slots) == 1:
            slot = slots[0]
            table.last_access[slot] = now
            table.geometry[slot] = rows[0]
            table.evictable[slot] = True
        else:
            table.last_access[slots] = now
            table.geometry[slots] = rows
            table.evictable[slots] = True
        table.leaf[slots[-1]] = True
        top.children[first] = chain[0]
        self.n_tokens += pos - start
        self.n_states += len(slots)
        table.push_leaf(slots[-1])
        self._refresh(top)

    def _add_child(self, parent: Node, edge: Tokens, kv: KVHandle, now: float) -> Node:
        child = Node(parent, edge, kv, parent.depth + len(edge), self.table.alloc())
        parent.children[int(edge[0])] = child
        self.nodes[child.slot] = child
        self.n_tokens += len(edge)
        table = self.table
        slot = child.slot
        table.last_access[slot] = now
        table.depth[slot] = child.depth
        table.edge_len[slot] = len(edge)
        table.anchor[slot] = self._anchor_below(parent)
        self._refresh(parent)
        return child

    def _set_state(self, node: Node, state: int, now: float) -> None:
        """Give a state-less `node` a new state (on the device)."""
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
        table = self.table
        mid = Node(parent, child.edge[:k], head_kv, depth, table.alloc())
        self.nodes[mid.slot] = mid
        table.last_access[mid.slot] = table.last_access[child.slot]
        table.depth[mid.slot] = depth
        table.edge_len[mid.slot] = k
        table.anchor[mid.slot] = table.anchor[child.slot]
        table.edge_len[child.slot] -= k
        if child.host is not None:
            head, tail = child.host[:k], child.host[k:]
            n_head = int(np.count_nonzero(head))
            mid.host = head if n_head else None
            child.host = tail if n_head < table.host_tokens[child.slot] else None
            table.host_tokens[mid.slot] = n_head
            table.host_tokens[child.slot] -= n_head
        child.edge = child.edge[k:]
        child.kv = None if child.kv is None else child.kv[k:]
        child.parent = mid
        mid.children[int(child.edge[0])] = child
        parent.children[int(mid.edge[0])] = mid
        # mid holds no state (no candidate flags); child's flags and anchor are unchanged.
        return mid

    def _merge_into_child(self, node: Node) -> None:
        """Remove a state-less single-child node by prepending its edge to the child."""
        parent = node.parent
        assert parent is not None and node.state == NO_STATE and len(node.children) == 1
        (child,) = node.children.values()
        if node.host is not None or child.host is not None:
            child.host = np.concatenate([_host_mask(node), _host_mask(child)])
            self.table.host_tokens[child.slot] += self.table.host_tokens[node.slot]
        self.table.edge_len[child.slot] += len(node.edge)
        child.edge = np.concatenate([node.edge, child.edge])
        child.kv = _concat_kv(node.kv, child.kv)
        child.parent = parent
        parent.children[int(child.edge[0])] = child
        self._drop(node)
        self._refresh_down(child)

    def _detach_leaf(self, node: Node, freed: Reclaimed) -> Node:
        """Unlink a childless node, hand its edge's KV to `freed`; return its parent."""
        parent = node.parent
        assert parent is not None and not node.children
        siblings = parent.children
        if len(siblings) == 1:
            siblings.clear()
        else:
            del siblings[int(node.edge[0])]
        n = node.depth - parent.depth
        self.n_tokens -= n
        if node.host is not None:
            self.n_host_tokens -= node.host_tokens
        freed.kv.append(node.kv)
        freed.n_tokens += n
        slot = node.slot
        del self.nodes[slot]
        self.table.release(slot)
        node.parent = None
        return parent

    def _tidy(self, node: Node, freed: Reclaimed) -> None:
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
        """Recompute the node's candidate flags in the table (a node that becomes a leaf
        candidate enters the LRU heap)."""
        if node is self.root:
            return
        slot = node.slot
        table = self.table
        n_children = len(node.children)
        if node.state != NO_STATE and n_children <= 1 and node.lock == 0:
            table.evictable[slot] = True
            if n_children:
                table.leaf[slot] = False
            elif not table.leaf[slot]:
                table.leaf[slot] = True
                table.push_leaf(slot)
        else:
            table.evictable[slot] = False
            table.leaf[slot] = False

    def _anchor_below(self, node: Node) -> int:
        """The anchor depth of `node`'s children: its depth if it holds a state, else its
        own anchor (the root's column holds 0)."""
        if node.state != NO_STATE:
            return node.depth
        return int(self.table.anchor[node.slot])

    def _refresh_down(self, node: Node) -> None:
        """Refresh `node`'s flags and anchor and those of every descendant whose anchor is
        at or above `node` (the subtree down to the first state-holding nodes)."""
        if node is self.root:
            return
        parent = node.parent
        assert parent is not None
        anchor = self.table.anchor
        anchor[node.slot] = self._anchor_below(parent)
        self._refresh(node)
        stack = [node]
        while stack:
            cur = stack.pop()
            below = self._anchor_below(cur)
            for child in cur.children.values():
                anchor[child.slot] = below
                self._refresh(child)
                if child.state == NO_STATE:
                    stack.append(child)

    # ------------------------------------------------------------ flattening
    def flatten(self) -> FlatTree:
        """The tree as columns (see `FlatTree`), iteratively: chains can be deep.

        Raises ValueError when a node's KV handle is neither None nor a 1-D integer array
        (castable to int64) as long as its edge.
        """
        order: list[Node] = []
        parents: list[int] = []
        stack: list[tuple[Node, int]] = [(self.root, -1)]
        while stack:
            node, parent_i = stack.pop()
            index = len(order)
            order.append(node)
            parents.append(parent_i)
            children = node.children
            if len(children) == 1:
                stack.append((next(iter(children.values())), index))
            elif children:
                stack.extend([(child, index) for child in reversed(children.values())])
        edges = [n.edge for n in order]
        kvs = [kv_column(n.kv, e, n) for n, e in zip(order, edges, strict=True) if n.kv is not None]
        slots = [n.slot for n in order]
        n_edge_tokens = sum(len(e) for e in edges)
        if self.n_host_tokens:
            host = np.concatenate([_host_mask(n) for n in order])
        else:
            host = np.zeros(n_edge_tokens, dtype=np.bool_)
        return FlatTree(
            parent=np.asarray(parents, dtype=np.int64),
            slot=np.asarray(slots, dtype=np.int64),
            edge_len=np.asarray([len(e) for e in edges], dtype=np.int64),
            edges=np.concatenate(edges).astype(np.int32, copy=False),
            has_kv=np.asarray([n.kv is not None for n in order], dtype=np.bool_),
            kv=np.concatenate(kvs) if kvs else np.zeros(0, dtype=np.int64),
            state=np.asarray([n.state for n in order], dtype=np.int64),
            lock=np.asarray([n.lock for n in order], dtype=np.int64),
            last_access=self.table.last_access[slots].astype(np.float64),
            n_slots=self.table.n_slots,
            free=np.asarray(self.table._free, dtype=np.int64),
            host=host,
            state_host=self.table.state_host[slots].copy(),
        )

    @classmethod
    def from_flat(cls, cost: CostModel, flat: FlatTree) -> RadixTree:
        """Rebuild a tree from `flatten`'s columns: the same nodes, children order, slots
        and free-slot order, so later mutations and evictions match the original's.

        Raises ValueError naming the first inconsistency (lengths, parent indices, slots,
        edges, sibling keys, state ids, lock counts, invariant 2). Derived columns
        (depths, anchors, candidate masks, the LRU heap) are recomputed.
        """
        n = check_flat(flat)
        tree = cls(cost)
        tree.table = NodeTable(flat.n_slots)
        tree.table._free = [int(s) for s in flat.free]
        slots = flat.slot.tolist()
        parents = flat.parent.tolist()
        states = flat.state.tolist()
        locks = flat.lock.tolist()
        edge_end = np.cumsum(flat.edge_len).tolist()
        kv_end = np.cumsum(np.where(flat.has_kv, flat.edge_len, 0)).tolist()
        has_kv = flat.has_kv.tolist()
        state_host = flat.state_host.tolist()
        any_host = bool(flat.host.any())
        root = Node(None, np.zeros(0, dtype=np.int32), None, 0, slots[0])
        tree.root = root
        tree.nodes = {root.slot: root}
        built = [root]
        anchors = [0]
        for i in range(1, n):
            p = parents[i]
            parent = built[p]
            edge = flat.edges[edge_end[i - 1] : edge_end[i]]
            key = int(edge[0])
            if key in parent.children:
                raise ValueError(f"node {i}: its parent (node {p}) has two children keyed {key}")
            kv = flat.kv[kv_end[i - 1] : kv_end[i]] if has_kv[i] else None
            node = Node(parent, edge, kv, parent.depth + len(edge), slots[i])
            node.state = states[i]
            node.lock = locks[i]
            node.state_host = state_host[i]
            if any_host:
                mask = flat.host[edge_end[i - 1] : edge_end[i]]
                node.host = mask if mask.any() else None
            parent.children[key] = node
            tree.nodes[node.slot] = node
            built.append(node)
            anchors.append(parent.depth if parent.state != NO_STATE else anchors[p])
        table = tree.table
        table.last_access[flat.slot] = flat.last_access
        table.depth[flat.slot] = [node.depth for node in built]
        table.edge_len[flat.slot] = flat.edge_len
        table.anchor[flat.slot] = anchors
        tree.n_tokens = int(flat.edge_len.sum())
        tree.n_states = int(np.count_nonzero(flat.state != NO_STATE))
        table.state_host[flat.slot] = flat.state_host
        tree.n_host_states = int(np.count_nonzero(flat.state_host))
        if any_host:
            table.host_tokens[flat.slot] = [node.host_tokens for node in built]
            tree.n_host_tokens = int(np.count_nonzero(flat.host))
        for i, node in enumerate(built):
            if i and node.state == NO_STATE and node.lock == 0 and len(node.children) < 2:
                raise ValueError(f"node {i}: unlocked, holds no state and has < 2 children")
            tree._refresh(node)
        return tree


def _host_mask(node: Node) -> npt.NDArray[np.bool_]:
    """`node.host` as a bool array as long as its edge (all False when None)."""
    if node.host is None:
        return np.zeros(len(node.edge), dtype=np.bool_)
    return node.host


__all__ = ["FlatTree", "Inserted", "RadixTree"]
