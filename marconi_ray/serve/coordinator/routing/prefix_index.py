"""`RoutingIndex`: which replicas hold a cached SSM state on a prompt's path, for every
replica at once, in one compressed token trie.

A replica's usable hit for a prompt is the deepest state of its radix tree whose path is
a prefix of the prompt; finding it walks that replica's tree, so asking every replica
costs O(replicas) walks per request. The index is the union of the paths to every
replica's states: a node records the (replica, state id) pairs whose state sits at
exactly its depth on exactly its path. `candidates(prompt)` walks the prompt once and
returns the replicas holding a state at a node fully on it (depth <= len(prompt)): while
the index is in step with the trees, exactly the replicas whose usable hit is > 0.
Callers rely only on the superset: a replica not named has hit 0.

Keeping it in step (`serve.coordinator.routing.state` does it for every operation `CacheState`
applies): `insert` a replica's states as its tree takes them (idempotent: a pair already
indexed is skipped), `remove` the state ids a `Release` lists (unknown ids are ignored),
`drop_replica` when its tree goes, `add_tree` to rebuild from a tree.

Shape (checked by `check`): children are keyed by the first token of their edge; no
non-root edge is empty; every non-root node holds a state or has >= 2 children (a node
left with neither is removed, one left with one child is merged into it), so the trie
has fewer nodes than twice the states it indexes. Insert and removal cost O(depth).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import pairwise

import numpy as np

from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import NO_STATE, Tokens, common_prefix_len, tokens_bytes

Entry = tuple[str, int]
"""(replica id, state id)."""


def tree_states(tree: RadixTree) -> Iterator[tuple[int, bytes]]:
    """(state id, int32 bytes of its path) of every state in a replica's radix tree."""
    stack = [(child, child.key) for child in tree.root.children.values()]
    while stack:
        node, path = stack.pop()
        if node.state != NO_STATE:
            yield int(node.state), path
        stack.extend((c, path + c.key) for c in node.children.values())


def _first(key: bytes) -> int:
    """The first token of an edge's int32 bytes."""
    return memoryview(key).cast("i")[0]


class _Node:
    __slots__ = ("children", "depth", "held", "key", "parent")

    def __init__(self, parent: _Node | None, key: bytes, depth: int) -> None:
        self.parent = parent
        self.key = key
        self.depth = depth
        self.children: dict[int, _Node] = {}
        self.held: dict[str, set[int]] = {}
        """replica id -> its state ids at this node (one, unless a tree misbehaves)."""


class RoutingIndex:
    """The trie (see the module docstring). Single-threaded, like the coordinator."""

    def __init__(self) -> None:
        self._root = _Node(None, b"", 0)
        self._where: dict[Entry, _Node] = {}
        self._of: dict[str, set[int]] = {}

    def __len__(self) -> int:
        """(replica, state) pairs indexed."""
        return len(self._where)

    def __contains__(self, entry: Entry) -> bool:
        return entry in self._where

    def replicas(self) -> set[str]:
        """Replicas holding at least one indexed state."""
        return set(self._of)

    # ------------------------------------------------------------------ queries
    def candidates(self, prompt: Tokens) -> set[str]:
        """Replicas holding a state at a depth <= len(prompt) on `prompt`'s path (a
        superset of those whose usable hit is > 0); one walk of the prompt."""
        buf = tokens_bytes(prompt)
        ids = memoryview(buf).cast("i")
        end, pos, node = len(buf), 0, self._root
        out: set[str] = set()
        while pos < end:
            child = node.children.get(ids[pos >> 2])
            if child is None or not buf.startswith(child.key, pos):
                break
            pos += len(child.key)
            node = child
            if child.held:
                out.update(child.held)
        return out

    def entries(self) -> Iterator[tuple[str, int, bytes]]:
        """Every (replica, state id, int32 bytes of the state's path) indexed."""
        stack: list[tuple[_Node, bytes]] = [(self._root, b"")]
        while stack:
            node, path = stack.pop()
            for rid, states in node.held.items():
                for state in states:
                    yield rid, state, path
            stack.extend((c, path + c.key) for c in node.children.values())

    # ---------------------------------------------------------------- mutations
    def insert(self, replica: str, state: int, path: Tokens) -> None:
        """Index `replica`'s state `state` at the end of `path` (its tokens from the
        root; non-empty); nothing when the pair is already indexed."""
        self.insert_path(replica, path, [(len(path), state)])

    def insert_path(self, replica: str, tokens: Tokens, states: Sequence[tuple[int, int]]) -> None:
        """Index `replica`'s (depth, state id) pairs on `tokens`' path (depths ascending,
        in 1..len(tokens), else ValueError and nothing changes) in one descent; pairs
        already indexed are skipped."""
        depths = [0, *(d for d, _ in states), len(tokens)]
        if any(a >= b for a, b in pairwise(depths[:-1])) or depths[-2] > depths[-1]:
            raise ValueError(
                f"state depths {depths[1:-1]} must ascend from 1 to at most {len(tokens)}"
            )
        buf = tokens_bytes(tokens)
        node, pos = self._root, 0
        for depth, state in states:
            entry = (replica, int(state))
            if entry in self._where:
                continue
            node, pos = self._descend(buf, 4 * depth, node, pos), 4 * depth
            node.held.setdefault(replica, set()).add(entry[1])
            self._where[entry] = node
            self._of.setdefault(replica, set()).add(entry[1])

    def remove(self, replica: str, states: tuple[int, ...] | list[int]) -> None:
        """Forget `replica`'s states `states` (ids not indexed are ignored)."""
        for state in states:
            node = self._where.pop((replica, int(state)), None)
            if node is None:
                continue
            held = node.held[replica]
            held.discard(int(state))
            if not held:
                del node.held[replica]
            mine = self._of[replica]
            mine.discard(int(state))
            if not mine:
                del self._of[replica]
            self._prune(node)

    def drop_replica(self, replica: str) -> None:
        """Forget every state of `replica`."""
        self.remove(replica, list(self._of.get(replica, ())))

    def add_tree(self, replica: str, tree: RadixTree) -> None:
        """Index every state of `replica`'s radix tree (e.g. after a restore)."""
        for state, path in tree_states(tree):
            self.insert(replica, state, np.frombuffer(path, dtype=np.int32))

    def clear(self) -> None:
        """Forget everything."""
        self._root = _Node(None, b"", 0)
        self._where = {}
        self._of = {}

    # ------------------------------------------------------------------ internals
    def _descend(self, buf: bytes, end: int, node: _Node, pos: int) -> _Node:
        """The node at the end of `buf[:end]` (int32 bytes), walking down from `node`
        (at byte `pos` of `buf`) and creating it (splitting an edge if the path ends or
        branches inside it) when absent."""
        ids = memoryview(buf).cast("i")
        while pos < end:
            child = node.children.get(ids[pos >> 2])
            if child is None:
                leaf = _Node(node, buf[pos:end], end >> 2)
                node.children[ids[pos >> 2]] = leaf
                return leaf
            n = len(child.key)
            if n <= end - pos and buf.startswith(child.key, pos):
                pos += n
                node = child
                continue
            if n > end - pos and child.key.startswith(buf[pos:end]):
                return self._split(child, end - pos)  # the path ends inside the edge
            rest = np.frombuffer(buf, dtype=np.int32, count=(end - pos) >> 2, offset=pos)
            common = 4 * common_prefix_len(np.frombuffer(child.key, dtype=np.int32), rest)
            mid = self._split(child, common)
            if pos + common == end:
                return mid
            leaf = _Node(mid, buf[pos + common : end], end >> 2)
            mid.children[ids[(pos + common) >> 2]] = leaf
            return leaf
        return node

    @staticmethod
    def _split(child: _Node, at: int) -> _Node:
        """Cut `child`'s edge after `at` bytes (0 < at < len); the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.key)
        mid = _Node(parent, child.key[:at], child.depth - ((len(child.key) - at) >> 2))
        parent.children[_first(child.key)] = mid
        child.key = child.key[at:]
        child.parent = mid
        mid.children[_first(child.key)] = child
        return mid

    def _prune(self, node: _Node) -> None:
        """Restore the shape after `node` lost a state: remove it when it holds nothing
        and has no child (then look at its parent), merge it into its only child."""
        while node.parent is not None and not node.held:
            parent = node.parent
            if not node.children:
                del parent.children[_first(node.key)]
                node = parent
                continue
            if len(node.children) == 1:
                (child,) = node.children.values()
                child.key = node.key + child.key
                child.parent = parent
                parent.children[_first(child.key)] = child
            return

    def check(self) -> int:
        """Full-scan check of the trie's shape and bookkeeping (module docstring);
        AssertionError on a violation. Returns the number of nodes."""
        count = 0
        seen: set[Entry] = set()
        stack = [self._root]
        while stack:
            node = stack.pop()
            count += 1
            if node.parent is not None:
                assert node.key and len(node.key) % 4 == 0, "empty or ragged edge"
                assert node.depth == node.parent.depth + len(node.key) // 4, "depth"
                assert node.held or len(node.children) >= 2, "node neither holds nor branches"
            for first, child in node.children.items():
                assert child.parent is node and _first(child.key) == first, "child key"
                stack.append(child)
            for rid, states in node.held.items():
                assert states, f"empty holder set of {rid!r}"
                for state in states:
                    assert self._where.get((rid, state)) is node, (rid, state)
                    seen.add((rid, state))
        assert seen == set(self._where), "the entry map names nodes that do not hold them"
        assert {(r, s) for r, ss in self._of.items() for s in ss} == seen, "per-replica sets"
        return count
