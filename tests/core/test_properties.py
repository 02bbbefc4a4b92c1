"""Hypothesis property tests of the docs/ARCHITECTURE.md invariants on random token streams.

Streams mix shared prefixes (branches), continuations (multi-turn) and fresh sequences;
every hit is checked against a brute-force reference, the tree invariants and the byte
budget after every request, for every system and tight capacities.
"""

from __future__ import annotations

import numpy as np
from core_helpers import SMALL_COST, cache
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.sim.reference import ReferenceCache, checked_serve

POLICIES = [
    ("marconi", "flop_aware"),
    ("marconi", "lru"),
    ("fine_grained:3", "lru"),
    ("fine_grained:5", "flop_aware"),
    ("fine_grained_refill:3", "lru"),
    ("fine_grained_refill:4", "flop_aware"),
    ("marconi+:2", "flop_aware"),
    ("marconi+:3", "lru"),
]


@st.composite
def streams(draw: st.DrawFn) -> list[tuple[np.ndarray, np.ndarray]]:
    n = draw(st.integers(1, 25))
    seqs: list[np.ndarray] = []
    out = []
    for _ in range(n):
        kind = draw(st.sampled_from(["fresh", "extend", "branch"])) if seqs else "fresh"
        tail = np.asarray(draw(st.lists(st.integers(0, 4), min_size=1, max_size=12)), np.int32)
        if kind == "fresh":
            inp = tail
        else:
            base = seqs[draw(st.integers(0, len(seqs) - 1))]
            cut = len(base) if kind == "extend" else draw(st.integers(1, len(base)))
            inp = np.concatenate([base[:cut], tail])
        reply = np.asarray(draw(st.lists(st.integers(0, 4), max_size=6)), np.int32)
        out.append((inp, reply))
        seqs.append(np.concatenate([inp, reply]))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=streams(),
    policy=st.sampled_from(POLICIES),
    capacity=st.integers(120, 1500),
    alpha=st.sampled_from([0.0, 0.5, 2.0]),
)
def test_every_hit_is_real_and_capacity_holds(stream, policy, capacity, alpha) -> None:
    admission, eviction = policy
    c = cache(capacity=capacity, admission=admission, eviction=eviction, alpha=alpha)
    ref = ReferenceCache()
    for inp, reply in stream:
        hit = checked_serve(c, ref, inp, reply)
        assert 0 <= hit <= len(inp)
        check_tree(c.tree)
        assert c.bytes_used == SMALL_COST.kv_bytes(c.tree.n_tokens) + 100 * c.tree.n_states
    assert c.stats.peak_bytes <= capacity
    assert all(node.lock == 0 for node in c.tree.iter_nodes())
    assert c.open_plans == 0


@settings(max_examples=60, deadline=None)
@given(stream=streams(), capacity=st.integers(150, 800), order=st.randoms())
def test_concurrent_plans_never_evict_locked_nodes(stream, capacity, order) -> None:
    """Plans opened together, committed in random order: locks protect every hit."""
    c = cache(capacity=capacity, alpha=1.0)
    ref = ReferenceCache()
    for inp, reply in stream[: len(stream) // 2]:
        checked_serve(c, ref, inp, reply)
    pending = [(c.plan(inp), reply) for inp, reply in stream[len(stream) // 2 :]]
    for plan, _ in pending:
        assert plan.hit_len == ref.expected_hit(plan.tokens)
    order.shuffle(pending)
    for plan, reply in pending:
        assert plan.hit_node is c.tree.root or c.tree.nodes.get(plan.hit_node.slot) is plan.hit_node
        assert plan.hit_node is c.tree.root or plan.hit_node.state >= 0
        full = np.concatenate([plan.tokens, reply])
        ref.apply(full, c.commit(plan, full))
        check_tree(c.tree)
        assert c.bytes_used <= capacity
    assert all(node.lock == 0 for node in c.tree.iter_nodes())
