"""Attention KV kept in rows of a shared pool (the engine's one KV pool), as the attention
layers read and write it.

A pool (`KVRows`: the store's `DeviceKVPool`) holds, per attention block i, keys `k[i]`
and values `v[i]` of shape [n_kv_local, rows, head_dim]; one row index is one token's K
and V in every block. A sequence's KV is the list of its rows, oldest token first: a
cache hit's rows are the cached tokens' own rows, read in place, and each new token's K
and V are written into a row allocated for it. Nothing is gathered into a private buffer.

Three per-block views, built by the model for one forward:
- `PagedPrefill`: one sequence's L new tokens (`extend` writes them, returns what the
  prefill attends over);
- `PackedPrefill`: the new tokens of S sequences prefilled in one forward, packed one
  sequence after another (`attend`: one write and one attention call for all of them
  through a row table; the layout, `PackedRows`, is built once per forward);
- `PagedDecode`: one new token for each of B sequences, one attention call for the batch
  through a row table (`attend`).
`BufferDecode` is the same call over per-sequence `KVBuffer`s (the unpooled states of the
model's own API: validation, tools), one SDPA per sequence.

A model with sliding-window blocks, served, keeps their KV in a second pool (`SplitPools`),
through a second row list per sequence (`SeqState.window_rows`): those rows are freed as
the window leaves them (`engine.window_rows`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa
from torch.nn.utils.rnn import pad_sequence

from marconi_ray.engine.model.kv_buffer import KVBuffer

PagedAttention = Callable[..., torch.Tensor]
"""`marconi_kernels` `paged_decode_attention`: (q [B, H, hd], k_pool, v_pool [KV, R, hd],
table [B, W], lens [B], scale, window=) -> [B, H, hd]."""

PackedAttention = Callable[..., torch.Tensor]
"""`marconi_kernels` `paged_prefill_attention`: (q [T, H, hd], k_pool, v_pool [KV, R, hd],
table [S, W], cu_q [S + 1], lens [S], max_q, scale, window=) -> [T, H, hd]."""


def window_kwargs(window: int | None) -> dict[str, int]:
    """The attention kernels' keyword for a sliding window (none without one, so a call
    without a window is the plain call)."""
    return {} if window is None else {"window": window}


class KVRows(Protocol):
    """A KV pool: attention block index -> keys / values [n_kv_local, rows, head_dim]."""

    k: dict[int, torch.Tensor]
    v: dict[int, torch.Tensor]


@dataclass(frozen=True)
class SplitPools:
    """The KV pools of a model with sliding-window blocks, served: the blocks in `blocks`
    keep their KV in `window` (each sequence's `SeqState.window_rows`), every other
    attention block in `token` (its `SeqState.rows`)."""

    token: KVRows
    window: KVRows
    blocks: frozenset[int]

    def of(self, i: int) -> KVRows:
        """Block i's pool."""
        return self.window if i in self.blocks else self.token


Pools = KVRows | SplitPools
"""Where a pooled forward's attention blocks keep their KV: one pool, or two."""


class DecodeKV(Protocol):
    """Where one attention layer's decode step reads and writes its KV."""

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
        window: int | None = None,
    ) -> torch.Tensor:
        """Store the step's k, v [KV, B, hd] and attend q [H, B, hd] over each sequence's
        KV including them (only its last `window` positions with a window); returns
        [B, H * hd]."""
        ...


class ScratchKV:
    """A small `KVRows` of zeros that nothing else uses (the model's warm-up)."""

    def __init__(
        self,
        shapes: dict[int, tuple[int, int]],
        rows: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.k = {
            i: torch.zeros((n, rows, d), dtype=dtype, device=device) for i, (n, d) in shapes.items()
        }
        self.v = {i: torch.zeros_like(t) for i, t in self.k.items()}


@dataclass(frozen=True)
class PagedPrefill:
    """One attention block's KV of one sequence being prefilled.

    k_pool, v_pool: the block's pool tensors [KV, R, hd]; past: rows [P] of the tokens
    already consumed (a hit's rows, earlier chunks); new: rows [L] for the tokens of this
    forward.
    """

    k_pool: torch.Tensor
    v_pool: torch.Tensor
    past: torch.Tensor
    new: torch.Tensor

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [KV, L, hd] into the new rows; returns the keys and values of every
        position, [KV, P + L, hd] (k, v themselves when nothing came before)."""
        self.k_pool.index_copy_(1, self.new, k.to(self.k_pool.dtype))
        self.v_pool.index_copy_(1, self.new, v.to(self.v_pool.dtype))
        if not len(self.past):
            return k, v
        rows = torch.cat([self.past, self.new])
        return self.k_pool.index_select(1, rows), self.v_pool.index_select(1, rows)


@dataclass(frozen=True)
class PackedRows:
    """Where S sequences prefilled in one forward keep their KV (one per forward, shared
    by every attention block).

    table: [S, W] each sequence's rows, past then new (W = its longest, padded with row
    0); cu_q: [S + 1] offsets of each sequence's new tokens in the packed T; lens: [S]
    past + new tokens of each; new: [T] the packed tokens' rows; max_q: the longest
    sequence's new tokens (a host int).
    """

    table: torch.Tensor
    cu_q: torch.Tensor
    lens: torch.Tensor
    new: torch.Tensor
    max_q: int

    @staticmethod
    def of(rows: Sequence[torch.Tensor], new_counts: Sequence[int]) -> PackedRows:
        """The layout of sequences whose rows (past then new, [len_s] each on one device)
        end with `new_counts[s]` new tokens; no host sync (the lengths are the shapes)."""
        device = rows[0].device
        table = pad_sequence(list(rows), batch_first=True)
        offsets = [0]
        for n in new_counts:
            offsets.append(offsets[-1] + n)
        return PackedRows(
            table,
            torch.tensor(offsets, device=device),
            torch.tensor([len(r) for r in rows], device=device),
            torch.cat([r[len(r) - n :] for r, n in zip(rows, new_counts, strict=True)]),
            max(new_counts),
        )


@dataclass(frozen=True)
class PackedPrefill:
    """One attention block's KV for S sequences prefilled in one forward (see
    `PackedRows`); kernel: the kernel set's `paged_prefill_attention`."""

    k_pool: torch.Tensor
    v_pool: torch.Tensor
    rows: PackedRows
    kernel: PackedAttention

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
        window: int | None = None,
    ) -> torch.Tensor:
        """Write the packed k, v [KV, T, hd] into their rows and attend q [H, T, hd]
        causally over each sequence's own rows (the last `window` positions of each
        query with a window); returns [T, H * hd]."""
        r = self.rows
        self.k_pool.index_copy_(1, r.new, k.to(self.k_pool.dtype))
        self.v_pool.index_copy_(1, r.new, v.to(self.v_pool.dtype))
        out = self.kernel(
            q.transpose(0, 1), self.k_pool, self.v_pool, r.table, r.cu_q, r.lens, r.max_q, scale,
            **window_kwargs(window),
        )  # fmt: skip
        return out.reshape(q.shape[1], -1)


@dataclass(frozen=True)
class PagedDecode:
    """One attention block's KV for one decode step of B sequences.

    table: [B, W] rows of each sequence (its new token's row included, at column
    lens[b] - 1); lens: [B] tokens to attend over, the new one included; new: [B] the
    rows the step's k, v go to; kernel: the kernel set's `paged_decode_attention`.
    """

    k_pool: torch.Tensor
    v_pool: torch.Tensor
    table: torch.Tensor
    lens: torch.Tensor
    new: torch.Tensor
    kernel: PagedAttention

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
        window: int | None = None,
    ) -> torch.Tensor:
        self.k_pool.index_copy_(1, self.new, k.to(self.k_pool.dtype))
        self.v_pool.index_copy_(1, self.new, v.to(self.v_pool.dtype))
        out = self.kernel(
            q.transpose(0, 1), self.k_pool, self.v_pool, self.table, self.lens, scale,
            **window_kwargs(window),
        )  # fmt: skip
        return out.reshape(q.shape[1], -1)


@dataclass(frozen=True)
class BufferDecode:
    """Decode over per-sequence `KVBuffer`s: appends sequence b's k, v to `kvs[b]` and
    attends over its whole buffer (its last `window` rows with a window), one SDPA per
    sequence."""

    kvs: Sequence[KVBuffer]

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        scale: float | None,
        window: int | None = None,
    ) -> torch.Tensor:
        outs = []
        for b, kv in enumerate(self.kvs):
            kv.append(k[:, b : b + 1], v[:, b : b + 1])
            keys, values = kv.view()
            if window is not None:
                keys, values = keys[:, -window:], values[:, -window:]
            o = sdpa(
                q[None, :, b : b + 1],
                keys[None],
                values[None],
                enable_gqa=q.shape[0] != k.shape[0],
                scale=scale,
            )
            outs.append(o[0, :, 0])
        return torch.stack(outs).reshape(len(self.kvs), -1)
