"""Copy one cache entry (a prefix's KV and the mixer state at its end) out of a replica's
`StateStore` as an `EntryPayload`, and into another's.

A payload is a handful of flat tensors, one per dtype (so a transport moves few
tensors), and a torch-free `EntryMeta` that says how to cut them: the entry's tokens,
which positions' KV it carries, each part's shape and offset, the layout of the model
that made it, and a checksum per tensor. `import_entry` checks all of that before it
allocates anything: a payload that arrived short, corrupt, for other tokens or from a
model of another layout is refused with `TransferError` and the store is unchanged, so
the receiver recomputes instead (never a wrong token).

The export copies: the payload owns its tensors and the source store may free or move
the entry's rows as soon as `export_entry` returns (the source's pin lasts the copy
alone; the transport keeps the payload alive until the receiver has read it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from marconi_ray.engine.model.seq_state import StateCheckpoint
from marconi_ray.engine.store.checksum import checksum
from marconi_ray.engine.store.state_store import StateStore
from marconi_ray.protocol.orders import Slots


class TransferError(ValueError):
    """A payload the receiver cannot use (it recomputes instead)."""


@dataclass(frozen=True)
class Part:
    """Where one tensor of the entry lies: `group`'s flat tensor at [offset, offset +
    prod(shape)), viewed as `shape`."""

    name: str
    group: str
    offset: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class EntryMeta:
    """Everything about an `EntryPayload` but its tensors (plain values: it pickles and
    travels with Ray's control messages).

    Attributes:
        tokens: the entry's tokens; its state is the one after all of them.
        kv_from: the first position whose KV the payload carries (the receiver holds
            `tokens[:kv_from]` already); positions [kv_from, len(tokens)).
        layout: the source model's store layout (`store_layout`): a receiver of another
            layout refuses the payload.
        parts: the tensors, by name (`kv`, `conv.i`, `ssm.i`, `logits`, `wk.i`, `wv.i`).
        sums: group -> `checksum` of its flat tensor as sent.
    """

    tokens: npt.NDArray[np.int32]
    kv_from: int
    layout: tuple[object, ...]
    parts: tuple[Part, ...]
    sums: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        return sum(s[0] for s in self.sums.values())


@dataclass(frozen=True)
class EntryPayload:
    """An entry in flight: `meta` and `tensors` (group name -> flat tensor)."""

    meta: EntryMeta
    tensors: dict[str, torch.Tensor]


def store_layout(store: StateStore) -> tuple[object, ...]:
    """What a receiver's store must share with the sender's to take its payloads: the
    KV row width, the store dtype, the SSM and windowed blocks and the window."""
    windowed = () if store.window_kv is None else tuple(sorted(store.window_kv.shapes))
    return (
        store.device_kv.row_elems,
        str(store.dtype),
        tuple(store.model.ssm_blocks),
        windowed,
        store.window,
    )


def export_entry(
    store: StateStore, tokens: npt.NDArray[np.int32], slots: Slots, state_id: int, kv_from: int
) -> EntryPayload:
    """A copy of the entry after `tokens` (`len(tokens)` KV `slots`, one per token, and
    `state_id`, the state at that depth), carrying the KV of positions [kv_from, depth).
    ValueError (from the store) when the slots or the state are not held."""
    depth = len(tokens)
    if not 0 <= kv_from <= depth:
        raise ValueError(f"kv_from must be in [0, {depth}], got {kv_from}")
    if len(slots) != depth:
        raise ValueError(f"{len(slots)} KV slots for an entry of {depth} tokens")
    state = store.load_state(state_id, depth)
    named: list[tuple[str, torch.Tensor]] = [("kv", store.pack_kv(slots[kv_from:]))]
    named += [(f"conv.{i}", t) for i, t in sorted(state.conv.items())]
    named += [(f"ssm.{i}", t) for i, t in sorted(state.ssm.items())]
    assert state.logits is not None
    named.append(("logits", state.logits))
    for i, buf in sorted(state.kv.items()):  # a windowed model's window
        k, v = buf.view()
        named += [(f"wk.{i}", k), (f"wv.{i}", v)]
    groups: dict[str, list[torch.Tensor]] = {}
    parts = []
    for name, t in named:
        group = str(t.dtype).removeprefix("torch.")
        at = sum(x.numel() for x in groups.get(group, []))
        groups.setdefault(group, []).append(t.reshape(-1))
        parts.append(Part(name, group, at, tuple(t.shape)))
    tensors = {g: torch.cat(ts) for g, ts in groups.items()}
    meta = EntryMeta(
        np.asarray(tokens, dtype=np.int32).copy(),
        kv_from,
        store_layout(store),
        tuple(parts),
        {g: checksum(t) for g, t in tensors.items()},
    )
    return EntryPayload(meta, tensors)


def _checked(store: StateStore, payload: EntryPayload, tokens: npt.NDArray[np.int32]) -> None:
    meta = payload.meta
    if len(meta.tokens) != len(tokens) or not np.array_equal(meta.tokens, tokens):
        raise TransferError(f"the payload is an entry of other tokens ({meta.depth} tokens)")
    if meta.layout != store_layout(store):
        raise TransferError(
            f"the payload's store layout {meta.layout} is not this store's {store_layout(store)}"
        )
    if set(payload.tensors) != set(meta.sums):
        raise TransferError(
            f"the payload carries tensors {sorted(payload.tensors)}, its meta {sorted(meta.sums)}"
        )
    for group, t in payload.tensors.items():
        got = checksum(t)
        if got != meta.sums[group]:
            raise TransferError(
                f"payload tensor {group!r} arrived with {got[0]} bytes and checksum "
                f"{got[1:]}, sent with {meta.sums[group][0]} and {meta.sums[group][1:]}"
            )
    for p in meta.parts:
        size = int(np.prod(p.shape, dtype=np.int64))
        if p.offset + size > payload.tensors[p.group].numel():
            raise TransferError(f"payload part {p.name} lies past its tensor {p.group!r}")
    kv = next(p for p in meta.parts if p.name == "kv")
    if kv.shape[0] != meta.depth - meta.kv_from:
        raise TransferError(
            f"payload KV covers {kv.shape[0]} positions, its meta says {meta.depth - meta.kv_from}"
        )


def import_entry(
    store: StateStore, payload: EntryPayload, tokens: npt.NDArray[np.int32], held: int
) -> tuple[int, Slots]:
    """Write an entry into `store`, which holds the KV of `tokens[:held]` already:
    returns (its new state id, new KV slots of positions [held, depth)). TransferError
    (nothing allocated) when the payload is not an intact entry of `tokens` for this
    store's layout, or starts its KV past `held`."""
    tokens = np.asarray(tokens, dtype=np.int32)
    _checked(store, payload, tokens)
    meta = payload.meta
    if not meta.kv_from <= held <= meta.depth:
        raise TransferError(
            f"the payload's KV starts at position {meta.kv_from}; this store holds {held}"
        )
    views = {
        p.name: payload.tensors[p.group][p.offset : p.offset + int(np.prod(p.shape))].view(p.shape)
        for p in meta.parts
    }
    kv = views["kv"][held - meta.kv_from :].to(store.device)
    conv = {int(n[5:]): t.to(store.device) for n, t in views.items() if n.startswith("conv.")}
    ssm = {int(n[4:]): t.to(store.device) for n, t in views.items() if n.startswith("ssm.")}
    window = {
        int(n[3:]): (t.to(store.device), views[f"wv.{n[3:]}"].to(store.device))
        for n, t in views.items()
        if n.startswith("wk.")
    }
    ckpt = StateCheckpoint(meta.depth, conv, ssm, views["logits"].to(store.device), window)
    slots = store.alloc_slots(len(kv))
    try:
        store.device_kv.write(store.device_rows(slots), store.device_kv.unpack(kv))
        sid = store.put_state(ckpt)
    except Exception:
        store.free_slots(slots)
        raise
    return sid, slots
