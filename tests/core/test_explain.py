"""`core.cache.explain`: recording why FLOP-aware eviction took each victim changes nothing
and explains every eviction."""

from __future__ import annotations

import pytest
from core_helpers import SMALL_COST, chat_requests

from marconi_ray.core.cache.explain import Decision, summarize
from marconi_ray.core.sim.replay import RunConfig, run_replay


@pytest.mark.parametrize("alpha", [0.0, 1.5])
def test_explaining_decides_as_the_policy_and_records_every_eviction(alpha: float) -> None:
    reqs = chat_requests(n_sessions=12, turns=6, seed=3)
    cfg = RunConfig("marconi", 4000, alpha=alpha)
    plain = run_replay(reqs, SMALL_COST, cfg)
    decisions: list[Decision] = []
    explained = run_replay(reqs, SMALL_COST, cfg, explain=decisions)
    assert explained.token_hit_rate == plain.token_hit_rate
    assert explained.evictions == plain.evictions == len(decisions) > 0
    assert all(0 <= d.recency <= 1 and 0 <= d.efficiency <= 1 for d in decisions)
    assert all(d.score == pytest.approx(d.recency + alpha * d.efficiency) for d in decisions)
    assert all(d.reason in ("branch", "last_token") for d in decisions)
    requests = [d.request for d in decisions]
    assert requests == sorted(requests) and requests[-1] < len(reqs)
    summary = summarize(decisions)
    assert summary.decisions == len(decisions)
    if alpha == 0:  # pure recency: every victim is the least recent candidate
        assert summary.lru_choice_share == 1.0 and all(d.recency == 0 for d in decisions)
    else:
        assert summary.lru_choice_share < 1.0, "alpha 1.5 should overrule recency sometimes"


def test_explain_needs_flop_aware_eviction() -> None:
    with pytest.raises(ValueError, match="flop_aware"):
        run_replay(chat_requests(2, 2, 1), SMALL_COST, RunConfig("sglang+", 4000), explain=[])


def test_an_empty_summary_is_zeros() -> None:
    assert summarize([]).decisions == 0 and summarize([]).lru_choice_share == 0.0
