"""The device KV pool sized once from a memory budget (`engine.kv_memory`): the split is
the documented arithmetic, bad settings name their value, and a burst of long prompts
over a budget that holds two at a time waits, ends exactly as an unbounded engine, and
never grows the pool."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.kv_memory import STATES_PER_REQUEST, memory_budget, plan_kv_memory
from marconi_ray.protocol.kv_memory import KVMemory
from marconi_ray.protocol.sampling import SamplingParams


def test_the_budget_splits_into_states_cache_and_running_rows():
    plan = plan_kv_memory(100_000, 20_000, 64, 1_000, 4)
    states = STATES_PER_REQUEST * 4 * 1_000
    assert plan.running_states == states
    assert plan.max_running_tokens == (100_000 - 20_000 - states) // 64
    assert plan.pool_rows == plan.max_running_tokens + 20_000 // 64
    assert plan.pool_rows * 64 <= 100_000
    with pytest.raises(ValueError, match=r"budget of 30000 bytes .* cache takes 20000"):
        plan_kv_memory(30_000, 20_000, 64, 1_000, 4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one"),
        ({"bytes": 10, "fraction": 0.5}, "exactly one"),
        ({"bytes": 0}, "bytes must be an int >= 1, got 0"),
        ({"bytes": True}, "got True"),
        ({"fraction": 1.5}, r"fraction must be in \(0, 1\], got 1.5"),
        ({"fraction": 0.0}, "got 0.0"),
    ],
)
def test_bad_settings_name_their_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        KVMemory(**kwargs)


def test_a_fraction_needs_cuda():
    with pytest.raises(ValueError, match="needs a CUDA device, not cpu"):
        memory_budget(KVMemory(fraction=0.9), torch.device("cpu"))


def test_a_burst_over_the_budget_waits_never_grows_the_pool_and_ends_exactly(model_dirs):
    model_dir = model_dirs["nemotron_h"]
    free = Engine(model_dir, "marconi", 2_000_000)
    row, state = free.store.kv_bytes_per_token, free.store.state_bytes
    vocab = free.config.vocab_size
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    need = 40 + sp.max_tokens
    cache = 2_000_000
    budget = cache + STATES_PER_REQUEST * 8 * state + (2 * need + 5) * row
    bound = Engine(model_dir, "marconi", cache, kv_memory=KVMemory(bytes=budget))
    plan = bound.kv_plan
    assert plan is not None and plan.max_running_tokens == 2 * need + 5
    pool = bound.store.device_kv
    assert pool.capacity == plan.pool_rows and pool.sized
    batch = prompts(31, 6, 40, vocab)
    for turn in range(2):  # the second turn's prompts start with cached states
        peak = 0
        original_step = bound.worker.step

        def watched(prefill_chunk: bool = True, step=original_step):
            nonlocal peak
            peak = max(peak, len(bound.worker.running_ids()))
            assert bound.worker.reserved_rows <= plan.max_running_tokens
            return step(prefill_chunk)

        bound.worker.step = watched
        got = bound.generate_many(batch, [sp] * len(batch))
        bound.worker.step = original_step
        want = free.generate_many(batch, [sp] * len(batch))
        assert [r.tokens for r in got] == [r.tokens for r in want]
        assert [r.usage.cached_tokens for r in got] == [r.usage.cached_tokens for r in want]
        assert peak <= 2  # two requests' rows at a time
        batch = [
            p + list(r.tokens) + prompts(40 + turn, 1, 30, vocab)[0]
            for p, r in zip(batch, got, strict=True)
        ]
    assert any(r.usage.cached_tokens for r in got)
    assert pool.capacity == plan.pool_rows and pool.growths == 0
    assert bound.worker.reserved_rows == 0


def test_kv_memory_and_max_running_tokens_exclude_each_other(model_dirs):
    with pytest.raises(ValueError, match=r"max_running_tokens \(10\) or kv_memory"):
        Engine(model_dirs["nemotron_h"], kv_memory=KVMemory(bytes=10**8), max_running_tokens=10)


def test_a_model_with_no_kv_plans_no_rows_and_serves_exactly(model_dirs):
    """A pure SSM (Mamba-2, no attention) keeps no KV: its plan has no row and only needs
    the cache and the running states to fit (a smaller budget is refused by its numbers);
    the planned engine serves a cached second turn as the unbounded one does."""
    plan = plan_kv_memory(100_000, 20_000, 0, 1_000, 4)
    assert (plan.max_running_tokens, plan.pool_rows, plan.kv_bytes_per_token) == (0, 0, 0)
    with pytest.raises(ValueError, match=r"budget of 30000 bytes cannot hold .* keeps no KV"):
        plan_kv_memory(30_000, 20_000, 0, 10_000, 4)
    model_dir = model_dirs["mamba2"]
    free = Engine(model_dir, "marconi", 2_000_000)
    assert free.store.kv_bytes_per_token == 0
    budget = 2_000_000 + STATES_PER_REQUEST * 8 * free.store.state_bytes
    bound = Engine(model_dir, "marconi", 2_000_000, kv_memory=KVMemory(bytes=budget))
    assert bound.kv_plan is not None and bound.worker.max_running_tokens is None
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    first = prompts(5, 2, 30, free.config.vocab_size)
    outs = [engine.generate_many(first, [sp, sp]) for engine in (free, bound)]
    assert [r.tokens for r in outs[0]] == [r.tokens for r in outs[1]]
    new = prompts(6, 1, 10, free.config.vocab_size)[0]
    second = [p + list(r.tokens) + new for p, r in zip(first, outs[0], strict=True)]
    got = bound.generate_many(second, [sp, sp])
    want = free.generate_many(second, [sp, sp])
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert [r.usage.cached_tokens for r in got] == [34, 34]  # each first turn's last state
