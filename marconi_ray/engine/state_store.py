"""`StateStore`: the tensors behind cached tree nodes, on the model's device, per TP rank.

- KV lives in a token-slot pool per attention block, `[n_kv_local, n_slots, head_dim]`
  for K and for V (SGLang-style): a tree node's KV handle is a numpy array of slot ids,
  which the radix tree slices on split and concatenates on merge. The pool grows by
  doubling; freed slots are reused.
- SSM checkpoints live by state id: conv and recurrent state per SSM block, plus the
  next-token logits at that depth (so a fully cached prompt needs no prefill). Conv
  states are kept in the store dtype, recurrent states (Mamba, Gated DeltaNet) in float32,
  the precision the model runs them at: a resumed state is exactly the one captured, in
  any dtype.

Byte accounting (`bytes_used`) counts K+V of live slots and conv (store dtype) +
recurrent (float32) of live states; it equals `core.model_spec`'s prediction for the same
config with `state_dtype_bytes=4` (logits are bookkeeping, reported apart in
`logits_bytes`).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

from marconi_ray.engine.kv_buffer import KVBuffer
from marconi_ray.engine.model import HybridModel
from marconi_ray.engine.seq_state import SeqState, StateCheckpoint

Slots = npt.NDArray[np.int64]
STATE_DTYPE = torch.float32
"""The dtype of stored recurrent states (that of the running ones)."""


class StateStore:
    """KV slot pool + SSM checkpoints of one model rank (KV and conv states in
    `model.dtype`, recurrent states in float32).

    Invariant: a KV slot is free or held, never both; freeing one that is not held (a
    second free would hand it out twice: two sequences writing one slot) is refused with
    a ValueError naming it, before anything is freed. State ids are never reused.
    """

    def __init__(self, model: HybridModel, initial_slots: int = 256) -> None:
        self.model = model
        self.dtype = model.dtype
        self.device = model.device
        self._k: dict[int, torch.Tensor] = {}
        self._v: dict[int, torch.Tensor] = {}
        for i in model.attn_blocks:
            attn = model.attention(i)
            shape = (attn.n_kv, initial_slots, attn.cfg.head_dim)
            self._k[i] = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self._v[i] = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self._free: list[int] = list(range(initial_slots - 1, -1, -1))
        self._held = np.zeros(initial_slots, dtype=np.bool_)
        self._capacity = initial_slots
        self._states: dict[int, StateCheckpoint] = {}
        self._next_id = 0
        self.kv_bytes_per_token = sum(
            2 * self._k[i].shape[0] * self._k[i].shape[2] * self._k[i].element_size()
            for i in model.attn_blocks
        )
        self.state_bytes = sum(
            c.numel() * self._k_elem() + s.numel() * STATE_DTYPE.itemsize
            for c, s in (model.ssm(i).empty_state(self.device) for i in model.ssm_blocks)
        )

    def _k_elem(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    # ------------------------------------------------------------------ bytes
    @property
    def live_slots(self) -> int:
        return self._capacity - len(self._free)

    @property
    def live_states(self) -> int:
        return len(self._states)

    @property
    def bytes_used(self) -> int:
        """KV + SSM bytes held (what the prefix cache budgets)."""
        return self.live_slots * self.kv_bytes_per_token + self.live_states * self.state_bytes

    @property
    def logits_bytes(self) -> int:
        return sum(s.logits.numel() * s.logits.element_size() for s in self._states.values())

    # ------------------------------------------------------------------ KV slots
    def _grow(self, need: int) -> None:
        new_cap = max(2 * self._capacity, self._capacity + need)
        for pool in (self._k, self._v):
            for i, t in pool.items():
                grown = t.new_zeros(t.shape[0], new_cap, t.shape[2])
                grown[:, : self._capacity] = t
                pool[i] = grown
        self._free = list(range(new_cap - 1, self._capacity - 1, -1)) + self._free
        self._held = np.concatenate([self._held, np.zeros(new_cap - self._capacity, np.bool_)])
        self._capacity = new_cap

    def alloc_slots(self, n: int) -> Slots:
        """`n` free slot ids (the pool grows when needed)."""
        if n > len(self._free):
            self._grow(n - len(self._free))
        out = np.asarray([self._free.pop() for _ in range(n)], dtype=np.int64)
        self._held[out] = True
        return out

    def free_slots(self, slots: Slots) -> None:
        """Return held slots to the pool; ValueError (nothing freed) naming the slots that
        are not held or are listed twice."""
        ids = np.asarray(slots, dtype=np.int64)
        if not len(ids):
            return
        in_range = (ids >= 0) & (ids < self._capacity)
        bad = ids[~in_range].tolist()
        ok = ids[in_range]
        bad += ok[~self._held[ok]].tolist()
        uniq, counts = np.unique(ok, return_counts=True)
        bad += uniq[counts > 1].tolist()
        if bad:
            raise ValueError(f"KV slots {sorted(set(bad))[:16]} are not held (freed twice?)")
        self._held[ids] = False
        self._free.extend(ids.tolist())

    def used_slots(self) -> Slots:
        """Ids of the KV slots currently allocated, ascending."""
        return np.flatnonzero(self._held).astype(np.int64)

    def state_ids(self) -> list[int]:
        """Ids of the states currently held, ascending."""
        return sorted(self._states)

    def write_kv(self, slots: Slots, state: SeqState, start: int) -> None:
        """Copy `state`'s KV at positions [start, start + len(slots)) into `slots`."""
        if len(slots) == 0:
            return
        idx = torch.as_tensor(slots, device=self.device)
        for i in self.model.attn_blocks:
            k, v = state.kv[i].view()
            self._k[i][:, idx] = k[:, start : start + len(slots)].to(self.dtype)
            self._v[i][:, idx] = v[:, start : start + len(slots)].to(self.dtype)

    # ------------------------------------------------------------------ states
    def put_state(self, ckpt: StateCheckpoint) -> int:
        """Store a copy of `ckpt` (conv in the store dtype, recurrent in float32); returns
        its new state id."""
        sid = self._next_id
        self._next_id += 1
        self._states[sid] = StateCheckpoint(
            ckpt.depth,
            {i: t.to(self.dtype, copy=True) for i, t in ckpt.conv.items()},
            {i: t.to(STATE_DTYPE, copy=True) for i, t in ckpt.ssm.items()},
            ckpt.logits.clone(),
        )
        return sid

    def has_state(self, sid: int) -> bool:
        return sid in self._states

    def free_state(self, sid: int) -> None:
        """Drop a state; freeing an unknown id is a KeyError (a bookkeeping bug)."""
        del self._states[sid]

    # ------------------------------------------------------------------ hits
    def load(self, slots: Slots, sid: int, length: int) -> SeqState:
        """A `SeqState` resuming after `length` cached tokens: the KV of `slots` (one per
        token, in order) and state `sid`'s SSM states and logits."""
        if len(slots) != length:
            raise ValueError(f"{len(slots)} KV slots for a hit of {length} tokens")
        ckpt = self._states[sid]
        if ckpt.depth != length:
            raise ValueError(f"state {sid} is at depth {ckpt.depth}, the hit is {length}")
        state = SeqState(length=length, logits=ckpt.logits.clone())
        idx = torch.as_tensor(slots, device=self.device)
        for i in self.model.attn_blocks:
            k = self._k[i].index_select(1, idx).to(self.model.dtype)
            v = self._v[i].index_select(1, idx).to(self.model.dtype)
            state.kv[i] = KVBuffer(k, v)
        for i in self.model.ssm_blocks:
            state.conv[i] = ckpt.conv[i].to(self.model.dtype, copy=True)
            state.ssm[i] = ckpt.ssm[i].clone()
        return state
