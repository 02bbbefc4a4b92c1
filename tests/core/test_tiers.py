"""Two-tier caches (device + host): every hit, move and free checked against a
brute-force reference that learns only from what the cache reports, per-tier budgets,
the demote-or-drop rule, promotion of hits, and one tier staying exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import SMALL_COST, cache, chat_requests, toks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_properties import POLICIES, streams

from marconi_ray.core.cache.host_tier import HostTier
from marconi_ray.core.cache.invariants import check_cache_tiers
from marconi_ray.core.sim.reference import TieredReference, checked_serve_tiered

CLOCKS = [0.5, 2.5, 400.0]
"""Prefill speeds (TFLOP/s) that, with SMALL_COST and 50 GB/s, make demotion pay for no
node (400), for long edges only (2.5: > ~10 tokens), or for nearly every node (0.5)."""


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=streams(),
    policy=st.sampled_from(POLICIES),
    device=st.integers(120, 900),
    host=st.integers(1, 1500),
    tflops=st.sampled_from(CLOCKS),
    placement=st.sampled_from(["flop_aware", "lru"]),
    reserve=st.sampled_from([None, 3]),
)
def test_every_hit_move_and_free_agrees_with_the_reference(
    stream, policy, device, host, tflops, placement, reserve
) -> None:
    admission, eviction = policy
    tier = HostTier(host, prefill_tflops=tflops, placement=placement)
    c = cache(capacity=device, admission=admission, eviction=eviction, alpha=0.5, host=tier)
    ref = TieredReference()
    next_kv = 0
    for inp, reply in stream:
        _, next_kv = checked_serve_tiered(c, ref, inp, reply, next_kv, reserve)
        check_cache_tiers(c)
    assert c.stats.peak_bytes <= device and c.stats.host_peak_bytes <= host
    assert all(node.lock == 0 for node in c.tree.iter_nodes())


def _served(host: HostTier, device: int = 700, **kw: object) -> tuple[object, list[object]]:
    c = cache(capacity=device, host=host, **kw)  # type: ignore[arg-type]
    ref = TieredReference()
    plans = []
    next_kv = 0
    for req in chat_requests(4, 4, seed=2):
        plan, next_kv = checked_serve_tiered(c, ref, req.input_tokens, req.output_tokens, next_kv)
        plans.append(plan)
    return c, plans


def test_a_conversation_resumes_from_host_states_and_kv() -> None:
    """Four interleaved chats through a device that holds about one of them: turns
    whose history was demoted hit it on the host, promoted back before the prefill."""
    c, plans = _served(HostTier(10**6, prefill_tflops=0.5))
    from_host = [p for p in plans if p.host_tokens]  # type: ignore[attr-defined]
    assert from_host, "no hit was served from the host"
    for plan in from_host:
        moves = [m for m in plan.freed.moves if not m.to_host]  # type: ignore[attr-defined]
        assert sum(m.n_bytes for m in moves) == plan.host_bytes  # type: ignore[attr-defined]
        promoted = {sid for m in moves for sid in m.states}
        assert plan.hit_state in promoted or not plan.host_bytes % 10  # type: ignore[attr-defined]
    stats = c.stats  # type: ignore[attr-defined]
    assert stats.demotions and stats.promotions and stats.host_hit_tokens > 0
    assert stats.host_hit_tokens == sum(p.host_tokens for p in plans)  # type: ignore[attr-defined]


def test_a_host_tier_only_adds_hits_when_it_holds_everything() -> None:
    """With room for everything on the host, every device eviction is a demotion, so
    the two-tier cache hits at least what the device-only cache hits, request by
    request, and drops nothing."""
    device_only = cache(capacity=700)
    c, plans = _served(HostTier(10**6, placement="lru"))
    for req, plan in zip(chat_requests(4, 4, seed=2), plans, strict=True):
        alone = device_only.serve(req.input_tokens, req.output_tokens)
        assert plan.hit_len >= alone  # type: ignore[attr-defined]
    stats = c.stats  # type: ignore[attr-defined]
    assert stats.host_evictions == 0 and stats.evictions == stats.demotions
    assert stats.hit_tokens > device_only.stats.hit_tokens


def test_flop_aware_placement_drops_what_is_cheaper_to_recompute_than_to_copy() -> None:
    """The same run, clocked so that recomputing any node beats copying it back: FLOP-
    aware placement drops every victim; LRU placement demotes every one."""
    fast = HostTier(10**6, prefill_tflops=1e6)
    c_flop, _ = _served(fast)
    c_lru, _ = _served(HostTier(10**6, prefill_tflops=1e6, placement="lru"))
    assert c_flop.stats.evictions > 0 and c_flop.stats.demotions == 0  # type: ignore[attr-defined]
    assert c_flop.bytes_by_tier()["host"] == 0  # type: ignore[attr-defined]
    assert c_lru.stats.demotions == c_lru.stats.evictions > 0  # type: ignore[attr-defined]


def test_demotion_rule_is_copy_time_against_prefill_time() -> None:
    tier = HostTier(10**6, gbps=50.0, prefill_tflops=1.0)
    assert tier.copy_seconds(50e9) == pytest.approx(1.0)
    assert tier.prefill_seconds(2e12) == pytest.approx(2.0)
    assert tier.worth_demoting(2e12, 50 * 10**9) and not tier.worth_demoting(2e12, 150 * 10**9)
    assert HostTier(1, placement="lru").worth_demoting(0.0, 10**12)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(capacity_bytes=-1), "host capacity_bytes must be >= 0, got -1"),
        (dict(capacity_bytes=1.5), "host capacity_bytes must be an integer, got 1.5"),
        (dict(gbps=0.0), "host gbps must be a finite number > 0, got 0.0"),
        (dict(prefill_tflops=float("nan")), "prefill_tflops must be a finite number > 0"),
        (dict(placement="mru"), "unknown placement 'mru'"),
    ],
)
def test_bad_host_tier_values_are_named(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        HostTier(**kwargs)  # type: ignore[arg-type]


def test_a_hit_too_big_for_the_device_is_read_from_the_host() -> None:
    """A hit whose host part cannot find room on the device (another request holds it)
    is not promoted: it stays on the host, where the store reads it, and the plan still
    says what it reads."""
    c = cache(capacity=350, host=HostTier(10**6, prefill_tflops=0.5))
    a, b = toks(*range(1, 21)), toks(*range(30, 40))
    c.serve(a, toks())  # 20 tokens + a state: 300 bytes on the device
    c.serve(b, toks())  # 200 more: `a` is demoted to make room
    assert c.bytes_by_tier() == {"device": 200, "host": 300}
    holding_b = c.plan(np.concatenate([b, toks(7)]))  # locks b's node on the device
    plan = c.plan(np.concatenate([a, toks(99)]))
    assert (plan.hit_len, plan.host_tokens, plan.host_bytes) == (20, 20, 300)
    assert not plan.freed.moves  # 300 bytes do not fit next to the 200 held by b
    assert c.bytes_by_tier() == {"device": 200, "host": 300}
    c.abort(plan)
    c.abort(holding_b)
    again = c.plan(np.concatenate([a, toks(98)]))  # now b can go: the hit is promoted
    assert [m.to_host for m in again.freed.moves] == [True, False]
    assert again.freed.moves[1].n_bytes == 300 and again.host_bytes == 300
    assert c.bytes_by_tier() == {"device": 300, "host": 200}
    check_cache_tiers(c)


def test_one_tier_is_unchanged_by_a_zero_host_tier() -> None:
    """`HostTier(0)` is the one-tier cache: the same hits, evictions and bytes."""
    reqs = chat_requests(5, 4, seed=4)
    a = cache(capacity=600, alpha=0.5)
    b = cache(capacity=600, alpha=0.5, host=HostTier(0))
    for req in reqs:
        assert a.serve(req.input_tokens, req.output_tokens) == b.serve(
            req.input_tokens, req.output_tokens
        )
    assert a.stats.to_dict() == b.stats.to_dict() and b.tiers is None
    assert (
        a.bytes_used == b.bytes_used == SMALL_COST.kv_bytes(a.tree.n_tokens) + 100 * a.tree.n_states
    )
