"""The orders one step starts are prefilled several to a forward (`Worker` over
`HybridModel.prefill_many`) and their first tokens sampled in one call: the tokens,
checkpoints and hits are those of starting them one by one; a long prompt still goes
chunk by chunk beside them; an order that fails (a hit the store does not hold) fails
alone, freeing what it stored."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import prompts

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import PrefillOrder, StepInput
from marconi_ray.protocol.sampling import SamplingParams

SP = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True, logprobs=0)


def _order(rid: int, ids: list[int], hit=None, sp: SamplingParams = SP) -> PrefillOrder:
    prompt = np.asarray(ids, np.int32)
    depth = (len(ids) // 2, len(ids))
    if hit is None:
        return PrefillOrder(rid, prompt, sp, sp.max_tokens, checkpoints=depth)
    sid, slots = hit
    return PrefillOrder(
        rid, prompt, sp, sp.max_tokens, len(slots), sid, np.asarray(slots, np.int64),
        checkpoints=depth[1:],
    )  # fmt: skip


def _run(worker: Worker, orders: list[PrefillOrder]) -> tuple[dict, dict, list]:
    """Start `orders` in one step and run them out: tokens, Finished and failures."""
    tokens: dict[int, list[int]] = {o.request_id: [] for o in orders}
    done, failed = {}, []
    out = worker.advance(StepInput(start=tuple(orders)))
    while True:
        failed += list(out.failed)
        for e in out.events:
            tokens[e.request_id].append(e.token)
        done.update({f.request_id: f for f in out.finished})
        if not worker.num_running:
            return tokens, done, failed
        out = worker.advance(StepInput())


@pytest.fixture(scope="module")
def model(model_dirs):
    return load_model(model_dirs["nemotron_h"])


def test_a_step_of_starts_is_one_forward_with_the_tokens_of_one_by_one(model):
    vocab = model.cfg.vocab_size
    batch = [p for n in (9, 14, 21, 30, 12, 17) for p in prompts(n, 1, n, vocab)]
    together = Worker(model, max_batch=8, max_batch_tokens=512)
    calls = []
    many = model.prefill_many

    def counted(parts, pool=None):
        calls.append(len(parts))
        return many(parts, pool)

    model.prefill_many = counted
    try:
        tokens, done, failed = _run(together, [_order(r, p) for r, p in enumerate(batch)])
    finally:
        del model.prefill_many
    assert calls[0] == 6 and not failed  # the six prompts: one forward
    alone = Worker(model, max_batch=8, max_batch_tokens=512)
    for r, p in enumerate(batch):
        want, want_done, _ = _run(alone, [_order(r, p)])
        assert tokens[r] == want[r]
        assert sorted(done[r].state_ids) == sorted(want_done[r].state_ids) == [len(p) // 2, len(p)]
    # a small budget packs fewer per forward: 9 + 14 + 21 = 44 <= 48, then 30 + 12, 17
    packed = Worker(model, max_batch=8, max_batch_tokens=48)
    calls.clear()
    model.prefill_many = counted
    try:
        tokens_packed, _, _ = _run(packed, [_order(r, p) for r, p in enumerate(batch)])
    finally:
        del model.prefill_many
    assert calls[:3] == [3, 2, 1] and tokens_packed == tokens


def test_hits_long_prompts_and_a_failure_in_one_step(model):
    vocab = model.cfg.vocab_size
    worker = Worker(model, max_batch=8, max_batch_tokens=40)
    base = prompts(3, 1, 24, vocab)[0]
    _, first, _ = _run(worker, [_order(0, base)])
    f = first[0]
    hit = (f.state_ids[24], f.kv_slots[:24])
    follow = base + prompts(4, 1, 10, vocab)[0]
    long_ = prompts(5, 1, 90, vocab)[0]  # over the budget: chunk by chunk
    short = prompts(6, 1, 12, vocab)[0]
    bogus = (f.state_ids[24], np.arange(10_000, 10_024))  # slots the store does not hold
    orders = [_order(1, follow, hit), _order(2, long_), _order(3, short), _order(4, follow, bogus)]
    used = worker.store.used_slots().size
    tokens, done, failed = _run(worker, orders)
    assert [rid for rid, _ in failed] == [4] and "not held" in failed[0][1]
    assert set(done) == {1, 2, 3}
    fresh = Worker(model, max_batch=8)
    for rid, ids in ((1, follow), (2, long_), (3, short)):
        want, _, _ = _run(fresh, [_order(rid, ids)])
        assert tokens[rid] == want[rid], rid
    for d in done.values():
        worker.release(d.stored())
    assert worker.store.used_slots().size == used and worker.reserved_rows == 0
    worker.store.check()
