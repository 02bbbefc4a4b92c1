"""Reuse classes (continuation / branch / inside_input) on hand-made traces."""

from __future__ import annotations

import numpy as np
import pytest

from marconi_ray.core.sim.oracle import oracle_hits
from marconi_ray.core.sim.reuse import KINDS, ReuseHit, ReuseStats, classify_reuse, reuse_stats
from marconi_ray.traces.trace import Request


def _req(inp: list[int], out: list[int] | None = None) -> Request:
    return Request(0, 0, 0.0, np.array(inp), np.array(out or [], dtype=np.int64))


def _kinds(reqs: list[Request]) -> list[tuple[int, str, bool]]:
    return [(h.tokens, h.kind, h.input_end_only) for h in classify_reuse(reqs)]


def test_each_class_on_a_known_trace() -> None:
    reqs = [
        _req([1, 2, 3, 4], [5, 6]),  # first: miss
        _req([1, 2, 3, 4, 5, 6, 7], [8]),  # ends where request 0's input + output ended
        _req([1, 2, 3, 4, 9]),  # ends at request 0's input end, one child there
        _req([1, 2, 3, 4, 8]),  # same point, now a fork (children 5 and 9)
        _req([1, 2, 7, 7]),  # inside the edge 1 2 3 4
        _req([9, 9]),  # nothing shared
        _req([1, 2, 3, 4, 5, 7]),  # inside request 0's output (5 6)
        _req([1, 2, 3, 4, 5, 6, 10]),  # continuation again: a second child at depth 6
        _req([1, 2, 3, 4, 5, 6, 11]),  # a sequence end and a fork: continuation first
    ]
    assert _kinds(reqs) == [
        (0, "miss", False),
        (6, "continuation", False),
        (4, "branch", True),
        (4, "branch", False),
        (2, "inside_input", False),
        (0, "miss", False),
        (5, "inside_input", False),
        (6, "continuation", False),
        (6, "continuation", False),
    ]
    assert [h.tokens for h in classify_reuse(reqs)] == oracle_hits(reqs)


def test_input_end_that_later_ends_a_sequence() -> None:
    reqs = [
        _req([1, 2, 3], [4]),
        _req([1, 2, 3]),  # its input is request 0's input: a branch (input end)
        _req([1, 2, 3, 9]),  # request 1's whole sequence ended at 3: continuation
    ]
    assert _kinds(reqs) == [(0, "miss", False), (3, "branch", True), (3, "continuation", False)]


def test_whole_input_seen_before_and_repeats() -> None:
    reqs = [_req([1, 2, 3, 4], [5]), _req([1, 2]), _req([1, 2, 3, 4], [5]), _req([1, 2, 3, 4])]
    assert _kinds(reqs) == [
        (0, "miss", False),
        (2, "inside_input", False),  # the edge 1 2 3 4 5 is split only by this insert
        (4, "branch", True),  # a repeat: its hit ends at request 0's input end
        (4, "branch", True),  # one child there still (5): an input end, no fork
    ]
    assert [h.tokens for h in classify_reuse(reqs)] == oracle_hits(reqs)


def test_stats_weigh_by_tokens_and_count_requests() -> None:
    reqs = [
        _req([1, 2, 3, 4], [5, 6]),
        _req([1, 2, 3, 4, 5, 6, 7]),  # continuation, 6 tokens
        _req([1, 2, 3, 4, 9]),  # branch (input end), 4 tokens
        _req([1, 2, 7]),  # inside, 2 tokens
    ]
    s = reuse_stats(reqs)
    assert s == ReuseStats(
        requests=4,
        input_tokens=19,
        continuation_tokens=6,
        branch_tokens=4,
        inside_input_tokens=2,
        branch_input_end_tokens=4,
        continuation_requests=1,
        branch_requests=1,
        inside_input_requests=1,
        branch_input_end_requests=1,
        miss_requests=1,
    )
    assert s.hit_tokens == 12 == sum(oracle_hits(reqs))
    assert sum(s.fraction(k) for k in KINDS) == pytest.approx(1.0)
    d = s.as_dict()
    assert d["reuse_continuation_fraction"] == pytest.approx(0.5)
    assert d["reuse_oracle_hit_rate"] == pytest.approx(12 / 19)
    assert all(isinstance(v, float) for v in d.values())
    empty = reuse_stats([])
    assert empty.hit_tokens == 0 and empty.fraction("branch") == 0.0
    assert empty.as_dict()["reuse_oracle_hit_rate"] == 0.0


def test_random_traces_match_the_oracle() -> None:
    rng = np.random.default_rng(0)
    reqs: list[Request] = []
    for _ in range(200):
        if reqs and rng.random() < 0.7:
            base = reqs[int(rng.integers(len(reqs)))].tokens
            cut = int(rng.integers(1, len(base) + 1))
            inp = np.concatenate([base[:cut], rng.integers(0, 3, int(rng.integers(0, 4)))])
        else:
            inp = rng.integers(0, 3, int(rng.integers(1, 6)))
        reqs.append(_req(inp.tolist(), rng.integers(0, 3, int(rng.integers(0, 3))).tolist()))
    hits = classify_reuse(reqs)
    assert [h.tokens for h in hits] == oracle_hits(reqs)
    assert {h.kind for h in hits} == {*KINDS, "miss"}
    assert all(isinstance(h, ReuseHit) and (h.tokens == 0) == (h.kind == "miss") for h in hits)
