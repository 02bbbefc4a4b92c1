"""One KV pool for running and cached tokens: a hit is read in place (its rows are the
cached slots' rows, nothing is copied), a request's tokens get slots as they are
computed and the ones the cache keeps are handed over as they are; a host-tier hit is
staged into slots of the request's own and freed with it; the running requests' rows
are bounded by `max_running_tokens` (a burst of long prompts waits its turn and ends
exactly as an unbounded run); nothing is freed twice."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import prompts

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import Move, PrefillOrder, Release, StepInput
from marconi_ray.protocol.sampling import SamplingParams

PROMPT = 24
NEW = 5


def _order(rid: int, ids: list[int], n: int = NEW, hit=None, capture=()) -> PrefillOrder:
    sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    prompt = np.asarray(ids, np.int32)
    if hit is None:
        return PrefillOrder(rid, prompt, sp, n, checkpoints=(len(ids),), capture=tuple(capture))
    sid, slots = hit
    return PrefillOrder(
        rid, prompt, sp, n, len(slots), sid, np.asarray(slots, np.int64),
        checkpoints=(len(ids),), capture=tuple(capture),
    )  # fmt: skip


def _run(worker: Worker, orders: list[PrefillOrder], watch=None, keep: bool = True) -> dict:
    """Advance until every order is done; {request id: (tokens, Finished)}. Without
    `keep`, whatever a finished request stored is freed (nothing is cached)."""
    done, tokens = {}, {o.request_id: [] for o in orders}
    out = worker.advance(StepInput(start=tuple(orders)))
    while True:
        assert not out.failed, out.failed
        for e in out.events:
            tokens[e.request_id].append(e.token)
        for f in out.finished:
            done[f.request_id] = (tokens[f.request_id], f)
            if not keep:
                worker.release(f.stored())
        if watch is not None:
            watch(worker)
        if not worker.num_running and len(done) == len(orders):
            return done
        out = worker.advance(StepInput())


@pytest.fixture(scope="module")
def model(model_dirs):
    return load_model(model_dirs["nemotron_h"])


def test_a_hit_is_read_in_place_and_kept_slots_are_handed_over(model):
    """The first request's kept slots become the second's hit; the second reads their
    rows in place (its decode table starts with them) and gets the same tokens as an
    uncached run; the pool grows by the new tokens only."""
    ids = prompts(3, 1, PROMPT, model.cfg.vocab_size)[0]
    worker = Worker(model)
    first = _run(worker, [_order(1, ids[:16])])[1][1]
    assert len(first.kv_slots) == 16 and set(first.state_ids) == {16}
    store = worker.store
    assert sorted(store.used_slots().tolist()) == sorted(first.kv_slots.tolist())
    hit = (first.state_ids[16], first.kv_slots)
    seen = {}

    def watch(w: Worker) -> None:
        if w._batch.members and "rows" not in seen:
            seen["rows"] = w._batch.table[0, :16].tolist()

    got = _run(worker, [_order(2, ids, hit=hit)], watch)[2]
    assert seen["rows"] == store.device_rows(first.kv_slots).tolist(), "rows read in place"
    want = _run(Worker(model), [_order(3, ids)])[3][0]
    assert got[0] == want
    assert len(got[1].kv_slots) == PROMPT - 16  # its own, after the hit
    assert not np.isin(got[1].kv_slots, first.kv_slots).any()
    store.check()


def test_a_host_tier_hit_is_staged_into_the_requests_own_slots(model):
    ids = prompts(4, 1, PROMPT, model.cfg.vocab_size)[0]
    worker = Worker(model)
    first = _run(worker, [_order(1, ids[:16])])[1][1]
    sid, slots = first.state_ids[16], first.kv_slots
    worker.release(Release(moves=(Move(True, (sid,), slots),)))
    for t in worker.store.device_kv.tensors():
        t.zero_()  # the rows left behind must not be read
    held = worker.store.device_slots
    got = _run(worker, [_order(2, ids, hit=(sid, slots))])[2]
    assert got[0] == _run(Worker(model), [_order(3, ids)])[3][0]
    assert worker.store.host_slot_ids().tolist() == sorted(slots.tolist())
    # the staged copies are freed; what is left on the device is the new request's own
    assert worker.store.device_slots == held + len(got[1].kv_slots)
    worker.store.check()


def test_running_rows_are_excluded_from_holdings(model):
    ids = prompts(5, 1, PROMPT, model.cfg.vocab_size)[0]
    worker = Worker(model)
    worker.advance(StepInput(start=(_order(1, ids, n=50),)))  # prefill, then one decode
    states, slots = worker.holdings()
    assert worker.store.device_slots == PROMPT + 1 and len(slots) == 0 and states == []
    worker.advance(StepInput())
    assert worker.store.device_slots == PROMPT + 2 and len(worker.holdings()[1]) == 0
    assert worker.cancel(1) and not worker.cancel(1), "a second cancel frees nothing"
    assert worker.store.device_slots == 0 and worker.reserved_rows == 0
    worker.store.check()


def test_a_burst_beyond_max_running_tokens_waits_and_ends_exactly(model):
    """Six long prompts, rows for two at a time: the rest wait in order, the running
    requests' rows never exceed the bound, and every output equals an unbounded run's."""
    vocab = model.cfg.vocab_size
    burst = [_order(r, prompts(10 + r, 1, 40, vocab)[0], n=6) for r in range(6)]
    need = 40 + 6
    bound = Worker(model, max_batch=8, max_running_tokens=2 * need + 3)
    assert bound.rows_needed(burst[0]) == need
    peak = {"running": 0, "rows": 0}

    def watch(w: Worker) -> None:
        assert w.reserved_rows <= w.max_running_tokens
        running = [*w._running, *w._prefilling]
        peak["running"] = max(peak["running"], len(running))
        peak["rows"] = max(peak["rows"], w.store.device_slots)
        assert w.store.device_slots == sum(len(s.own) for s in running)

    got = _run(bound, burst, watch, keep=False)
    want = _run(
        Worker(model, max_batch=8),
        [_order(r + 10, o.prompt.tolist(), n=6) for r, o in enumerate(burst)],
    )
    assert [got[r][0] for r in range(6)] == [want[r + 10][0] for r in range(6)]
    assert peak["running"] == 2 and peak["rows"] <= bound.max_running_tokens
    assert bound.reserved_rows == 0 and bound.store.device_slots == 0
    bound.store.check()


def test_an_order_larger_than_the_bound_fails_naming_it_and_changes_nothing(model):
    worker = Worker(model, max_running_tokens=30)
    ids = prompts(6, 1, PROMPT, model.cfg.vocab_size)[0]
    out = worker.advance(StepInput(start=(_order(1, ids, n=10),)))
    ((rid, why),) = out.failed
    assert rid == 1 and "needs 34 KV rows" in why and "max_running_tokens=30" in why
    assert worker.num_running == 0 and worker.store.device_slots == 0
    with pytest.raises(ValueError, match="max_running_tokens"):
        Worker(model, max_running_tokens=0)


def test_decode_step_is_one_attention_call_per_layer(model):
    """The pooled decode batch runs the kernel set's paged attention once per attention
    block per step, whatever the batch size."""
    calls = []
    attend = model.kernels.paged_decode_attention
    worker = Worker(model, max_batch=4)
    ids = prompts(7, 4, PROMPT, model.cfg.vocab_size)
    worker.advance(StepInput(start=tuple(_order(r, p, n=20) for r, p in enumerate(ids))))
    worker.advance(StepInput())
    batch = worker._batch
    real = batch.decode_kv

    def counted(i, kernel):
        calls.append(i)
        return real(i, kernel)

    batch.decode_kv = counted
    try:
        worker.advance(StepInput())
    finally:
        del batch.decode_kv
    assert sorted(calls) == sorted(model.attn_blocks) and len(batch) == 4
    assert attend is model.kernels.paged_decode_attention
    batch.check()
    assert torch.equal(batch.lens[:4], torch.tensor([s.state.length for s in worker._running]))


def test_engine_generate_many_waits_for_rows_and_equals_an_unbounded_engine(model_dirs):
    from marconi_ray.engine.engine import Engine

    vocab = load_model(model_dirs["nemotron_h"]).cfg.vocab_size
    batch = prompts(21, 4, 30, vocab)
    sp = [SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)] * 4
    bound = Engine(model_dirs["nemotron_h"], "vanilla", max_running_tokens=70)
    got = bound.generate_many(batch, sp)
    want = Engine(model_dirs["nemotron_h"], "vanilla").generate_many(batch, sp)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert bound.worker.reserved_rows == 0 and bound.store.device_slots == 0
    with pytest.raises(ValueError, match="max_running_tokens=70"):
        bound.add_request(prompts(22, 1, 80, vocab)[0], sp[0])
    assert bound.num_running == 0 and bound.planner.open_requests == 0
