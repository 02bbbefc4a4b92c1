"""Admission policies: Marconi's branch + last-token rule, fine-grained blocks, none."""

from __future__ import annotations

import pytest
from core_helpers import cache, toks

from marconi_ray.core.admission import make_admission


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
    assert c.stats.states_admitted == {"branch": 0, "last_token": 2, "block": 0}


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


def test_fine_grained_checkpoints_every_block_and_the_last_partial_block() -> None:
    c = cache(admission="fine_grained:4", eviction="lru")
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
    "bad", ["bogus", "fine_grained", "fine_grained:x", "fine_grained:0", "none:3"]
)
def test_bad_admission_names_raise_naming_the_value(bad: str) -> None:
    with pytest.raises(ValueError, match=r"fine_grained|bogus|none"):
        make_admission(bad)
