"""Sliding-window blocks' KV held with the states (RecurrentGemma: every attention block a
sliding window of W, no per-token KV cached; LFM3: windowed blocks beside full ones, whose
KV stays per token): each checkpoint holds its window (the KV of its last W positions)
beside its recurrent states, and a running sequence holds only its window's rows.
Resuming from a window is exact at depths around W; running rows stay within the window
however long a sequence grows and are freed exactly once; the planned memory sets them
aside."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import prompts

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.kv_memory import planned_store
from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.paged_kv import SplitPools
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.engine.window_rows import WindowRows
from marconi_ray.protocol.kv_memory import KVMemory
from marconi_ray.protocol.sampling import SamplingParams

FAMILY = "recurrent_gemma"
WINDOWED = ("recurrent_gemma", "lfm3")
W = 16
"""Both tiny presets' window."""
DEPTHS = (1, W - 1, W, W + 1, 2 * W + 1, 47, 101)
NEW = 3
PARAMS = SamplingParams(max_tokens=NEW, temperature=0.0, ignore_eos=True)


def _reference(model, ids: list[int], n: int) -> list[int]:
    """Greedy tokens of the model's own unpooled path (every KV row kept)."""
    state = model.new_state()
    model.prefill(torch.tensor(ids), state)
    return model.greedy(state, n)


def test_the_model_is_window_state_and_its_cache_keeps_no_token_kv(model_dirs):
    model = load_model(model_dirs[FAMILY])
    assert model.window_state == W
    store = StateStore(model)
    assert store.kv_bytes_per_token == 0 and store.window_row_bytes > 0
    pools = store.pools
    assert isinstance(pools, SplitPools) and pools.window is store.window_kv
    assert pools.blocks == frozenset(model.attn_blocks)  # every attention block windowed
    lfm3 = load_model(model_dirs["lfm3"])
    split = StateStore(lfm3)
    full = [i for i in lfm3.attn_blocks if i not in lfm3.window_blocks]
    assert lfm3.window_state == W and lfm3.window_blocks and full
    assert set(split.device_kv.shapes) == set(full)
    assert split.window_kv is not None and set(split.window_kv.shapes) == set(lfm3.window_blocks)


@pytest.mark.parametrize("family", WINDOWED)
def test_resume_from_the_window_alone_equals_uncached(model_dirs, family):
    """A checkpoint stored with its window (the last min(depth, W) positions' KV, padded
    to W) and loaded back resumes with those KV rows only (and the full blocks' whole
    KV): the rest of the prompt and 8 greedy tokens give the uncached run's logits and
    tokens."""
    model = load_model(model_dirs[family])
    store = StateStore(model)
    ids = prompts(51, 1, 140, model.cfg.vocab_size)[0]
    state = model.new_state()
    ckpts = model.prefill(torch.tensor(ids), state, list(DEPTHS))
    want_logits = state.logits.clone()
    want = _reference(model, ids, 8)
    for ck in ckpts:
        sid = store.put_state(ck.with_window_of(state, W))
        resumed = store.load_state(sid, ck.depth)
        for i in model.window_blocks:
            assert resumed.kv[i].length == min(ck.depth, W), ck.depth
        for i in set(model.attn_blocks) - set(model.window_blocks):
            k, v = state.kv[i].view()
            resumed.kv[i] = KVBuffer(k[:, : ck.depth].clone(), v[:, : ck.depth].clone())
        model.prefill(torch.tensor(ids[ck.depth :]), resumed)
        assert (resumed.logits - want_logits).abs().max().item() <= 1e-4, ck.depth
        assert model.greedy(resumed, 8) == want, ck.depth


def test_a_checkpoint_without_its_window_is_refused(model_dirs):
    model = load_model(model_dirs[FAMILY])
    store = StateStore(model)
    state = model.new_state()
    (ck,) = model.prefill(torch.arange(3, 30), state, [W + 2])
    with pytest.raises(ValueError, match="needs its window"):
        store.put_state(ck)
    short = ck.with_window_of(state, W - 1)
    with pytest.raises(ValueError, match=f"has {W} positions"):
        store.put_state(short)
    assert store.live_states == 0 and store.bytes_used == 0


@pytest.mark.parametrize("family", WINDOWED)
@pytest.mark.parametrize("first_len", [W - 1 - NEW, W - NEW, W + 1 - NEW, 2])
def test_hits_at_depths_around_the_window_are_exact(model_dirs, family, first_len):
    """A second turn resumes from the first turn's final state at depth W - 1, W, W + 1
    (and 5): its cached tokens are that depth, its tokens the unpooled model's."""
    engine = Engine(model_dirs[family], system="marconi", cache_bytes=10**7)
    vocab = engine.config.vocab_size
    first = prompts(52, 1, first_len, vocab)[0]
    out = engine.generate(first, PARAMS)
    second = first + list(out.tokens) + prompts(53, 1, 9, vocab)[0]
    again = engine.generate(second, PARAMS)
    assert again.usage.cached_tokens == first_len + NEW
    assert list(again.tokens) == _reference(engine.model, second, NEW)
    assert engine.store.window_rows_held == 0
    assert engine.store.bytes_used == engine.cache.bytes_used


@pytest.mark.parametrize("family", WINDOWED)
def test_running_rows_stay_within_the_window(model_dirs, family):
    """Two long requests, one prefilled in chunks, decoding 40 tokens past their
    prompts: between steps each holds at most W + 1 window rows, and a step adds at most
    its `max_batch_tokens`; their tokens are the unpooled model's, and when they end
    no window row is held."""
    chunk = 24
    engine = Engine(model_dirs[family], system="marconi", cache_bytes=10**7, max_batch_tokens=chunk)
    worker, store = engine.worker, engine.store
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    a, b = prompts(54, 2, 90, engine.config.vocab_size)
    for rid, p in enumerate((a, b)):
        order, release = engine.planner.order(rid, np.asarray(p, np.int32), params)
        worker.release(release)
        worker.start(order)
        assert store.window_rows_held <= 2 * (W + 1) + chunk
    peak = 0
    while worker.num_running:
        worker.step()
        peak = max(peak, store.window_rows_held)
        assert store.window_rows_held <= 2 * (W + 1) + chunk
        store.check()
    assert peak > W
    done = {d.request_id: d for d in worker.take_finished()}
    assert store.window_rows_held == 0
    for rid, p in enumerate((a, b)):
        assert list(done[rid].tokens) == _reference(engine.model, p, 40)
        worker.release(engine.planner.commit(done[rid]))
    assert store.bytes_used == engine.cache.bytes_used


def test_window_rows_are_freed_exactly_once(model_dirs):
    """A cancelled request gives back every window row it held; a second free of any of
    them is refused and changes nothing."""
    engine = Engine(model_dirs[FAMILY], system="marconi", cache_bytes=10**7)
    worker, store = engine.worker, engine.store
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    (p,) = prompts(55, 1, 50, engine.config.vocab_size)
    order, release = engine.planner.order(0, np.asarray(p, np.int32), params)
    worker.release(release)
    worker.start(order)
    for _ in range(5):
        worker.step()
    (seq,) = worker._running
    held = np.asarray(seq.window.rows, dtype=np.int64)
    assert len(held) == W + 1 and store.window_rows_held == W + 1
    assert worker.cancel(0)
    assert store.window_rows_held == 0 and not seq.window.rows
    store.check()
    other = store.alloc_window(3)
    with pytest.raises(ValueError, match="not held"):
        store.free_window(np.concatenate([other, held[:1]]))
    with pytest.raises(ValueError, match="not held"):
        store.free_window(np.concatenate([other, other[:1]]))
    assert store.window_rows_held == 3
    store.free_window(other)
    assert store.window_rows_held == 0


def test_a_planned_pool_sets_the_window_rows_aside(model_dirs):
    model = load_model(model_dirs[FAMILY])
    probe = StateStore(model)
    cache = 10 * probe.state_bytes
    store, plan = planned_store(model, KVMemory(bytes=10**7), cache, 4, 64)
    assert plan.window_rows == 4 * (W + 1) + 64 and plan.pool_rows == 0
    assert store.window_kv is not None and store.window_kv.sized
    assert store.window_kv.capacity >= plan.window_rows
    need = cache + 3 * 4 * probe.state_bytes + plan.window_rows * probe.window_row_bytes
    assert plan.running_states == need - cache
    with pytest.raises(ValueError, match="window rows"):
        planned_store(model, KVMemory(bytes=need - 1), cache, 4, 64)


def test_window_rows_slide_cut_and_give_each_row_back_once():
    """`WindowRows` holds positions [start, end): `slide` gives back what the window
    left, `cut` what speculation rejected, `at` a checkpoint's rows, `take_all` the rest;
    no row comes back twice."""
    held = WindowRows()
    held.add(np.arange(100, 110), 30)  # positions 30..39
    assert held.at(39, 4).tolist() == [105, 106, 107, 108]
    assert held.slide(38, 4).tolist() == [100, 101, 102, 103]  # keep 34..37 and 38, 39
    assert (held.start, held.end) == (34, 40)
    with pytest.raises(ValueError, match="next is 40"):
        held.add(np.arange(5), 41)
    held.add(np.arange(200, 203), 40)
    assert held.cut(41).tolist() == [201, 202]  # drafts at 41, 42 rejected
    assert held.slide(41, 4).tolist() == [104, 105, 106]  # keep 37..40
    out = held.take_all().tolist()
    assert out == [107, 108, 109, 200] and held.take_all().tolist() == []
    with pytest.raises(AssertionError):
        held.at(41, 4)
