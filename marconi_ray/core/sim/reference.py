"""An independent brute-force model of what a `PrefixCache` holds (debug mode, tests).

It keeps, per live SSM state id, the exact token prefix that state covers, learned only
from `CommitResult`s (what was admitted, what was freed). It answers "what is the longest
prefix of t with a live state?" by scanning every state, with no tree at all, so a bug in
the radix tree's match, split, merge or eviction shows up as a disagreement.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.prefix_cache import CommitResult, Plan, PrefixCache
from marconi_ray.core.tree.tree_types import Reclaimed


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


class TieredReference(ReferenceCache):
    """A `ReferenceCache` that also keeps every live KV id (with the token prefix whose
    last position it holds) and which tier each live state and KV id is in, learned only
    from what mutations report (admissions, `Reclaimed.moves`, frees)."""

    def __init__(self) -> None:
        super().__init__()
        self.host_states: set[int] = set()
        self.kv: dict[int, tuple[int, ...]] = {}
        self.host_kv: set[int] = set()

    def expected_from_host(self, tokens: npt.NDArray[np.int32], hit_len: int) -> int:
        """Hit tokens of `tokens[:hit_len]` whose KV is on the host."""
        seq = tuple(int(t) for t in tokens[:hit_len])
        return sum(
            1
            for kid in self.host_kv
            if len(self.kv[kid]) <= hit_len and seq[: len(self.kv[kid])] == self.kv[kid]
        )

    def learn(self, freed: Reclaimed) -> None:
        """Apply a mutation's moves, in order, then its frees; AssertionError on a move
        or free of something not held, or a move to the tier it is already in."""
        for move in freed.moves:
            for sid in move.states:
                assert sid in self.states, f"moved state {sid} is not held"
                assert (sid in self.host_states) != move.to_host, f"state {sid} moved in place"
                (self.host_states.add if move.to_host else self.host_states.discard)(sid)
            for handle in move.kv:
                for kid in np.asarray(handle).tolist():
                    assert kid in self.kv, f"moved KV {kid} is not held"
                    assert (kid in self.host_kv) != move.to_host, f"KV {kid} moved in place"
                    (self.host_kv.add if move.to_host else self.host_kv.discard)(kid)
        for sid in freed.states:
            if self.states.pop(sid, None) is None:
                raise AssertionError(f"freed state {sid} was never admitted")
            self.host_states.discard(sid)
        for handle in freed.kv:
            if handle is None:
                continue
            for kid in np.asarray(handle).tolist():
                assert self.kv.pop(kid, None) is not None, f"freed KV {kid} is not held"
                self.host_kv.discard(kid)

    def admit(
        self,
        tokens: npt.NDArray[np.int32],
        result: CommitResult,
        kv: npt.NDArray[np.int64],
        kv_start: int,
    ) -> None:
        """Learn a commit's admitted states and the KV ids the tree took (on the device)."""
        seq = tuple(int(t) for t in tokens)
        for depth, sid, _ in result.admitted:
            assert sid not in self.states, f"state id {sid} admitted twice"
            self.states[sid] = seq[:depth]
        start, end = result.kv_used
        for pos in range(start, end):
            kid = int(kv[pos - kv_start])
            assert kid not in self.kv, f"KV id {kid} admitted twice"
            self.kv[kid] = seq[: pos + 1]

    def check(self, cache: PrefixCache) -> None:
        """The cache holds exactly this reference's ids, in its tiers, within budgets."""
        states, slots = cache.referenced()
        assert states == set(self.states), "the tree's states differ from the reference's"
        assert slots == set(self.kv), "the tree's KV ids differ from the reference's"
        host_states, host_kv = cache.referenced_on_host()
        assert host_states == self.host_states, "states on the host differ"
        assert host_kv == self.host_kv, "KV ids on the host differ"
        cost = cache.cost
        host = cost.kv_bytes(len(self.host_kv)) + len(self.host_states) * cost.state_bytes
        total = cost.kv_bytes(len(self.kv)) + len(self.states) * cost.state_bytes
        tiers = cache.bytes_by_tier()
        assert tiers == {"device": total - host, "host": host}, f"{tiers}: host {host}"
        assert tiers["device"] + cache.reserved <= cache.capacity, "device over capacity"
        assert tiers["host"] <= cache.host_capacity, "host over capacity"


def checked_serve_tiered(
    cache: PrefixCache,
    ref: TieredReference,
    input_tokens: npt.NDArray[np.int32],
    output_tokens: npt.NDArray[np.int32],
    next_kv: int,
    max_output: int | None = None,
) -> tuple[Plan, int]:
    """Serve one request through a (two-tier) `cache` with fresh KV ids from `next_kv`
    for its computed positions, as the engine does, asserting it agrees with `ref` on the
    hit, the hit's host part, every move and free, and both budgets. Returns the plan
    and the next free KV id."""
    plan = cache.plan(input_tokens, max_output)
    want = ref.expected_hit(plan.tokens)
    if plan.hit_len != want:
        raise AssertionError(f"cache hit {plan.hit_len} tokens, reference says {want}")
    from_host = ref.expected_from_host(plan.tokens, plan.hit_len)
    if plan.host_tokens != from_host:
        raise AssertionError(
            f"plan says {plan.host_tokens} hit tokens on the host, not {from_host}"
        )
    ref.learn(plan.freed)
    full = np.concatenate([plan.tokens, np.asarray(output_tokens, dtype=np.int32)])
    kv = np.arange(next_kv, next_kv + len(full) - plan.hit_len, dtype=np.int64)
    result = cache.commit(plan, full, kv=kv, kv_start=plan.hit_len)
    ref.learn(result.freed)
    ref.admit(full, result, kv, plan.hit_len)
    ref.check(cache)
    return plan, next_kv + len(kv)
