"""`PrefixCache.commit` is a transaction: it validates everything before it changes
anything, and a failure at any later step leaves a consistent cache that reports what the
caller must free (issue: "the caching brain, second pass", item 1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from core_helpers import cache, toks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.cache.prefix_cache import CacheConfig, CommitFailed, PrefixCache
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.presets import get_preset
from marconi_ray.core.tree.tree_types import NO_STATE


def held_states(c: PrefixCache) -> set[int]:
    return {int(n.state) for n in c.tree.iter_nodes() if n.state != NO_STATE}


def held_kv(c: PrefixCache) -> set[int]:
    return {int(h) for n in c.tree.iter_nodes() if n.kv is not None for h in n.kv}


def fingerprint(c: PrefixCache) -> tuple[bytes, float, int, int, int]:
    """Everything a commit may change: tree, locks, plans, stats, counters, clock."""
    return (cache_codec.dumps(c), c.clock, c.reserved, c.open_plans, c.locked_nodes())


def test_the_reviews_reproduction_is_refused_and_changes_nothing() -> None:
    cost = CostModel.from_spec(get_preset("paper-7b"))
    c = PrefixCache(cost, CacheConfig(10**12, "marconi"))
    c.serve(np.arange(1, 101, dtype=np.int32), np.arange(200, 210, dtype=np.int32))
    inp = np.asarray([*range(1, 51), 7777, 7778], dtype=np.int32)
    plan = c.plan(inp)
    assert plan.hit_len == 0 and plan.checkpoints == ((50, "branch"),)
    full = np.concatenate([inp, toks(5, 6)])
    before = fingerprint(c)
    with pytest.raises(ValueError, match="kv covers 10 positions from 52, past the 54"):
        c.commit(plan, full, {50: 900, 54: 901}, kv=np.arange(10), kv_start=52)
    with pytest.raises(ValueError, match="kv starts at 52 but new tokens start at 50"):
        c.commit(plan, full, {50: 900, 54: 901}, kv=np.arange(2), kv_start=52)
    with pytest.raises(ValueError, match=r"kv covers positions \[50, 53\) but the new"):
        c.commit(plan, full, {50: 900, 54: 901}, kv=np.arange(3), kv_start=50)
    assert fingerprint(c) == before and 900 not in held_states(c)
    assert c.stats.requests == 1
    c.abort(plan)  # the plan is still open
    assert c.open_plans == 0 and c.locked_nodes() == 0


def test_a_hit_node_stays_locked_only_while_its_plan_is_open() -> None:
    c = cache()
    c.serve(toks(1, 2, 3), toks(4))
    plan = c.plan(toks(1, 2, 3, 4, 5))
    assert plan.hit_len == 4 and c.locked_nodes() == 1
    with pytest.raises(ValueError, match="not checkpoints"):
        c.commit(plan, toks(1, 2, 3, 4, 5, 6), {6: 1, 2: 7})
    assert c.locked_nodes() == 1
    c.commit(plan, toks(1, 2, 3, 4, 5, 6), {6: 1})
    assert c.locked_nodes() == 0 and c.open_plans == 0


BAD_COMMITS: dict[str, Callable[[int, int, list[int]], dict[str, Any]]] = {
    "missing id": lambda n, h, d: {"state_ids": {x: i for i, x in enumerate(d[:-1])}},
    "extra depth": lambda n, h, d: {
        "state_ids": {**{x: 50 + i for i, x in enumerate(d)}, n + 7: 3}
    },
    "duplicate ids": lambda n, h, d: {"state_ids": dict.fromkeys(d, 5)} if len(d) > 1 else {},
    "negative id": lambda n, h, d: {"state_ids": {x: -2 - i for i, x in enumerate(d)}},
    "kv too short": lambda n, h, d: {"kv": np.arange(max(0, n - h - 1)), "kv_start": h},
    "kv too long": lambda n, h, d: {"kv": np.arange(n - h + 1), "kv_start": h},
    "kv 2-D": lambda n, h, d: {"kv": np.zeros((1, n - h), np.int64), "kv_start": h},
    "kv floats": lambda n, h, d: {"kv": np.zeros(n - h), "kv_start": h},
    "kv past the end": lambda n, h, d: {"kv": np.arange(0), "kv_start": n + 1},
    "wrong tokens": lambda n, h, d: {"tokens": "wrong"},
}


@st.composite
def histories(draw: st.DrawFn) -> list[np.ndarray]:
    seqs: list[np.ndarray] = []
    for _ in range(draw(st.integers(1, 12))):
        tail = np.asarray(draw(st.lists(st.integers(0, 3), min_size=1, max_size=8)), np.int32)
        if seqs and draw(st.booleans()):
            base = seqs[draw(st.integers(0, len(seqs) - 1))]
            tail = np.concatenate([base[: draw(st.integers(1, len(base)))], tail])
        seqs.append(tail)
    return seqs


POLICIES = [
    ("marconi", "flop_aware"),
    ("marconi", "lru"),
    ("fine_grained_refill:3", "lru"),
    ("fine_grained_refill:2", "flop_aware"),
]


def serve_all(c: PrefixCache, seqs: list[np.ndarray]) -> None:
    """Serve all but the last sequence (its last 2 tokens as output), with KV handles."""
    for i, s in enumerate(seqs[:-1]):
        plan = c.plan(s[: max(1, len(s) - 2)])
        h = plan.hit_len
        c.commit(plan, s, None, np.arange(h, len(s)) + 1000 * (i + 1), h)


def ids_for(c: PrefixCache, plan: Any, n: int, base: int) -> dict[int, int]:
    return {d: base + i for i, (d, _) in enumerate(c.checkpoints(plan, n))}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqs=histories(),
    policy=st.sampled_from(POLICIES),
    capacity=st.integers(150, 900),
    bad=st.sampled_from(sorted(BAD_COMMITS)),
)
def test_an_invalid_commit_changes_nothing(seqs, policy, capacity, bad) -> None:
    c = cache(capacity=capacity, admission=policy[0], eviction=policy[1], alpha=0.5)
    serve_all(c, seqs)
    full = np.concatenate([seqs[-1], toks(1, 2)])
    plan = c.plan(seqs[-1], max_output=2)
    n, h = len(full), plan.hit_len
    depths = [d for d, _ in c.checkpoints(plan, n)]
    args = {"tokens": full, "state_ids": ids_for(c, plan, n, 10_000)}
    args["kv"], args["kv_start"] = np.arange(n - h) + 10_000, h
    change = BAD_COMMITS[bad](n, h, depths)
    if not change or (bad == "missing id" and not depths):
        return  # nothing to break for this request (too few checkpoints)
    args.update(change)
    before = fingerprint(c)
    with pytest.raises(ValueError):
        c.commit(plan, **args)
    assert fingerprint(c) == before
    c.commit(plan, full, ids_for(c, plan, n, 10_000), np.arange(n - h) + 10_000, h)
    check_tree(c.tree)
    assert c.locked_nodes() == 0 and c.reserved == 0


STEPS = (
    "eviction.choose",
    "tree.evict",
    "tree.evict_into",
    "tree.evict_lru",
    "tree.insert",
    "tree._split",
    "tree._add_child",
    "tree._add_chain",
    "tree._set_state",
)


def inject(c: PrefixCache, step: str, at: int) -> None:
    """Make the `at`-th call of `step` (an attribute path on the cache) raise."""
    owner_name, method = step.split(".")
    owner = getattr(c, owner_name)
    real = getattr(owner, method)
    calls = [0]

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == at:
            raise MemoryError(f"injected at {step} call {at}")
        return real(*args, **kwargs)

    setattr(owner, method, failing)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqs=histories(),
    policy=st.sampled_from(POLICIES),
    capacity=st.integers(150, 900),
    step=st.sampled_from(STEPS),
    at=st.integers(1, 3),
)
def test_a_failure_at_any_step_leaves_a_consistent_cache(seqs, policy, capacity, step, at):
    """Everything the tree held or was given is afterwards either still held or reported
    to the caller to free, exactly once; locks, plans and bytes are consistent; the failed
    request is not counted and its plan is aborted."""
    c = cache(capacity=capacity, admission=policy[0], eviction=policy[1], alpha=0.5)
    serve_all(c, seqs)
    full = np.concatenate([seqs[-1], toks(1, 2)])
    plan = c.plan(seqs[-1], max_output=2)
    n, h = len(full), plan.hit_len
    given_ids = ids_for(c, plan, n, 10_000)
    kv = np.arange(n - h) + 100_000
    states_before, kv_before, requests = held_states(c), held_kv(c), c.stats.requests
    inject(c, step, at)
    try:
        result = c.commit(plan, full, given_ids, kv, h)
    except CommitFailed as exc:
        assert isinstance(exc.__cause__, MemoryError)
        assert not c.is_open(plan) and c.stats.requests == requests
        freed = exc.freed
        kept_ids, kept_kv = exc.held, exc.held_kv
    else:  # the injected step was never reached
        freed = result.freed
        kept_ids = {sid for _, sid, _ in result.admitted}
        kept_kv = {int(x) for x in kv[result.kv_used[0] - h : result.kv_used[1] - h]}
    check_tree(c.tree)
    assert c.open_plans == 0 and c.locked_nodes() == 0 and c.reserved == 0
    assert c.bytes_used <= c.capacity
    after = held_states(c)
    assert len(freed.states) == len(set(freed.states))
    assert after | set(freed.states) == states_before | kept_ids
    assert not after & set(freed.states) and kept_ids <= after
    assert set(given_ids.values()) & after == kept_ids
    if c.admission.only_reason is None:  # else no per-state records are kept
        assert set(c.reasons) == after, "every live state, and only those, has its reason"
    freed_kv = {int(x) for arr in freed.kv if arr is not None for x in arr}
    assert held_kv(c) | freed_kv == kv_before | kept_kv
    assert not held_kv(c) & freed_kv
