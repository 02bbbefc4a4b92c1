"""The store's host tier: KV slots and states moved to host memory and back by a
`Release`'s moves keep their ids and resume exactly, in every family; bad moves change
nothing; bytes are accounted per tier; the pools' row bookkeeping (device rows pending a
copy, host rows in segments) holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from engine_helpers import prompts

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.seq_state import SeqState
from marconi_ray.engine.presets.model_presets import FAMILIES
from marconi_ray.engine.store.device_pool import DeviceKVPool
from marconi_ray.engine.store.host_pool import HostKVPool
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import Move, PrefillOrder, Release, StepInput
from marconi_ray.protocol.sampling import SamplingParams

HIT = 7
PROMPT = 10
NEW = 3


def _to_host(states=(), slots=()) -> Release:
    return Release(moves=(Move(True, tuple(states), np.asarray(slots, dtype=np.int64)),))


def _to_device(states=(), slots=()) -> Release:
    return Release(moves=(Move(False, tuple(states), np.asarray(slots, dtype=np.int64)),))


def _cached(model, ids: list[int]) -> tuple[Worker, int, np.ndarray, SeqState]:
    """A worker whose store holds the state and KV of `ids[:HIT]` (device tier), the
    state's id, the slots and the prefilled state."""
    worker = Worker(model)
    state = model.new_state()
    (ckpt,) = model.prefill(torch.tensor(ids[:HIT]), state, [HIT])
    if worker.store.window is not None:  # a window-state model's checkpoint holds its window
        ckpt = ckpt.with_window_of(state, worker.store.window)
    sid = worker.store.put_state(ckpt)
    slots = worker.store.alloc_slots(HIT)
    worker.store.write_kv(slots, state, 0)
    return worker, sid, slots, state


def _resume(model, store: StateStore, sid: int, slots: np.ndarray, ids: list[int], ref) -> list:
    """Greedy tokens resumed from the stored hit, whose KV must be `ref`'s."""
    state = store.load(slots, sid, HIT)
    for i, buf in ref.kv.items():
        k, v = buf.view()
        assert torch.equal(state.kv[i].k, k[:, :HIT]) and torch.equal(state.kv[i].v, v[:, :HIT])
    model.prefill(torch.tensor(ids[HIT:]), state)
    return model.greedy(state, NEW)


@pytest.mark.parametrize("family", FAMILIES)
def test_resume_from_host_mixed_and_promoted_tiers(model_dirs, family):
    """The hit's state and KV demoted to the host, then half its slots and the state
    promoted back, then everything: each time the resumed greedy tokens equal those of an
    uncached run, and the store's invariant holds."""
    model = load_model(model_dirs[family])
    ids = prompts(5, 1, PROMPT, model.cfg.vocab_size)[0]
    uncached = model.new_state()
    model.prefill(torch.tensor(ids), uncached)
    want = model.greedy(uncached, NEW)
    worker, sid, slots, written = _cached(model, ids)
    store = worker.store
    worker.release(_to_host([sid], slots))
    assert store.host_state_ids() == [sid] and store.host_slot_ids().tolist() == sorted(slots)
    assert store.bytes_used == 0
    store.check()
    for t in store.device_kv.tensors():
        t.zero_()  # the rows left behind: the hit must be read from the host
    assert _resume(model, store, sid, slots, ids, written) == want
    worker.release(_to_device([sid], slots[::2]))  # state and every other slot back
    assert store.host_state_ids() == [] and store.host_slots == len(slots[1::2])
    store.check()
    assert _resume(model, store, sid, slots, ids, written) == want
    worker.release(_to_host([sid]) + _to_device(slots=slots[1::2]))
    assert store.host_state_ids() == [sid] and store.host_slots == 0
    store.check()
    assert _resume(model, store, sid, slots, ids, written) == want
    worker.release(_to_device([sid]))
    assert store.bytes_used == HIT * store.kv_bytes_per_token + store.state_bytes
    assert store.host_bytes_used == 0
    store.check()
    for seg in store.host_kv.segments:
        seg.zero_()  # the rows left behind: the hit must be read from the device
    assert _resume(model, store, sid, slots, ids, written) == want


@pytest.fixture
def bamba(model_dirs):
    model = load_model(model_dirs["bamba"])
    ids = prompts(6, 1, PROMPT, model.cfg.vocab_size)[0]
    return (model, *_cached(model, ids)[:3])


def _snapshot(store: StateStore) -> tuple:
    return (
        store.used_slots().tolist(),
        store.host_slot_ids().tolist(),
        store.state_ids(),
        store.host_state_ids(),
        store.bytes_used,
        store.host_bytes_used,
    )


def test_bad_moves_are_refused_naming_ids_and_nothing_moves(bamba):
    _, worker, sid, slots = bamba
    store = worker.store
    worker.release(_to_host([sid], slots[:3]))
    bad = [
        ([Move(True, (), np.asarray([99]))], r"move 0 to the host: KV slots \[99\] are not held"),
        ([Move(True, (), slots[:1])], rf"KV slots \[{slots[0]}\] are already on the host"),
        ([Move(False, (), slots[3:4])], rf"KV slots \[{slots[3]}\] are already on the device"),
        ([Move(True, (), slots[[3, 3]])], rf"KV slots \[{slots[3]}\] are not held"),
        ([Move(True, (sid,))], rf"states \[{sid}\] are already on the host"),
        ([Move(False, (sid + 5,))], rf"states \[{sid + 5}\] are not held"),
        ([Move(False, (sid, sid))], rf"states \[{sid}\] are not held \(or listed twice\)"),
        # the first move alone is fine: validated as a whole, nothing moves
        ([Move(True, (), slots[3:5]), Move(True, (), slots[4:6])], "move 1 to the host"),
    ]
    for moves, match in bad:
        before = _snapshot(store)
        with pytest.raises(ValueError, match=match):
            worker.release(Release(moves=tuple(moves)))
        assert _snapshot(store) == before
        store.check()
    # a slot there and back within one release is fine: each move sees the earlier ones
    worker.release(Release(moves=(Move(True, (), slots[3:5]), Move(False, (), slots[3:5]))))
    assert store.host_slot_ids().tolist() == sorted(slots[:3].tolist())
    store.check()


def test_rows_a_running_request_reads_are_freed_after_it_and_never_demoted(bamba):
    """Issue 54 at the store: a free of a read row waits for its last reader (then it
    happens once), a second free of it is refused, and a move of it to the host is
    refused with nothing moved."""
    _, worker, _, slots = bamba
    store = worker.store
    read = slots[:4]
    store.pin_reads(read)
    store.pin_reads(read[:2])  # a second request reads two of them
    with pytest.raises(ValueError, match="read by running requests"):
        worker.release(Release(moves=(Move(True, (), read[1:3]),)))
    store.free_slots(read)  # the cache lets go of them: nothing freed yet
    assert set(store.used_slots().tolist()) >= set(read.tolist())
    assert store.released_slots().tolist() == sorted(read.tolist())
    with pytest.raises(ValueError, match="not held"):
        store.free_slots(read[3:])  # freed twice
    store.check()
    store.unpin_reads(read)  # the first reader ends: the rows only it read are freed
    assert store.released_slots().tolist() == sorted(read[:2].tolist())
    assert not set(store.used_slots().tolist()) & set(read[2:].tolist())
    store.unpin_reads(read[:2])
    assert len(store.released_slots()) == 0
    assert not set(store.used_slots().tolist()) & set(read.tolist())
    store.check()


def test_double_free_across_tiers_is_refused(bamba):
    _, worker, sid, slots = bamba
    store = worker.store
    worker.release(_to_host([sid], slots[:3]))
    worker.release(Release(slots=slots[:1]))  # a host slot
    worker.release(Release(slots=slots[5:6]))  # a device slot
    for twice in (slots[:1], slots[5:6], slots[[1, 1]], np.asarray([slots[4], slots[0]])):
        before = _snapshot(store)
        with pytest.raises(ValueError, match="not held"):
            store.free_slots(twice)
        assert _snapshot(store) == before
        store.check()
    store.free_state(sid)  # a host state
    with pytest.raises(KeyError):
        store.free_state(sid)
    store.check()


def test_bytes_per_tier_after_moves_and_frees(bamba):
    _, worker, sid, slots = bamba
    store = worker.store
    kv, st = store.kv_bytes_per_token, store.state_bytes
    logits = store.logits_bytes
    assert (store.bytes_used, store.host_bytes_used) == (HIT * kv + st, 0)
    worker.release(_to_host([sid], slots[:4]))
    assert (store.bytes_used, store.host_bytes_used) == (3 * kv, 4 * kv + st)
    assert store.logits_bytes == 0
    stats = store.tier_stats()
    assert stats["host_bytes"] == 4 * kv + st
    assert (stats["host_slots"], stats["host_states"]) == (4, 1)
    assert stats["bytes_to_host"] == 4 * kv + st + logits  # the logits travel too
    assert (stats["moves_to_host"], stats["moves_to_device"]) == (1, 0)
    worker.release(_to_device(slots=slots[:1]))
    worker.release(Release(slots=slots[1:2]))  # a host slot
    worker.release(Release(slots=slots[5:]))  # device slots
    assert (store.bytes_used, store.host_bytes_used) == (2 * kv, 2 * kv + st)
    stats = store.tier_stats()
    assert stats["bytes_to_device"] == kv
    assert stats["moves_to_device"] == 1 and stats["seconds_to_host"] > 0
    worker.release(Release(states=(sid,), slots=np.concatenate([slots[:1], slots[2:5]])))
    assert (store.bytes_used, store.host_bytes_used, store.live_slots) == (0, 0, 0)
    store.check()


def test_a_release_moves_then_frees_the_same_ids(bamba):
    """Moves come first, then frees: an id demoted and freed in one release is gone from
    both tiers, and its rows are reused."""
    _, worker, sid, slots = bamba
    store = worker.store
    worker.release(Release(states=(sid,), slots=slots, moves=_to_host([sid], slots).moves))
    assert store.live_slots == store.live_states == store.host_slots == 0
    assert store.tier_stats()["moves_to_host"] == 1
    store.check()
    again = store.alloc_slots(HIT)
    assert sorted(again.tolist()) == sorted(slots.tolist())
    store.check()


class _Event:
    """A copy event that completes when told to (or when waited for)."""

    def __init__(self) -> None:
        self.done = False
        self.waited = False

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        self.waited = self.done = True


def test_device_rows_left_by_a_copy_wait_for_its_event():
    """Rows freed after an event are reused once it completed; an allocation short of
    rows waits for the pending event rather than growing the pool."""
    pool = DeviceKVPool({0: (2, 4)}, torch.float32, torch.device("cpu"), rows=4)
    rows = pool.alloc(4)
    first, second = _Event(), _Event()
    pool.free(rows[:2], after=first)
    pool.free(rows[2:3], after=second)
    assert (pool.held, pool.pending) == (1, 3)
    pool.check()
    second.done = True  # completes out of order: reclaimed after the first, in stream order
    pool.reclaim()
    assert pool.pending == 3
    got = pool.alloc(2)  # needs the pending rows: waits for the first event
    assert first.waited and not second.waited and pool.capacity == 4
    assert set(got.tolist()) <= set(rows[:3].tolist()) and pool.pending == 0
    pool.check()
    assert len(pool.alloc(2)) == 2 and pool.capacity == 8  # nothing pending: grows
    pool.check()


def test_device_token_rows_round_trip():
    pool = DeviceKVPool({0: (2, 3), 3: (1, 5)}, torch.float32, torch.device("cpu"), rows=4)
    rows = pool.alloc(3)
    kv = {0: (torch.randn(2, 3, 3), torch.randn(2, 3, 3)), 3: (torch.randn(1, 3, 5),) * 2}
    pool.write(rows, kv)
    packed = pool.pack(rows[::-1])
    assert packed.shape == (3, pool.row_elems) == (3, 2 * 6 + 2 * 5)
    for i, (k, v) in pool.unpack(packed).items():
        assert torch.equal(k, kv[i][0].flip(1)) and torch.equal(v, kv[i][1].flip(1))


def test_host_rows_grow_in_segments_and_copy_in_runs():
    pool = HostKVPool(3, torch.float32, lambda shape, dtype: torch.zeros(shape, dtype=dtype), 4)
    rows = pool.alloc(6)  # past the first segment: a second one of 4 rows
    assert rows.tolist() == list(range(6)) and pool.capacity == 8 and len(pool.segments) == 2
    assert [(i, j) for i, j, _ in pool.runs(rows)] == [(0, 4), (4, 6)]
    data = torch.arange(18.0).reshape(6, 3)
    pool.write(rows, data, lambda dst, src: dst.copy_(src))
    order = np.asarray([5, 0, 1, 2])
    assert [(i, j) for i, j, _ in pool.runs(order)] == [(0, 1), (1, 4)]
    out = torch.empty(4, 3)
    pool.read(order, out, lambda dst, src: dst.copy_(src))
    assert torch.equal(out, data[order])
    pool.free(rows[1:3])
    assert pool.alloc(3).tolist() == [1, 2, 6] and pool.held == 7


def test_a_hit_waits_for_its_promotion_while_running_requests_keep_decoding(bamba):
    """`advance` holds an order with a hit back while a promotion is still copying (an
    event not yet complete, as on CUDA), decodes the running request meanwhile, starts
    the order once the copy landed, and it then gives the tokens it gives at once; a
    waiting order is counted as running and can be cancelled (it stored nothing)."""
    model, worker, sid, slots = bamba
    ids = prompts(6, 1, PROMPT, model.cfg.vocab_size)[0]

    def order(rid: int, hit: int, n: int = NEW) -> PrefillOrder:
        sp = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        return PrefillOrder(
            rid, np.asarray(ids, np.int32), sp, n, hit, sid if hit else -1,
            slots[:hit] if hit else np.zeros(0, np.int64),
        )  # fmt: skip

    alone = Worker(model, store=worker.store)
    want = alone.advance(StepInput(start=(order(9, HIT),))).events
    while alone.num_running:
        want += alone.advance(StepInput()).events
    running = worker.advance(StepInput(start=(order(1, 0, 4 * NEW),))).events
    assert {e.request_id for e in running} == {1}
    copying = _Event()
    worker.store._inbound.append(copying)  # a promotion still in flight
    out = worker.advance(StepInput(start=(order(2, HIT), order(3, HIT)))).events
    assert {e.request_id for e in out} == {1} and set(worker.running_ids()) == {1, 2, 3}
    assert worker.cancel(3) and worker.num_running == 2
    copying.done = True
    got = worker.advance(StepInput()).events
    while worker.num_running:
        got += worker.advance(StepInput()).events
    mine = [e.token for e in got if e.request_id == 2]
    assert mine == [e.token for e in want] and len(mine) == NEW
    assert not copying.waited
