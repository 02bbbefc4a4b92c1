"""The tensor-side `Worker`: continuous batching (a new request joins the running batch at
the next step), early stop, and cancel freeing everything."""

from __future__ import annotations

import numpy as np
from engine_helpers import prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.protocol.sampling import SamplingParams

LONG = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


def _engine(model_dirs) -> Engine:
    return Engine(model_dirs["nemotron_h"], system="marconi", cache_bytes=50_000_000, max_batch=4)


def _order(engine: Engine, rid: int, prompt: list[int]):
    order, release = engine.planner.order(rid, np.asarray(prompt, np.int32), LONG)
    engine.worker.release(release)
    return order


def test_new_request_joins_the_running_batch(model_dirs):
    engine = _engine(model_dirs)
    worker = engine.worker
    a, b = prompts(31, 2, 20, engine.config.vocab_size)
    worker.start(_order(engine, 0, a))
    first = worker.step()
    assert [e.request_id for e in first] == [0]
    worker.start(_order(engine, 1, b))
    joined = worker.step()
    assert sorted(e.request_id for e in joined) == [0, 1]
    while worker.num_running:
        worker.step()
    done = {d.request_id: d for d in worker.take_finished()}
    reference = Engine(model_dirs["nemotron_h"], system="vanilla")
    assert list(done[0].tokens) == list(reference.generate(a, LONG).tokens)
    assert list(done[1].tokens) == list(reference.generate(b, LONG).tokens)
    for d in done.values():
        worker.release(engine.planner.commit(d))
    assert worker.store.bytes_used == engine.cache.bytes_used


def test_stop_finishes_early_and_is_committed(model_dirs):
    engine = _engine(model_dirs)
    worker = engine.worker
    (p,) = prompts(32, 1, 20, engine.config.vocab_size)
    worker.start(_order(engine, 0, p))
    worker.step()
    assert worker.stop(0)
    while worker.num_running:
        worker.step()
    (done,) = worker.take_finished()
    assert done.finish_reason == "stop" and len(done.tokens) == 2
    worker.release(engine.planner.commit(done))
    assert engine.cache.lookup(np.asarray(p + list(done.tokens), np.int32)) == len(p) + 2
    assert worker.store.bytes_used == engine.cache.bytes_used


def test_cancel_frees_the_request(model_dirs):
    engine = _engine(model_dirs)
    worker = engine.worker
    (p,) = prompts(33, 1, 20, engine.config.vocab_size)
    before = worker.store.bytes_used
    worker.start(_order(engine, 0, p))
    worker.step()
    assert worker.cancel(0) and not worker.cancel(0)
    worker.release(engine.planner.abort(0))
    assert worker.num_running == 0 and worker.store.bytes_used == before
    assert engine.cache.open_plans == 0 and engine.cache.reserved == 0


def test_cancel_frees_a_request_whose_finished_output_was_lost(model_dirs):
    """tp > 1: rank 0 finished a request in a step another rank failed, so the replica
    never got its `Finished` (states and KV it stored). The replica cancels it: that frees
    them (until the next `advance`, after which the replica has the step's output)."""
    from marconi_ray.protocol.orders import StepInput

    engine = _engine(model_dirs)
    worker = engine.worker
    (p,) = prompts(34, 1, 20, engine.config.vocab_size)
    before = worker.store.bytes_used
    worker.advance(StepInput(start=(_order(engine, 0, p),)))
    finished: list = []
    while not finished:
        finished = list(worker.advance(StepInput()).finished)
    assert finished[0].state_ids and worker.store.bytes_used > before
    # the output is lost with the failed step: the replica aborts and cancels the request
    assert worker.cancel(0) and not worker.cancel(0)
    worker.release(engine.planner.abort(0))
    assert worker.store.bytes_used == before and worker.store.live_states == 0
