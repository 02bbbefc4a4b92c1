"""A request whose prefix the cache holds but cannot reuse, for want of a state at its
end, is counted (`CacheStats.stateless_misses`), so a user sees why its hit was 0; the
count survives a snapshot and an older snapshot without it restores as 0."""

from __future__ import annotations

import numpy as np
from core_helpers import cache

from marconi_ray.core.cache.cache_codec import from_record, to_record
from marconi_ray.core.cache.stats import STATELESS_MIN_TOKENS


def _serve(c, tokens: np.ndarray, out: int = 4) -> int:
    """Plan, then commit `tokens` + `out` generated tokens; the hit length."""
    plan = c.plan(tokens)
    c.commit(plan, np.concatenate([tokens, np.arange(900, 900 + out, dtype=np.int32)]))
    return plan.hit_len


def test_a_shared_prefix_without_a_state_is_a_stateless_miss_once() -> None:
    c = cache()
    base = np.arange(7, 7 + 100, dtype=np.int32)
    assert _serve(c, base) == 0  # cold: nothing matched
    branch = np.concatenate([base[:60], np.arange(500, 540, dtype=np.int32)])
    # 60 tokens cached, but the only state is after the first request's output
    assert _serve(c, branch) == 0
    assert (c.stats.stateless_misses, c.stats.stateless_miss_tokens) == (1, 60)
    # the branch point admitted a state at 60: the next request there hits
    again = np.concatenate([base[:60], np.arange(600, 640, dtype=np.int32)])
    assert _serve(c, again) == 60
    assert c.stats.stateless_misses == 1
    assert c.stats.to_dict()["stateless_miss_share"] == 1 / 3


def test_a_short_shared_start_is_not_counted() -> None:
    c = cache()
    _serve(c, np.arange(7, 107, dtype=np.int32))
    short = STATELESS_MIN_TOKENS - 1
    other = np.concatenate(
        [np.arange(7, 7 + short, dtype=np.int32), np.arange(700, 760, dtype=np.int32)]
    )
    assert _serve(c, other) == 0 and c.stats.stateless_misses == 0


def test_the_counts_survive_a_snapshot_and_older_ones_restore_as_zero() -> None:
    c = cache()
    base = np.arange(7, 107, dtype=np.int32)
    _serve(c, base)
    _serve(c, np.concatenate([base[:50], np.arange(500, 520, dtype=np.int32)]))
    record = to_record(c)
    back = from_record(record)
    assert (back.stats.stateless_misses, back.stats.stateless_miss_tokens) == (1, 50)
    older = dict(record)
    older["stats"] = {k: v for k, v in record["stats"].items() if not k.startswith("stateless")}
    assert from_record(older).stats.stateless_misses == 0
