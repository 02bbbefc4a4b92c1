"""An independent brute-force model of what a `PrefixCache` holds (debug mode, tests).

It keeps, per live SSM state id, the exact token prefix that state covers, learned only
from `CommitResult`s (what was admitted, what was freed). It answers "what is the longest
prefix of t with a live state?" by scanning every state, with no tree at all, so a bug in
the radix tree's match, split, merge or eviction shows up as a disagreement.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from marconi_ray.core.prefix_cache import CommitResult, PrefixCache
from marconi_ray.core.tree_types import Reclaimed


class ReferenceCache:
    """Mirror of a cache's live states as explicit token tuples."""

    def __init__(self) -> None:
        self.states: dict[int, tuple[int, ...]] = {}

    def expected_hit(self, tokens: npt.NDArray[np.int32]) -> int:
        seq = tuple(int(t) for t in tokens)
        best = 0
        for prefix in self.states.values():
            n = len(prefix)
            if best < n <= len(seq) and seq[:n] == prefix:
                best = n
        return best

    def apply(
        self,
        tokens: npt.NDArray[np.int32],
        result: CommitResult,
        planned: Reclaimed | None = None,
    ) -> None:
        """Learn a commit: what its planning evicted (`planned`, if it reserved), then
        what the commit did."""
        evicted = [*(planned.states if planned is not None else ()), *result.freed.states]
        for sid in evicted:
            if self.states.pop(sid, None) is None:
                raise AssertionError(f"freed state {sid} was never admitted")
        seq = tuple(int(t) for t in tokens)
        for depth, sid, _ in result.admitted:
            if sid in self.states:
                raise AssertionError(f"state id {sid} admitted twice")
            self.states[sid] = seq[:depth]


def checked_serve(
    cache: PrefixCache,
    ref: ReferenceCache,
    input_tokens: npt.NDArray[np.int32],
    output_tokens: npt.NDArray[np.int32],
    max_output: int | None = None,
) -> int:
    """Serve one request through `cache` (`PrefixCache.serve`), asserting it agrees with
    `ref` and its budget."""
    plan = cache.plan(input_tokens, max_output)
    want = ref.expected_hit(plan.tokens)
    if plan.hit_len != want:
        raise AssertionError(f"cache hit {plan.hit_len} tokens, reference says {want}")
    full = np.concatenate([plan.tokens, np.asarray(output_tokens, dtype=np.int32)])
    result = cache.commit(plan, full)
    ref.apply(full, result, plan.freed)
    if cache.bytes_used > cache.capacity:
        raise AssertionError(f"{cache.bytes_used} bytes held > capacity {cache.capacity}")
    if len(ref.states) != cache.tree.n_states:
        raise AssertionError(
            f"reference holds {len(ref.states)} states, tree {cache.tree.n_states}"
        )
    return plan.hit_len
