"""Where each request's reusable prefix ends: the reuse classes of a trace.

Requests are walked in order against an unbounded radix tree of every earlier request's
input + output (as in :mod:`.oracle`). A request's hit ``h`` is the oracle's: the longest
prefix of its input that an earlier request's input + output started with. The ``h``
reused tokens are classified by the point ``p = input[:h]`` where the hit ends:

- ``continuation``: some earlier request's whole input + output equals ``p`` (the hit ends
  where an earlier sequence ended, e.g. the next turn of a conversation). Marconi keeps a
  state there (after the last decoded token).
- ``branch``: otherwise, ``p`` is where earlier sequences already part: a node of the tree
  with >= 2 children (two earlier sequences share exactly ``p`` and then differ), or the
  end of an earlier request's input (``p`` equals an earlier input; counted again in
  ``branch_input_end`` when that is the only reason). A system that checkpoints at branch
  points, or at input ends, has a state there.
- ``inside_input``: otherwise: ``p`` ends strictly inside an earlier sequence (inside a
  tree edge, in an earlier input or output) where no earlier sequence ended or parted.
  Marconi's admission kept no state there, so only the request itself can create one
  (its speculative insert finds a new branch point at ``h``).
- ``miss``: ``h == 0`` (no tokens reused; counted in requests only).

The classes are tested in this order: a point that is both an earlier sequence's end and
a fork counts as a ``continuation``. Hits are the oracle's, so the per-class tokens sum
to ``sum(oracle_hits(requests))``. Pure numpy + the radix tree; the tree is not changed
by anything but inserts, so every non-root node holds a state (an input or sequence end)
or has >= 2 children.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields

import numpy as np

from marconi_ray.core.cache.tuner import RequestLike
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.tree.radix_tree import RadixTree
from marconi_ray.core.tree.tree_types import NO_STATE, Tokens

KINDS = ("continuation", "branch", "inside_input")
MISS = "miss"
_INPUT_END = 1
_SEQ_END = 2
_UNIT = CostModel(flops_linear=0.0, flops_quadratic=0.0, kv_bytes_per_token=0, state_bytes=1)


@dataclass(frozen=True)
class ReuseHit:
    """One request's hit: ``tokens`` reused, its ``kind`` (a KINDS entry, or ``miss`` when
    tokens == 0) and ``input_end_only``: a ``branch`` whose point is an earlier input end
    but no fork of the tree."""

    tokens: int
    kind: str
    input_end_only: bool = False


@dataclass(frozen=True)
class ReuseStats:
    """Token and request counts per reuse class over a trace (module docstring)."""

    requests: int = 0
    input_tokens: int = 0
    continuation_tokens: int = 0
    branch_tokens: int = 0
    inside_input_tokens: int = 0
    branch_input_end_tokens: int = 0
    continuation_requests: int = 0
    branch_requests: int = 0
    inside_input_requests: int = 0
    branch_input_end_requests: int = 0
    miss_requests: int = 0

    @property
    def hit_tokens(self) -> int:
        """Reused tokens over all classes (the oracle's total hit)."""
        return self.continuation_tokens + self.branch_tokens + self.inside_input_tokens

    def fraction(self, kind: str) -> float:
        """Share of the reused tokens in class ``kind`` (``branch_input_end`` also works;
        0.0 when nothing is reused)."""
        tokens: int = getattr(self, f"{kind}_tokens")
        return tokens / self.hit_tokens if self.hit_tokens else 0.0

    def as_dict(self) -> dict[str, float]:
        """Every count as ``reuse_<field>`` plus the oracle hit rate and the token-weighted
        fraction of each class, as floats."""
        out = {f"reuse_{f.name}": float(getattr(self, f.name)) for f in fields(self)}
        out["reuse_oracle_hit_rate"] = (
            self.hit_tokens / self.input_tokens if self.input_tokens else 0.0
        )
        for kind in (*KINDS, "branch_input_end"):
            out[f"reuse_{kind}_fraction"] = self.fraction(kind)
        return out


def _node_at(tree: RadixTree, tokens: Tokens, depth: int) -> int:
    """The state id of the node ending exactly at ``depth`` along ``tokens``."""
    path = tree.match(tokens[:depth]).path
    assert path and path[-1].depth == depth
    return path[-1].state


def classify_reuse(requests: Iterable[RequestLike]) -> list[ReuseHit]:
    """Each request's hit and its reuse class, in order (module docstring)."""
    tree = RadixTree(_UNIT)
    flags: list[int] = []  # per state id: _INPUT_END | _SEQ_END
    out: list[ReuseHit] = []
    for step, req in enumerate(requests):
        inp = np.asarray(req.input_tokens, dtype=np.int32)
        m = tree.match(inp)
        hit = min(m.matched_len, len(inp))
        if hit == 0:
            out.append(ReuseHit(0, MISS))
        elif m.partial is not None:
            out.append(ReuseHit(hit, "inside_input"))
        else:
            node = m.path[-1]
            flag = flags[node.state] if node.state != NO_STATE else 0
            if flag & _SEQ_END:
                out.append(ReuseHit(hit, "continuation"))
            else:
                fork = len(node.children) >= 2
                assert fork or flag & _INPUT_END, f"state-less single-child node {node!r}"
                out.append(ReuseHit(hit, "branch", not fork))
        full = np.concatenate([inp, req.output_tokens]).astype(np.int32, copy=False)
        marks = {len(inp): _INPUT_END}
        marks[len(full)] = marks.get(len(full), 0) | _SEQ_END
        checkpoints = [(depth, len(flags) + i) for i, depth in enumerate(sorted(marks))]
        flags.extend(marks[d] for d, _ in checkpoints)
        done = tree.insert(full, checkpoints, now=float(step))
        for sid in done.duplicates:
            depth = next(d for d, s in checkpoints if s == sid)
            flags[_node_at(tree, full, depth)] |= flags[sid]
    return out


def reuse_stats(requests: Iterable[RequestLike]) -> ReuseStats:
    """Counts per reuse class over ``requests`` (token-weighted and per request)."""
    reqs = list(requests)
    counts = {f.name: 0 for f in fields(ReuseStats)}
    counts["requests"] = len(reqs)
    counts["input_tokens"] = sum(len(r.input_tokens) for r in reqs)
    for h in classify_reuse(reqs):
        counts[f"{h.kind}_requests"] += 1
        if h.kind != MISS:
            counts[f"{h.kind}_tokens"] += h.tokens
        if h.input_end_only:
            counts["branch_input_end_requests"] += 1
            counts["branch_input_end_tokens"] += h.tokens
    return ReuseStats(**counts)
