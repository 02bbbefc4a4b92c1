"""Admission policies: Marconi's branch + last-token rule, fine-grained blocks, none."""

from __future__ import annotations

import pytest
from core_helpers import cache, toks

from marconi_ray.core.cache.admission import make_admission
from marconi_ray.core.cache.invariants import check_tree


def test_shared_input_prefix_detected_on_second_and_reused_on_third_occurrence() -> None:
    c = cache()
    system = (7, 7, 7, 7)
    assert c.serve(toks(*system, 1, 1), toks(5)) == 0
    plan = c.plan(toks(*system, 2, 2))
    assert plan.hit_len == 0
    assert plan.checkpoints == ((4, "branch"),)
    c.commit(plan, toks(*system, 2, 2, 5))
    assert c.serve(toks(*system, 3, 3), toks(5)) == 4
    assert c.stats.states_admitted["branch"] == 1


def test_conversation_continuation_hits_the_last_decoded_token() -> None:
    c = cache()
    c.serve(toks(1, 2, 3), toks(4, 5))
    plan = c.plan(toks(1, 2, 3, 4, 5, 6))
    assert plan.hit_len == 5 and plan.checkpoints == ()
    c.commit(plan, toks(1, 2, 3, 4, 5, 6, 8))
    assert c.stats.states_admitted == {"branch": 0, "last_token": 2, "block": 0, "speculative": 0}


def test_at_most_two_states_per_request() -> None:
    c = cache()
    c.serve(toks(1, 2, 3, 4), toks(5))
    result = c.commit(c.plan(toks(1, 2, 9, 9)), toks(1, 2, 9, 9, 9))
    assert [(d, r) for d, _, r in result.admitted] == [(2, "branch"), (5, "last_token")]


def test_stateless_branch_node_gets_a_state_when_branched_again() -> None:
    c = cache()
    c.serve(toks(1, 2, 3), toks(4, 5))
    c.serve(toks(1, 2, 3), toks(4, 6))  # outputs diverge at depth 4: a state-less branch
    branch = c.tree.match(toks(1, 2, 3, 4)).path[-1]
    assert branch.depth == 4 and branch.state < 0 and len(branch.children) == 2
    plan = c.plan(toks(1, 2, 3, 4, 7))
    assert plan.hit_len == 3 and plan.checkpoints == ((4, "branch"),)


def test_fine_grained_checkpoints_every_full_block_only_as_vllm_does() -> None:
    c = cache(admission="fine_grained:4", eviction="lru")
    plan = c.plan(toks(*range(1, 11)))
    assert plan.checkpoints == ((4, "block"), (8, "block"))
    result = c.commit(plan, toks(*range(1, 15)))
    assert [d for d, _, _ in result.admitted] == [4, 8, 12]
    assert c.lookup(toks(*range(1, 15))) == 12
    assert not c.keeps_final(10) and c.keeps_final(11)  # 11 + 1 = 12 ends a block


def test_fine_grained_refill_checkpoints_every_block_and_the_last_partial_block() -> None:
    c = cache(admission="fine_grained_refill:4", eviction="lru")
    plan = c.plan(toks(*range(1, 11)))
    assert plan.checkpoints == ((4, "block"), (8, "block"))
    result = c.commit(plan, toks(*range(1, 15)))
    assert [d for d, _, _ in result.admitted] == [4, 8, 12, 14]
    assert c.lookup(toks(*range(1, 11))) == 8


def test_none_admission_caches_nothing() -> None:
    c = cache(admission="none", eviction="lru")
    c.serve(toks(1, 2, 3), toks(4))
    assert c.serve(toks(1, 2, 3, 4, 5), toks(4)) == 0
    assert c.bytes_used == 0


@pytest.mark.parametrize(
    "bad",
    [
        "bogus",
        "fine_grained",
        "fine_grained:x",
        "fine_grained:0",
        "fine_grained_refill",
        "fine_grained_refill:-2",
        "none:3",
    ],
)
def test_bad_admission_names_raise_naming_the_value(bad: str) -> None:
    with pytest.raises(ValueError, match=r"fine_grained|bogus|none"):
        make_admission(bad)


@pytest.mark.parametrize(
    ("spec", "depths", "superseded"),
    [("fine_grained:32", [32, 64], 0), ("fine_grained_refill:32", [32, 64, 80], 1)],
)
def test_vllm_variants_on_a_turn_that_completes_a_partial_block(spec, depths, superseded) -> None:
    """40 input + 10 output tokens, then an 80-token input extending them. Real vLLM
    caches full blocks only; the artifact refills the partial block (state at 50) in
    place. Keeping it would pin one stale inner state per turn."""
    c = cache(admission=spec, eviction="lru")
    c.serve(toks(*range(1, 41)), toks(*range(41, 51)))
    hit = c.serve(toks(*range(1, 81)), toks())
    assert hit == (32 if spec == "fine_grained:32" else 50)
    assert sorted(n.depth for n in c.tree.iter_nodes() if n.state >= 0) == depths
    assert c.stats.states_superseded == superseded
    check_tree(c.tree)


def test_refill_keeps_a_partial_state_that_another_branch_still_extends() -> None:
    c = cache(admission="fine_grained_refill:4", eviction="lru")
    c.serve(toks(1, 2, 3, 4, 5, 6, 20), toks())  # states 4 and 7 (partial)
    c.serve(toks(1, 2, 3, 4, 5, 6, 30), toks())  # a branch at 6, another partial 7
    c.serve(toks(1, 2, 3, 4, 5, 6), toks())  # partial state 6 on the branch node
    c.serve(toks(1, 2, 3, 4, 5, 6, 20, 21), toks())  # completes the block on one branch
    held = sorted(n.depth for n in c.tree.iter_nodes() if n.state >= 0)
    assert held == [4, 6, 7, 8]  # 7 on the completed branch went; 6 serves both branches
    assert c.lookup(toks(1, 2, 3, 4, 5, 6, 30, 1)) == 7
    assert c.stats.states_superseded == 1
    check_tree(c.tree)


def test_the_refill_test_agrees_with_the_rule_depth_by_depth() -> None:
    """A partial state at `old` is replaced by a new state later in its 8-token block."""
    policy = make_admission("fine_grained_refill:8")
    assert make_admission("fine_grained:8").superseded_by([8, 16]) is None
    for new in ([8, 16, 21], [5], [13, 24, 33], [40]):
        test = policy.superseded_by(new)
        assert test is not None
        lowest, fast = test
        for old in range(1, 45):
            want = old % 8 != 0 and any(old < d and old // 8 == (d - 1) // 8 for d in new)
            assert fast(old) == want, (new, old)
            assert old >= lowest or not want
