"""Plan-time byte reservation: what live requests may still admit is budgeted, so
`bytes_used + reserved <= capacity` holds with any number of requests in flight."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import SMALL_COST, cache, chat_requests, toks
from hypothesis import given, settings
from hypothesis import strategies as st

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.invariants import check_tree


def test_reservation_is_the_upper_bound_and_is_released():
    c = cache(capacity=10_000)
    plan = c.plan(toks(1, 2, 3, 4), max_output=6)
    # marconi keeps one state (after the last token) and KV of up to 4 + 6 tokens
    assert plan.reserved == 10 * SMALL_COST.kv_bytes_per_token + SMALL_COST.state_bytes
    assert c.reserved == plan.reserved
    c.commit(plan, toks(1, 2, 3, 4, 5, 6))
    assert c.reserved == 0
    other = c.plan(toks(9, 9), max_output=1)
    c.abort(other)
    assert c.reserved == 0


def test_no_checkpoints_reserve_nothing():
    c = cache(capacity=10_000, admission="none")
    assert c.plan(toks(1, 2, 3), max_output=50).reserved == 0


def test_reservation_evicts_and_commit_respects_other_reservations():
    c = cache(capacity=600, eviction="lru")
    first = c.plan(toks(1, 2, 3, 4, 5), max_output=5)
    c.commit(first, toks(1, 2, 3, 4, 5, 6, 7))  # 7 KV tokens + 1 state = 170 bytes
    assert c.bytes_used == 170
    a = c.plan(toks(8, 8, 8, 8), max_output=20)  # wants 24*10 + 100 = 340
    b = c.plan(toks(7, 7, 7, 7), max_output=20)  # another 340: evicts the first sequence
    assert b.freed.states and c.bytes_used == 0
    assert a.reserved == 340 and b.reserved == 260  # what was left of the 600
    assert c.bytes_used + c.reserved <= c.capacity
    c.commit(a, toks(8, 8, 8, 8, 1, 2))
    assert c.bytes_used + c.reserved <= c.capacity
    c.commit(b, toks(7, 7, 7, 7, 3))
    assert c.reserved == 0 and c.bytes_used <= c.capacity
    check_tree(c.tree)


def test_bad_max_output_changes_nothing():
    c = cache()
    with pytest.raises(ValueError, match="max_output"):
        c.plan(toks(1, 2), max_output=-1)
    assert c.open_plans == 0 and all(n.lock == 0 for n in c.tree.iter_nodes())


def test_snapshot_drops_reservations():
    c = cache()
    c.plan(toks(1, 2), max_output=3)
    restored = cache_codec.restore(cache_codec.snapshot(c))
    assert restored.reserved == 0 and c.reserved > 0


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(200, 3000),
    seed=st.integers(0, 10_000),
    ops=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 15)), min_size=5, max_size=40),
)
def test_capacity_holds_with_requests_in_flight(capacity, seed, ops):
    """Random interleavings of plan (with reservation), commit and abort."""
    c = cache(capacity=capacity, eviction="flop_aware", alpha=1.0)
    reqs = chat_requests(3, 6, seed=seed)
    rng = np.random.default_rng(seed)
    open_plans = []
    i = 0
    for kind, max_out in ops:
        if kind == 0 or not open_plans:
            req = reqs[i % len(reqs)]
            i += 1
            open_plans.append((c.plan(req.input_tokens, max_output=max_out), req, max_out))
        else:
            plan, req, max_out = open_plans.pop(int(rng.integers(0, len(open_plans))))
            if kind == 1:
                out = req.output_tokens[:max_out]
                c.commit(plan, np.concatenate([req.input_tokens, out]))
            else:
                c.abort(plan)
        assert c.bytes_used + c.reserved <= c.capacity
        assert c.reserved == sum(p.reserved for p, _, _ in open_plans)
    check_tree(c.tree)
