"""PrefixCache protocol: capacity as a hard limit, locks, aborts, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import SMALL_COST, cache, chat_requests, toks

from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.cache.prefix_cache import CacheConfig, PrefixCache
from marconi_ray.core.sim.reference import ReferenceCache, checked_serve


def test_bytes_follow_tokens_and_states() -> None:
    c = cache()
    c.serve(toks(1, 2, 3), toks(4))
    assert c.bytes_used == 4 * 10 + 1 * 100
    assert c.bytes_by_kind() == {"kv": 40, "ssm": 100}


def test_states_that_cannot_fit_are_dropped_not_overflowed() -> None:
    c = cache(capacity=150)  # room for one state + 5 tokens
    result = c.commit(c.plan(toks(1, 2, 3, 4, 5, 6, 7, 8)), toks(1, 2, 3, 4, 5, 6, 7, 8, 9))
    assert result.admitted == () and result.dropped == 1
    assert c.bytes_used == 0 and c.stats.states_dropped == 1
    assert c.serve(toks(1, 2), toks(3)) == 0 and c.bytes_used == 130


def test_deepest_states_are_dropped_first() -> None:
    c = cache(capacity=100 + 100 + 40)
    c.serve(toks(1, 2, 3), toks(4))  # 140 bytes
    plan = c.plan(toks(1, 2, 8, 8, 8, 8))
    assert plan.checkpoints == ((2, "branch"),)
    result = c.commit(plan, toks(1, 2, 8, 8, 8, 8, 8, 8, 8, 8))
    assert [d for d, _, _ in result.admitted] == [2]
    assert c.bytes_used <= c.capacity
    check_tree(c.tree)


def test_capacity_holds_on_every_request_of_every_system() -> None:
    """Artifact bug 3: a cache never goes over capacity (the artifact's did by 18-21%)."""
    reqs = chat_requests(6, 8, seed=3)
    for admission, eviction in (
        ("fine_grained:4", "lru"),
        ("marconi", "lru"),
        ("marconi", "flop_aware"),
    ):
        c = cache(capacity=1500, admission=admission, eviction=eviction, alpha=1.0)
        ref = ReferenceCache()
        for r in reqs:
            checked_serve(c, ref, r.input_tokens, r.output_tokens)
        assert c.stats.evictions > 0
        assert c.stats.peak_bytes <= 1500


def test_hit_node_stays_locked_until_commit_or_abort() -> None:
    c = cache(capacity=10**6)
    c.serve(toks(1, 2, 3), toks(4))
    plan = c.plan(toks(1, 2, 3, 4, 5))
    assert plan.hit_node.lock == 1 and c.open_plans == 1
    assert c.eviction.choose(c.tree, c.clock) is None
    c.abort(plan)
    assert plan.hit_node.lock == 0 and c.open_plans == 0
    with pytest.raises(ValueError, match="not open"):
        c.commit(plan, toks(1, 2, 3, 4, 5))


def test_interleaved_plans_commit_in_any_order() -> None:
    c = cache(capacity=2000)
    ref = ReferenceCache()
    reqs = chat_requests(4, 3, seed=1)
    plans = [(c.plan(r.input_tokens), r) for r in reqs[:4]]
    for plan, r in reversed(plans):
        full = np.concatenate([plan.tokens, r.output_tokens])
        ref.apply(full, c.commit(plan, full))
        check_tree(c.tree)
    assert all(n.lock == 0 for n in c.tree.iter_nodes())
    assert len(ref.states) == c.tree.n_states
    assert c.lookup(np.concatenate([reqs[0].input_tokens, reqs[0].output_tokens])) > 0


def test_live_commit_uses_given_state_ids_and_returns_the_rest() -> None:
    c = cache()
    c.serve(toks(1, 2, 3, 4), toks(5))
    plan = c.plan(toks(1, 2, 9))
    result = c.commit(plan, toks(1, 2, 9, 9), state_ids={2: 70, 4: 71}, kv=np.arange(4), kv_start=0)
    assert sorted(sid for _, sid, _ in result.admitted) == [70, 71]
    plan = c.plan(toks(1, 2, 8))
    before = (c.bytes_used, c.tree.n_states)
    with pytest.raises(ValueError, match="no state id"):
        c.commit(plan, toks(1, 2, 8, 8), state_ids={2: 1})
    assert (c.bytes_used, c.tree.n_states) == before and c.open_plans == 1
    c.abort(plan)
    assert all(n.lock == 0 for n in c.tree.iter_nodes())


@pytest.mark.parametrize(
    "tokens,message",
    [([], "non-empty"), ([[1, 2]], "1-D"), ([1.5, 2.0], "integers"), ([-1, 3], "ids")],
)
def test_bad_tokens_raise_and_change_nothing(tokens: object, message: str) -> None:
    c = cache()
    c.serve(toks(1, 2), toks(3))
    before = (c.bytes_used, c.clock, c.stats.requests)
    with pytest.raises(ValueError, match=message):
        c.plan(tokens)
    assert (c.bytes_used, c.clock, c.stats.requests) == before


def test_commit_must_extend_the_planned_input() -> None:
    c = cache()
    plan = c.plan(toks(1, 2))
    with pytest.raises(ValueError, match="start with"):
        c.commit(plan, toks(2, 2, 3))
    c.commit(plan, toks(1, 2, 3))


@pytest.mark.parametrize("capacity", [0, -5])
def test_non_positive_capacity_is_rejected(capacity: int) -> None:
    with pytest.raises(ValueError, match=str(capacity)):
        PrefixCache(SMALL_COST, CacheConfig(capacity))


def test_plan_reuses_the_peek_walk_only_while_the_tree_is_unchanged() -> None:
    c = cache()
    c.serve(toks(1, 2, 3, 4), toks(5, 6))
    walks = []
    real = c.tree.match
    c.tree.match = lambda tokens: walks.append(len(tokens)) or real(tokens)  # type: ignore[method-assign]
    prompt = toks(1, 2, 3, 4, 5, 6, 7)
    assert c.peek(prompt) == (6, True)
    plan = c.plan(prompt)
    assert plan.hit_len == 6 and walks == [7]  # route's walk, reused by plan
    c.abort(plan)
    other = toks(1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert c.peek(prompt)[0] == 6
    c.tree.evict(real(prompt).hit_node)  # the tree changes after the peek
    walks.clear()
    plan = c.plan(prompt)  # walks again: the old walk's hit was evicted
    assert walks == [7] and plan.hit_len == c.lookup(prompt) < 6
    c.abort(plan)
    c.peek(prompt)
    walks.clear()
    plan = c.plan(other)  # another array: no reuse
    assert walks == [9] and plan.hit_len == c.lookup(prompt)
    c.commit(plan, other)
    check_tree(c.tree)


def test_commit_reports_which_kv_positions_the_tree_took() -> None:
    c = cache()
    c.serve(toks(1, 2, 3, 4), toks(5))
    plan = c.plan(toks(1, 2, 9))
    result = c.commit(plan, toks(1, 2, 9, 9), state_ids={2: 70, 4: 71}, kv=np.arange(4), kv_start=0)
    assert result.kv_used == (2, 4)  # positions 0-1 were in the tree already
    plan = c.plan(toks(7, 7))
    dropped = c.commit(plan, toks(7, 7, 7), state_ids={3: 5}, kv=np.arange(3), kv_start=0)
    assert dropped.kv_used == (0, 3)
