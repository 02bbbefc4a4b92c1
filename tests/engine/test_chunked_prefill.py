"""Chunked prefill: a prompt longer than `max_batch_tokens` is prefilled over several
steps interleaved with the running decodes; outputs, planned checkpoints and cache reuse
are exactly those of an unchunked prefill."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from engine_helpers import GREEDY, prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.protocol.orders import StepInput
from marconi_ray.protocol.sampling import SamplingParams

LONG = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("family", ["nemotron_h", "jamba"])
def test_chunked_outputs_and_reuse_equal_unchunked(model_dirs, family):
    chunked = Engine(model_dirs[family], "marconi", 50_000_000, max_batch_tokens=16)
    whole = Engine(model_dirs[family], "marconi", 50_000_000)
    vocab = chunked.config.vocab_size
    history = prompts(5, 1, 70, vocab)[0]
    for turn in range(3):
        got, want = chunked.generate(history, GREEDY), whole.generate(history, GREEDY)
        assert got.tokens == want.tokens
        assert got.usage.cached_tokens == want.usage.cached_tokens
        if turn:
            assert got.usage.cached_tokens > 0
        history += list(got.tokens) + prompts(20 + turn, 1, 37, vocab)[0]
    # the same states at the same depths, in both caches
    assert chunked.cache.stats.to_dict() == whole.cache.stats.to_dict()
    assert chunked.store.bytes_used == chunked.cache.bytes_used


def test_a_long_prefill_does_not_stall_running_decodes(model_dirs):
    engine = Engine(model_dirs["nemotron_h"], "marconi", 50_000_000, max_batch_tokens=16)
    worker = engine.worker
    vocab = engine.config.vocab_size
    short, long_ = prompts(7, 1, 10, vocab)[0], prompts(8, 1, 100, vocab)[0]
    engine.add_request(short, LONG)
    long_id = engine.add_request(long_, LONG)
    assert worker.num_running == 2 and long_id in worker.running_ids()
    steps_until_first = 0
    decoded_meanwhile = 0
    while True:
        events = worker.step()
        steps_until_first += 1
        decoded_meanwhile += sum(e.request_id != long_id for e in events)
        if any(e.request_id == long_id for e in events):
            break
    # 100 tokens at <= 15 a step (16 less the decode row): several steps, each decoding
    assert steps_until_first >= 100 // 16
    assert decoded_meanwhile == steps_until_first
    results = {}
    while worker.num_running:
        for r in engine.step():
            results[r.request_id] = r
    reference = Engine(model_dirs["nemotron_h"], "vanilla")
    assert list(results[long_id].tokens) == list(reference.generate(long_, LONG).tokens)


def test_cancel_while_prefilling_frees_everything(model_dirs):
    engine = Engine(model_dirs["nemotron_h"], "marconi", 50_000_000, max_batch_tokens=16)
    worker = engine.worker
    (p,) = prompts(9, 1, 80, engine.config.vocab_size)
    a = engine.add_request(p, LONG)
    worker.step()
    assert not worker.stop(a), "a prefilling request has nothing to stop: cancel it"
    assert worker.cancel(a) and not worker.cancel(a)
    worker.release(engine.planner.abort(a))
    assert engine.step() == []
    assert worker.num_running == 0 and engine.cache.open_plans == 0
    assert engine.cache.reserved == 0 and worker.store.bytes_used == engine.cache.bytes_used
    assert np.isfinite(engine.cache.stats.token_hit_rate)


def test_a_step_that_starts_requests_runs_no_chunk_of_its_own(model_dirs):
    """A step that starts a short request runs one prefill forward: the new request's
    tokens and, in its spare tokens, the long prompt's next chunk (a chunk mixes
    requests); the step runs no second, chunk-only forward, so the new request's first
    token waits for nothing but its own forward."""
    engine = Engine(model_dirs["nemotron_h"], "marconi", 50_000_000, max_batch_tokens=16)
    worker = engine.worker
    vocab = engine.config.vocab_size
    engine.add_request(prompts(11, 1, 100, vocab)[0], LONG)
    (long_seq,) = worker._prefilling
    worker.step()
    done_before = long_seq.prefilled
    order, release = engine.planner.order(
        99, np.asarray(prompts(12, 1, 8, vocab)[0], np.int32), LONG
    )
    forwards = _counted_prefills(worker.model)
    out = worker.advance(StepInput(release=release, start=(order,)))
    assert {e.request_id for e in out.events} == {99}, "the new request's tokens only"
    assert forwards == [2], "one forward: the new prompt and the long prompt's chunk"
    assert long_seq.prefilled == done_before + 16 - 8, "the forward's spare tokens"
    worker.advance(StepInput())
    assert long_seq.prefilled > done_before + 8


def _counted_prefills(model: Any) -> list[int]:
    """The parts of each `prefill_many` call from now on (the real method runs)."""
    calls: list[int] = []
    real = model.prefill_many

    def counted(parts: Any, pool: Any = None) -> Any:
        calls.append(len(parts))
        return real(parts, pool)

    model.prefill_many = counted
    return calls


def test_long_prompts_prefill_together_and_stay_exact(model_dirs):
    """Two long prompts in flight share each chunk forward when the older one's rest is
    shorter than the budget, and both outputs equal their runs alone."""
    family = "qwen3_5"
    vocab = 263
    long_a, long_b = prompts(21, 2, 70, vocab)
    alone = [
        Engine(model_dirs[family], "vanilla").generate(p, LONG).tokens for p in (long_a, long_b)
    ]
    engine = Engine(model_dirs[family], "vanilla", max_batch_tokens=32)
    forwards = _counted_prefills(engine.worker.model)
    got = engine.generate_many([long_a, long_b], [LONG, LONG])
    assert [r.tokens for r in got] == alone
    assert max(forwards) == 2, forwards  # a forward held both prompts' chunks
