"""`StateStore`: the tensors behind cached tree nodes, per TP rank, in two tiers: the
model's device and host memory.

- KV: a tree node's KV handle is a numpy array of slot ids, one per token, which the
  radix tree slices on split and concatenates on merge. Slot ids are logical
  (`SlotTable`): a held id lives in one row of the device pool (`DeviceKVPool`:
  `[n_kv_local, rows, head_dim]` per attention block, for K and for V) or of the host pool
  (`HostKVPool`: one token row of every block's K and V). `alloc_slots` hands out ids on
  the device; freed ids are reused.
- SSM checkpoints, by state id: conv and recurrent state per SSM block, plus the
  next-token logits at that depth (so a fully cached prompt needs no prefill), on the
  device or, moved whole, in host memory. Conv states are kept in the store dtype,
  recurrent states (Mamba, Gated DeltaNet) in float32, the precision the model runs them
  at: a resumed state is exactly the one captured, in any dtype. State ids are never
  reused.

Sliding-window blocks (`HybridModel.window_blocks`, W = `window_state`: RecurrentGemma's
attention, LFM3's windowed layers): the cache keeps no per-token KV of theirs (the token
pool `device_kv` holds the other attention blocks only: none for RecurrentGemma, whose
slots then have no bytes) and each checkpoint also holds its window
(`StateCheckpoint.window`: their KV of its last min(depth, W) positions, padded to W),
counted in `state_bytes` and moved with the state. A running sequence's KV of those
blocks is in rows of `window_kv`, which the worker frees as the window leaves them
(`alloc_window`, `free_window`, `engine.window_rows`); `pools` are what the model's
attention reads.

Tiers: `apply_moves` moves ids between the tiers; ids never change, only where their
tensors live. A demotion copies device rows and states to the host (on CUDA on a copy
stream, without blocking: see `tier_copy`), and the device rows it leaves are reused only
once that copy has completed; a promotion copies them back on the copy stream too, into
their device rows, and nothing waits for it but what reads them: `load`, a free of rows
(which a later write may reuse) and a growth of the pool make the compute stream wait for
the promotions in flight (`promotions_in_flight` tells a scheduler when a hit may start
without waiting; decodes of running requests never read the pool, so they keep stepping
meanwhile). `load` reads every slot and the state from whichever tier holds it (a hit the
cache could not promote is read straight from the host).

One KV pool for running and cached tokens: a running request's KV is in device slots
too, allocated as its tokens are computed (`alloc_slots`); its hit is read in place
(`hit_rows`), and when it ends the slots the cache keeps are handed over as they are
(no copy) and the rest freed. While a request reads a hit's rows (`pin_reads` ..
`unpin_reads`), no free the cache side sends frees them: it waits for the last reader
(invariant: every slot whose free waits has a reader, and every read slot is held).
`write_kv` / `load` copy KV between a state's own `KVBuffer`s and slots, for the model's
unpooled API.

Byte accounting: `bytes_used` is the device tier's: K+V of device slots and conv (store
dtype) + recurrent (float32) of device states; it equals `core.model.model_spec`'s prediction
for the same config with `state_dtype_bytes=4`. It counts everything the store holds on
the device: what the cache references (what the coordinator accounts: its tree's device
bytes) plus what running requests hold (their own slots and captured states, until they
commit; zero when the worker is idle). `host_bytes_used` counts the host tier alike.
Logits are bookkeeping, reported apart (`logits_bytes`, device states').

Invariant (`check`): a held slot id has exactly one location (a tier and a row of that
tier's pool); a device row or host row belongs to at most one id, and a pool row is held
exactly when an id lives there; a free id has no row; every state is in one tier, its
tensors there (pinned on the host of a CUDA device). Nothing is freed twice:
`free_slots` and `apply_moves` validate every id before changing anything.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable, Sequence

import numpy as np
import torch

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.kv_buffer import KVBuffer
from marconi_ray.engine.model.paged_kv import Pools, SplitPools
from marconi_ray.engine.model.seq_state import SeqState, StateCheckpoint
from marconi_ray.engine.store.device_pool import DeviceKVPool
from marconi_ray.engine.store.host_pool import HostKVPool
from marconi_ray.engine.store.move_check import check_moves
from marconi_ray.engine.store.slot_table import DEVICE, FREE, HOST, TIER_NAMES, Slots, SlotTable
from marconi_ray.engine.store.tier_copy import CopyEvent, TierCopier
from marconi_ray.protocol.orders import Move

STATE_DTYPE = torch.float32
"""The dtype of stored recurrent states (that of the running ones)."""


def _tensors(ck: StateCheckpoint) -> list[torch.Tensor]:
    window = [t for kv in ck.window.values() for t in kv]
    return [*ck.conv.values(), *ck.ssm.values(), ck.logits, *window]


def _nbytes(ck: StateCheckpoint) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(ck))


def _like(ck: StateCheckpoint, make: Callable[[torch.Tensor], torch.Tensor]) -> StateCheckpoint:
    """A checkpoint of `make(t)` for each of `ck`'s tensors (same depth and blocks)."""
    return StateCheckpoint(
        ck.depth,
        {i: make(t) for i, t in ck.conv.items()},
        {i: make(t) for i, t in ck.ssm.items()},
        make(ck.logits),
        {i: (make(k), make(v)) for i, (k, v) in ck.window.items()},
    )


class StateStore:
    """KV slots + SSM checkpoints of one model rank, on its device and in host memory (KV
    and conv states in `model.dtype`, recurrent states in float32).

    Args:
        model: the rank's model.
        initial_slots: initial device rows (and slot ids); both grow by doubling.
        initial_host_slots: rows of the host pool's first segment.
    """

    def __init__(
        self, model: HybridModel, initial_slots: int = 256, initial_host_slots: int = 256
    ) -> None:
        self.model = model
        self.dtype = model.dtype
        self.device = model.device
        shapes = model.kv_shapes()
        self.window = model.window_state
        """W for a model with sliding-window blocks (`HybridModel.window_state`), else
        None."""
        windowed = set(model.window_blocks)
        self.copier = TierCopier(self.device)
        self.device_kv = DeviceKVPool(
            {i: sh for i, sh in shapes.items() if i not in windowed},
            self.dtype,
            self.device,
            initial_slots,
        )
        self.window_kv = (
            DeviceKVPool(
                {i: shapes[i] for i in sorted(windowed)}, self.dtype, self.device, initial_slots
            )
            if windowed
            else None
        )
        """The windowed blocks' running rows (`alloc_window`; None without such blocks)."""
        self.host_kv = HostKVPool(
            self.device_kv.row_elems, self.dtype, self.copier.host_empty, initial_host_slots
        )
        self.slots = SlotTable(initial_slots)
        self._reads: Counter[int] = Counter()
        """Slot id -> running requests that read its row in place (`pin_reads`)."""
        self._deferred: set[int] = set()
        """Read slots the cache let go of: freed when their last reader ends."""
        self._states: dict[int, StateCheckpoint] = {}
        self._host_states: set[int] = set()
        self._next_id = 0
        self._moves = {True: 0, False: 0}
        self._inbound: deque[CopyEvent] = deque()
        """Events of the promotions still copying on CUDA (oldest first)."""
        elem = torch.empty((), dtype=self.dtype).element_size()
        self.kv_bytes_per_token = self.device_kv.row_elems * elem
        self.window_row_bytes = 0 if self.window_kv is None else self.window_kv.row_elems * elem
        """Bytes of one window row (the windowed blocks' K and V of one token; 0 without
        such blocks)."""
        self.state_bytes = (self.window or 0) * self.window_row_bytes + sum(
            c.numel() * elem + s.numel() * STATE_DTYPE.itemsize
            for c, s in (model.ssm(i).empty_state(self.device) for i in model.ssm_blocks)
        )

    # ------------------------------------------------------------------ bytes
    @property
    def live_slots(self) -> int:
        """Slot ids held, in both tiers."""
        return self.device_slots + self.host_slots

    @property
    def host_slots(self) -> int:
        return self.slots.count(HOST)

    @property
    def device_slots(self) -> int:
        return self.slots.count(DEVICE)

    @property
    def live_states(self) -> int:
        """States held, in both tiers."""
        return len(self._states)

    @property
    def host_states(self) -> int:
        return len(self._host_states)

    @property
    def device_states(self) -> int:
        return self.live_states - self.host_states

    @property
    def bytes_used(self) -> int:
        """KV + SSM bytes held on the device (what the prefix cache budgets there), and
        the running window rows."""
        return (
            self.device_slots * self.kv_bytes_per_token
            + self.device_states * self.state_bytes
            + self.window_rows_held * self.window_row_bytes
        )

    @property
    def pools(self) -> Pools:
        """The pools the model's attention reads and writes: the device tier's token
        rows, and the windowed blocks' rows (`SplitPools`) when the model has some."""
        if self.window_kv is None:
            return self.device_kv
        return SplitPools(self.device_kv, self.window_kv, frozenset(self.window_kv.shapes))

    @property
    def window_rows_held(self) -> int:
        """Window rows held now by running sequences (0 without windowed blocks)."""
        return 0 if self.window_kv is None else self.window_kv.held

    @property
    def host_bytes_used(self) -> int:
        """KV + SSM bytes held in host memory (the cache's host tier)."""
        return self.host_slots * self.kv_bytes_per_token + self.host_states * self.state_bytes

    @property
    def logits_bytes(self) -> int:
        """Bytes of the device states' logits (not in `bytes_used`)."""
        return sum(
            s.logits.numel() * s.logits.element_size()
            for sid, s in self._states.items()
            if sid not in self._host_states
        )

    def tier_stats(self) -> dict[str, float]:
        """The host tier's holdings and the copies between the tiers so far: bytes and
        seconds per direction (see `tier_copy` for how seconds are measured on CUDA:
        copies still in flight are not counted yet) and `Move`s applied per direction.
        A hit read straight from the host counts as bytes to the device, not as a move."""
        self.copier.poll()
        return {
            "host_bytes": float(self.host_bytes_used),
            "host_slots": float(self.host_slots),
            "host_states": float(self.host_states),
            "bytes_to_host": float(self.copier.bytes[True]),
            "bytes_to_device": float(self.copier.bytes[False]),
            "seconds_to_host": self.copier.seconds[True],
            "seconds_to_device": self.copier.seconds[False],
            "moves_to_host": float(self._moves[True]),
            "moves_to_device": float(self._moves[False]),
        }

    # ------------------------------------------------------------------ KV slots
    def promotions_in_flight(self) -> bool:
        """Whether promoted rows or states are still being copied to the device (only
        ever on CUDA: on CPU a promotion is done when `apply_moves` returns)."""
        while self._inbound and self._inbound[0].query():
            self._inbound.popleft()
        return bool(self._inbound)

    def _await_promotions(self) -> None:
        """Make the compute stream wait for every promotion in flight: before it reads
        promoted rows or states, reuses rows (a free), or grows the pool they land in."""
        while self._inbound:
            self.copier.wait(self._inbound.popleft())

    def alloc_slots(self, n: int) -> Slots:
        """`n` free slot ids, on the device (the pools grow when needed)."""
        self.copier.poll()
        if n > self.device_kv.capacity - self.device_kv.held:
            self._await_promotions()
        ids = self.slots.alloc(n)
        self.slots.place(ids, DEVICE, self.device_kv.alloc(n))
        return ids

    def free_slots(self, slots: Slots) -> None:
        """Return held slots, in either tier, to the pool; ValueError (nothing freed)
        naming the slots that are not held or are listed twice (a slot already let go
        of while a request reads it counts as not held). A slot a running request
        reads in place (`pin_reads`) is not freed yet: it is freed, once, when its last
        reader ends (`unpin_reads`), so no free the cache side asks for (a reset's
        reconcile included) ever hands a row that is being read to the next prefill."""
        ids = np.asarray(slots, dtype=np.int64)
        if not len(ids):
            return
        bad = self.slots.not_held(ids)
        if self._deferred:
            bad += sorted({int(i) for i in ids} & self._deferred - set(bad))
        if bad:
            raise ValueError(f"KV slots {bad[:16]} are not held (freed twice?)")
        if self._reads:
            read = np.isin(ids, np.fromiter(self._reads, np.int64, len(self._reads)))
            if read.any():
                self._deferred.update(int(i) for i in ids[read])
                ids = ids[~read]
        self._free_now(ids)

    def pin_reads(self, slots: Slots) -> None:
        """Running requests read these device slots' rows in place (a hit): until the
        matching `unpin_reads`, freeing them only defers the free (`free_slots`)."""
        self._reads.update(int(i) for i in np.asarray(slots, dtype=np.int64))

    def unpin_reads(self, slots: Slots) -> None:
        """A reader of these slots ended; those the cache let go of meanwhile and that no
        other request reads are freed now."""
        done = []
        for i in (int(i) for i in np.asarray(slots, dtype=np.int64)):
            self._reads[i] -= 1
            if self._reads[i] <= 0:
                del self._reads[i]
                if i in self._deferred:
                    self._deferred.discard(i)
                    done.append(i)
        self._free_now(np.asarray(done, dtype=np.int64))

    def released_slots(self) -> Slots:
        """Slots the cache let go of that a running request still reads (freed when it
        ends): not the cache's any more, so not among its holdings."""
        return np.asarray(sorted(self._deferred), dtype=np.int64)

    def _free_now(self, ids: Slots) -> None:
        if not len(ids):
            return
        self._await_promotions()
        tiers, rows = self.slots.tier[ids], self.slots.row[ids]
        self.device_kv.free(rows[tiers == DEVICE])
        self.host_kv.free(rows[tiers == HOST])
        self.slots.free(ids)

    def used_slots(self) -> Slots:
        """Ids of the KV slots currently allocated (both tiers), ascending."""
        return self.slots.ids()

    def host_slot_ids(self) -> Slots:
        """Ids of the KV slots in host memory, ascending."""
        return self.slots.ids(HOST)

    def state_ids(self) -> list[int]:
        """Ids of the states currently held (both tiers), ascending."""
        return sorted(self._states)

    def host_state_ids(self) -> list[int]:
        """Ids of the states in host memory, ascending."""
        return sorted(self._host_states)

    def write_kv(self, slots: Slots, state: SeqState, start: int) -> None:
        """Copy `state`'s KV at positions [start, start + len(slots)) into `slots`, which
        must be device slots (ValueError naming the others)."""
        ids = np.asarray(slots, dtype=np.int64)
        if not len(ids):
            return
        off = ids[self.slots.tiers_of(ids) != DEVICE]
        if len(off):
            raise ValueError(f"KV slots {off[:16].tolist()} are not held on the device")
        end = start + len(ids)
        kv = {i: (k[:, start:end], v[:, start:end]) for i, (k, v) in self._kv_views(state)}
        self.device_kv.write(self.slots.row[ids], kv)

    def _kv_views(self, state: SeqState) -> list[tuple[int, tuple[torch.Tensor, torch.Tensor]]]:
        return [(i, state.kv[i].view()) for i in self.model.attn_blocks if i in self.device_kv.k]

    # ------------------------------------------------------------------ windows
    def alloc_window(self, n: int) -> Slots:
        """`n` window rows for running sequences (ValueError without windowed blocks)."""
        if self.window_kv is None:
            raise ValueError("this model keeps no window rows (it has no sliding-window blocks)")
        return self.window_kv.alloc(n)

    def free_window(self, rows: Slots) -> None:
        """Give back running window rows; ValueError (nothing freed) naming rows that
        are not held or are listed twice."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return
        if self.window_kv is None:
            raise ValueError("this model keeps no window rows (it has no sliding-window blocks)")
        inside = (rows >= 0) & (rows < self.window_kv.capacity)
        held = np.zeros(len(rows), dtype=np.bool_)
        held[inside] = self.window_kv.is_held(rows[inside])
        _, first = np.unique(rows, return_index=True)
        twice = np.ones(len(rows), dtype=np.bool_)
        twice[first] = False
        bad = rows[~held | twice]
        if len(bad):
            raise ValueError(f"window rows {bad[:16].tolist()} are not held (freed twice?)")
        self.window_kv.free(rows)

    # ------------------------------------------------------------------ states
    def put_state(self, ckpt: StateCheckpoint, window_rows: Slots | None = None) -> int:
        """Store a copy of `ckpt` on the device (conv in the store dtype, recurrent in
        float32); returns its new state id. With sliding-window blocks a checkpoint carries
        its window: `ckpt.window`, or `window_rows`, the window rows of its last
        min(depth, W) positions (`WindowRows.at`), read here; stored zero-padded to W
        positions (ValueError when it is missing or the wrong length)."""
        window = {}
        if self.window is not None:
            window = self._window_tensors(ckpt, window_rows)
        sid = self._next_id
        self._next_id += 1
        self._states[sid] = StateCheckpoint(
            ckpt.depth,
            {i: t.to(self.dtype, copy=True) for i, t in ckpt.conv.items()},
            {i: t.to(STATE_DTYPE, copy=True) for i, t in ckpt.ssm.items()},
            ckpt.logits.clone(),
            window,
        )
        return sid

    def _window_tensors(
        self, ckpt: StateCheckpoint, rows: Slots | None
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """`ckpt`'s window, as the store keeps it: W positions per block, the first
        min(depth, W) of them its KV (from `rows` when given), the rest zeros."""
        assert self.window is not None and self.window_kv is not None
        m = min(ckpt.depth, self.window)
        src = ckpt.window if rows is None else self.window_kv.read(np.asarray(rows, np.int64))
        if not set(self.window_kv.shapes) <= set(src):
            raise ValueError(
                f"a checkpoint of this model needs its window (sliding-window blocks "
                f"{sorted(self.window_kv.shapes)}), got blocks {sorted(src)}"
            )
        out = {}
        for i in self.window_kv.shapes:
            k, v = src[i]
            if k.shape[1] != m or v.shape[1] != m:
                raise ValueError(
                    f"the window of a checkpoint at depth {ckpt.depth} has {m} positions, "
                    f"block {i} got {k.shape[1]}"
                )
            n, _, d = k.shape
            kw = torch.zeros((n, self.window, d), dtype=self.dtype, device=self.device)
            vw = torch.zeros_like(kw)
            kw[:, :m] = k
            vw[:, :m] = v
            out[i] = (kw, vw)
        return out

    def has_state(self, sid: int) -> bool:
        return sid in self._states

    def free_state(self, sid: int) -> None:
        """Drop a state, in either tier; freeing an unknown id is a KeyError (a
        bookkeeping bug)."""
        del self._states[sid]
        self._host_states.discard(sid)

    # ------------------------------------------------------------------ tiers
    def apply_moves(self, moves: Sequence[Move]) -> None:
        """Apply `moves` in order: copy each one's slots and states to the tier it names
        and free the rows they leave. Validated first, as a whole: a slot that is not held
        (or listed twice), a state that is not held, or an id already in the tier a move
        sends it to (counting the earlier moves) is a ValueError naming the ids, and
        nothing moves. So is a move to the host of a row a running request reads in place
        (`pin_reads`): demoting it would hand the row to the next prefill under the
        reader."""
        if not moves:
            return
        self.copier.poll()
        check_moves(moves, self.slots, self._states, self._host_states)
        if self._reads:
            read = set(self._reads)
            busy = sorted({int(i) for m in moves if m.to_host for i in m.slots} & read)
            if busy:
                raise ValueError(f"KV slots {busy[:16]} are read by running requests")
        for m in moves:
            ids = np.asarray(m.slots, dtype=np.int64)
            if not len(ids) and not m.states:
                continue
            if m.to_host:
                self._demote(ids, list(m.states))
            else:
                self._promote(ids, list(m.states))
            self._moves[m.to_host] += 1

    def _demote(self, ids: Slots, sids: list[int]) -> None:
        rows = self.slots.row[ids]
        host_rows = self.host_kv.alloc(len(ids))
        old = [self._states[s] for s in sids]
        new = [_like(ck, lambda t: self.copier.host_empty(t.shape, t.dtype)) for ck in old]

        def enqueue() -> None:
            if len(rows):
                self.copier.touch(*self.device_kv.tensors())
                self.host_kv.write(host_rows, self.device_kv.pack(rows), self.copier.copy)
            self._copy_states(new, old)

        n_bytes = len(rows) * self.kv_bytes_per_token + sum(map(_nbytes, old))
        done: CopyEvent | None = self.copier.run(True, n_bytes, enqueue)
        self.device_kv.free(rows, after=done)
        self.slots.place(ids, HOST, host_rows)
        self._states.update(zip(sids, new, strict=True))
        self._host_states.update(sids)

    def _promote(self, ids: Slots, sids: list[int]) -> None:
        """Copy host rows and states to new device rows and states on the copy stream;
        the compute stream waits only where they are read (`_await_promotions`)."""
        host_rows = self.slots.row[ids]
        if len(ids) > self.device_kv.capacity - self.device_kv.held:
            self._await_promotions()  # the pool grows: earlier promotions must have landed
        rows = self.device_kv.alloc(len(ids))
        _, new = self._to_device(host_rows, [self._states[s] for s in sids], rows)
        self.host_kv.free(host_rows)
        self.slots.place(ids, DEVICE, rows)
        self._states.update(zip(sids, new, strict=True))
        self._host_states.difference_update(sids)

    def _to_device(
        self, host_rows: Slots, ckpts: list[StateCheckpoint], rows: Slots | None = None
    ) -> tuple[torch.Tensor, list[StateCheckpoint]]:
        """Device copies of host token rows (`[len(host_rows), row_elems]`, in order) and
        of host checkpoints, as one copy the compute stream waits for. With `rows` (a
        promotion), the token rows are also written into those device rows on the copy
        stream, and the compute stream does not wait: the copy's event joins the
        promotions in flight (`_await_promotions`)."""
        packed = torch.empty(
            (len(host_rows), self.device_kv.row_elems), dtype=self.dtype, device=self.device
        )
        new = [_like(ck, lambda t: torch.empty_like(t, device=self.device)) for ck in ckpts]

        def enqueue() -> None:
            self.host_kv.read(host_rows, packed, self.copier.copy)
            if rows is not None and len(rows):
                self.copier.touch(*self.device_kv.tensors())
                self.device_kv.write(rows, self.device_kv.unpack(packed))
            self._copy_states(new, ckpts)

        n_bytes = len(host_rows) * self.kv_bytes_per_token + sum(map(_nbytes, ckpts))
        done = self.copier.run(False, n_bytes, enqueue, wait=rows is None)
        if rows is not None and done is not None:
            self._inbound.append(done)
        return packed, new

    def _copy_states(self, dst: list[StateCheckpoint], src: list[StateCheckpoint]) -> None:
        for d, s in zip(dst, src, strict=True):
            for dt, st in zip(_tensors(d), _tensors(s), strict=True):
                self.copier.copy(dt, st)

    # ------------------------------------------------------------------ hits
    def hit_rows(self, slots: Slots, length: int) -> tuple[Slots, Slots]:
        """The device rows a request reads its hit's KV from, in place: (rows, staged).

        `slots` are the hit's slot ids, one per cached token in order (`length` of them,
        else ValueError), each in either tier. A device slot's row is its own (no copy:
        the plan's lock keeps it there until the request commits). A host slot's KV is
        copied into a new device slot of the request's (`staged`, freed when it ends)
        and its row read instead (a hit the cache could not promote). ValueError naming
        slots that are not held."""
        ids = self._hit_ids(slots, length)
        self._await_promotions()
        rows = self.slots.row[ids].copy()
        on_host = self.slots.tier[ids] == HOST
        staged = np.empty(0, dtype=np.int64)
        if on_host.any():
            packed, _ = self._to_device(rows[on_host], [])
            staged = self.alloc_slots(int(on_host.sum()))
            rows[on_host] = self.slots.row[staged]
            self.device_kv.write(rows[on_host], self.device_kv.unpack(packed))
        return rows, staged

    def load_state(self, sid: int, length: int) -> SeqState:
        """A `SeqState` resuming after `length` cached tokens: copies of state `sid`'s
        SSM states (conv in the model dtype) and its logits, from either tier, and for a
        model with sliding-window blocks their window as `kv` (`KVBuffer`s of the last
        min(length, W) positions; no KV otherwise). ValueError when the state is at
        another depth."""
        ckpt = self._states.get(sid)
        if ckpt is None:
            raise ValueError(f"state {sid} of the hit is not held")
        if ckpt.depth != length:
            raise ValueError(f"state {sid} is at depth {ckpt.depth}, the hit is {length}")
        self._await_promotions()
        if sid in self._host_states:
            _, (ckpt,) = self._to_device(np.empty(0, dtype=np.int64), [ckpt])
        else:
            ckpt = _like(ckpt, torch.clone)
        state = SeqState(length=length, logits=ckpt.logits)
        for i in self.model.ssm_blocks:
            state.conv[i] = ckpt.conv[i].to(self.model.dtype)
            state.ssm[i] = ckpt.ssm[i]
        m = min(length, self.window or 0)
        for i, (k, v) in ckpt.window.items():
            state.kv[i] = KVBuffer(k[:, :m].to(self.model.dtype), v[:, :m].to(self.model.dtype))
        return state

    def load(self, slots: Slots, sid: int, length: int) -> SeqState:
        """`load_state` with copies of the hit's KV in the state's own `KVBuffer`s,
        `[n_kv_local, length, head_dim]` per attention block, read from whichever tier
        holds each slot (the model's unpooled API: the serving path reads the hit in
        place through `hit_rows`). The store is unchanged: nothing moves."""
        ids = self._hit_ids(slots, length)
        state = self.load_state(sid, length)
        rows = self.slots.row[ids]
        on_host = self.slots.tier[ids] == HOST
        if on_host.any():
            packed, _ = self._to_device(rows[on_host], [])
            kv = self.device_kv.merge(rows, on_host, packed)
        else:
            kv = self.device_kv.read(rows)
        for i, (k, v) in kv.items():
            state.kv[i] = KVBuffer(k.to(self.model.dtype), v.to(self.model.dtype))
        return state

    def pack_kv(self, slots: Slots) -> torch.Tensor:
        """The KV of held slots as token rows `[len(slots), row_elems]` on the device, in
        order, read from whichever tier holds each (a copy: the store is unchanged).
        ValueError naming slots that are not held."""
        ids = self._hit_ids(slots, len(slots))
        self._await_promotions()
        rows = self.slots.row[ids]
        on_host = self.slots.tier[ids] == HOST
        if not on_host.any():
            return self.device_kv.pack(rows)
        out = torch.empty(
            (len(ids), self.device_kv.row_elems), dtype=self.dtype, device=self.device
        )
        host_part, _ = self._to_device(rows[on_host], [])
        out[torch.as_tensor(on_host, device=self.device)] = host_part
        if not on_host.all():
            out[torch.as_tensor(~on_host, device=self.device)] = self.device_kv.pack(rows[~on_host])
        return out

    def _hit_ids(self, slots: Slots, length: int) -> Slots:
        """A hit's slot ids as an array; ValueError unless there are `length` of them,
        all held."""
        ids = np.asarray(slots, dtype=np.int64)
        if len(ids) != length:
            raise ValueError(f"{len(ids)} KV slots for a hit of {length} tokens")
        missing = ids[self.slots.tiers_of(ids) == FREE]
        if len(missing):
            raise ValueError(f"KV slots {missing[:16].tolist()} of the hit are not held")
        return ids

    def on_device(self, slots: Slots) -> Slots:
        """Those of `slots` (held) whose KV is in a device row."""
        ids = np.asarray(slots, dtype=np.int64)
        on: Slots = ids[self.slots.tier[ids] == DEVICE]
        return on

    def device_rows(self, slots: Slots) -> Slots:
        """The device rows of device slots (a request's own, just allocated)."""
        return self.slots.row[np.asarray(slots, dtype=np.int64)]

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        """Raise AssertionError unless the invariant of the module docstring holds."""
        self.slots.check({DEVICE: self.device_kv, HOST: self.host_kv})
        read = np.asarray(sorted(self._reads), dtype=np.int64)
        if len(read) and self.slots.not_held(read):
            raise AssertionError(f"read slots {self.slots.not_held(read)[:16]} are not held")
        if not self._deferred <= set(self._reads):
            raise AssertionError("a slot whose free waits has no reader")
        self.device_kv.check()
        if self.window_kv is not None:
            self.window_kv.check()
        if not self._host_states <= set(self._states):
            raise AssertionError("a host state id is not held")
        for sid, ck in self._states.items():
            host = sid in self._host_states
            want = "cpu" if host else self.device.type
            for t in _tensors(ck):
                if t.device.type != want or (host and self.copier.pinned and not t.is_pinned()):
                    name = TIER_NAMES[HOST if host else DEVICE]
                    raise AssertionError(f"state {sid}'s tensors are not all on {name}")
