"""`core.cache.pair_explain`: the second prompt's reuse after a first, explained with the
cache's own decisions (the hit equals what the cache plans for it)."""

from __future__ import annotations

import numpy as np
import pytest
from core_helpers import SMALL_COST

from marconi_ray.core.cache.pair_explain import explain_pair
from marconi_ray.core.cache.systems import get_system

FIRST = np.arange(7, 107, dtype=np.int32)
OUT = np.arange(900, 904, dtype=np.int32)


def _explain(system: str, second: np.ndarray, output: np.ndarray | None = OUT):
    return explain_pair(SMALL_COST, get_system(system), 10**9, FIRST, second, output)


def test_a_branch_inside_the_first_prompt_is_cached_but_not_reusable_by_marconi() -> None:
    second = np.concatenate([FIRST[:60], np.arange(500, 540, dtype=np.int32)])
    got = _explain("marconi", second)
    assert (got.shared_tokens, got.cached_tokens, got.reusable_tokens) == (60, 60, 0)
    assert got.states == () and got.kept == ((60, "branch"),)
    assert "no state" in got.why and "branch point 60" in got.why


def test_vllm_blocks_reuse_up_to_the_last_full_block() -> None:
    second = np.concatenate([FIRST[:60], np.arange(500, 540, dtype=np.int32)])
    got = _explain("vllm+", second)
    assert (got.cached_tokens, got.reusable_tokens) == (60, 32)
    assert got.states == ((32, "block"),) and "32..60" in got.why


def test_a_conversations_next_turn_reuses_everything_after_the_reply() -> None:
    second = np.concatenate([FIRST, OUT, np.asarray([5, 6], dtype=np.int32)])
    got = _explain("marconi", second)
    assert got.cached_tokens == got.reusable_tokens == len(FIRST) + len(OUT)
    assert got.states[-1] == (104, "last_token") and "all 104" in got.why


def test_vanilla_says_it_caches_nothing_and_an_empty_prompt_is_refused() -> None:
    got = _explain("vanilla", FIRST)
    assert got.reusable_tokens == 0 and [f.code for f in got.findings] == ["caches_nothing"]
    with pytest.raises(ValueError, match="second prompt is empty"):
        _explain("marconi", np.empty(0, np.int32))
    assert _explain("marconi", np.asarray([1, 2], np.int32)).why.startswith("the prompts share no")
