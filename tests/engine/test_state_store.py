"""State store: byte accounting equals the model spec's, and the store always holds
exactly what the prefix cache accounts for (invariant 1 on real tensors)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import GREEDY

from marconi_ray.core.cache.invariants import check_tree
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.store.state_store import StateStore

FAMILIES = (
    "nemotron_h",
    "bamba",
    "jamba",
    "qwen3_5_text",
    "qwen3_next",
    "falcon_h1",
    "zamba2",
    "lfm2",
    "lfm2_moe",
    "minimax",
    "bailing_hybrid",
    "xlstm",
)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_store_bytes_equal_model_spec(model_dirs, family, dtype):
    _, raw = read_config(model_dirs[family])
    model = load_model(model_dirs[family], dtype=dtype)
    store = StateStore(model)
    elem = torch.empty((), dtype=dtype).element_size()
    spec = spec_from_hf_config(raw, dtype_bytes=elem, state_dtype_bytes=4)
    assert store.kv_bytes_per_token == spec.kv_bytes_per_token
    assert store.state_bytes == spec.ssm_state_bytes
    # the tensors really stored have those sizes
    state = model.new_state()
    ckpt = model.prefill(torch.arange(7, 20), state, [13])[0]
    sid = store.put_state(ckpt)
    held = store._states[sid]
    real = sum(t.numel() * t.element_size() for t in (*held.conv.values(), *held.ssm.values()))
    assert real == spec.ssm_state_bytes
    slots = store.alloc_slots(13)
    store.write_kv(slots, state, 0)
    assert store.bytes_used == 13 * spec.kv_bytes_per_token + spec.ssm_state_bytes


def test_slots_are_reused_and_kv_round_trips(model_dirs):
    model = load_model(model_dirs["bamba"])
    store = StateStore(model, initial_slots=4)
    state = model.new_state()
    ckpt = model.prefill(torch.arange(7, 17), state, [10])[0]
    sid = store.put_state(ckpt)
    slots = store.alloc_slots(10)  # grows the pool past its 4 initial slots
    store.write_kv(slots, state, 0)
    loaded = store.load(slots, sid, 10)
    for i in model.attn_blocks:
        k, v = state.kv[i].view()
        lk, lv = loaded.kv[i].view()
        assert torch.equal(k, lk) and torch.equal(v, lv)
    store.free_slots(slots[:3])
    again = store.alloc_slots(3)
    assert sorted(again.tolist()) == sorted(slots[:3].tolist())
    with pytest.raises(ValueError, match="depth"):
        store.load(slots[:9], sid, 9)


def test_a_slot_freed_twice_is_refused_and_nothing_is_freed(model_dirs):
    """A second free of a KV slot would put it in the pool twice and hand it to two
    sequences: refused with the slot named, and the pool is unchanged (also for a slot
    listed twice, one never allocated, or one out of range)."""
    store = StateStore(load_model(model_dirs["bamba"]), initial_slots=4)
    slots = store.alloc_slots(6)  # past the initial 4: the pool grew
    store.free_slots(slots[:2])
    for bad in (slots[:3], np.asarray([slots[3], slots[3]]), np.asarray([7]), np.asarray([-1])):
        before = (store.live_slots, store.used_slots().tolist())
        with pytest.raises(ValueError, match="not held"):
            store.free_slots(bad)
        assert (store.live_slots, store.used_slots().tolist()) == before
    store.free_slots(slots[2:])
    assert store.live_slots == 0 and not len(store.used_slots())
    assert len(set(store.alloc_slots(8).tolist())) == 8


@pytest.mark.parametrize("system", ["marconi", "vllm+", "sglang+"])
def test_store_matches_cache_under_eviction(model_dirs, system):
    """A budget of a few requests forces evictions: after every request the store holds
    exactly the bytes the cache accounts for, never more than the capacity, every tree
    state id exists in the store, and outputs stay exact."""
    capacity = 400_000
    engine = Engine(model_dirs["nemotron_h"], system=system, cache_bytes=capacity)
    reference = Engine(model_dirs["nemotron_h"], system="vanilla")
    rng = np.random.default_rng(3)
    vocab = engine.config.vocab_size
    roots = [rng.integers(7, vocab, 30).tolist() for _ in range(3)]
    histories = {i: list(r) for i, r in enumerate(roots)}
    evicted_any = False
    for step in range(12):
        i = int(rng.integers(0, 3))
        histories[i] += rng.integers(7, vocab, int(rng.integers(3, 25))).tolist()
        got = engine.generate(histories[i], GREEDY)
        assert got.tokens == reference.generate(histories[i], GREEDY).tokens, step
        histories[i] += list(got.tokens)
        assert engine.store.bytes_used == engine.cache.bytes_used <= capacity
        assert engine.cache.open_plans == 0
        check_tree(engine.cache.tree)
        ids = {n.state for n in engine.cache.tree.iter_nodes() if n.state >= 0}
        assert ids == set(engine.store._states)
        evicted_any |= engine.cache.stats.evictions > 0
    assert evicted_any
