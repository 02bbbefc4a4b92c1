"""`DecodeBatch`: persistent, preallocated SSM decode state of the running batch.

Per SSM block, conv states [capacity, C, K] (model dtype) and SSM states
[capacity, *ssm_shape] (float32) are allocated once. Row r holds the state of member r;
members stay compact (rows 0..n-1), so a decode step runs the kernels on the contiguous
views `conv[:n]`, `ssm[:n]` and updates them in place: no stacking, no copying back.
A sequence's `SeqState.conv[i]` / `ssm[i]` are views of its row while it is a member, so
checkpoints read the current values (the store copies what it keeps).

Joining copies the sequence's states into the next free row; leaving moves the last row
into the freed one and gives the leaving sequence its own copy. That is one copy per
join or leave, none per step; the fixed shapes leave room for CUDA graphs of the step.

With a KV pool (`pool`, the serving path) the batch also keeps the members' KV row
table on the device: `table[r, :lens[r]]` are member r's pool rows, oldest token first
(a hit's cached rows, then one per token it consumed), widened by doubling. Each step,
`extend` writes every member's new row at column `lens[r]`, one scatter for the batch;
`decode_kv` hands the attention layers that table (one attention call per layer), and
`advance` counts the token in. Without a pool the members' KV stays in their own
`KVBuffer`s (`SeqState.kv`), one attention call per sequence.

With a window pool (`window_pool`, for the sliding-window blocks `window_blocks`) the
batch keeps a second table, `window_table`, of the members' rows there
(`SeqState.window_rows`), extended in the same step; each block reads the table of its
pool.

Invariant (checked by `check`): `members[r].conv[i]` is `conv[i][r]` for every member
row r and SSM block i, `len(members) <= capacity`, and with a pool `lens[r]` is
`members[r].length` and a member's own `rows` (and `window_rows`) is None (its rows are
the tables').
"""

from __future__ import annotations

import torch

from marconi_ray.engine.model.paged_kv import KVRows, PagedAttention, PagedDecode
from marconi_ray.engine.model.seq_state import SeqState

MIN_TABLE_WIDTH = 64
"""Columns of a new row table (it doubles as members grow past it)."""


class DecodeBatch:
    """Rows of decode state for at most `capacity` sequences of one model rank.

    Args:
        templates: SSM block index -> (conv, ssm) zero states of one sequence (shapes and
            dtypes of `Mixer.empty_state`).
        capacity: most members (the worker's `max_batch`).
        pool: the KV pool the members' rows index (None: members keep `KVBuffer`s).
        device: where the row table lives (the pool's device).
        window_pool: the pool of the blocks in `window_blocks` (None: one pool for all).
        window_blocks: the attention blocks whose KV is in `window_pool`.
    """

    def __init__(
        self,
        templates: dict[int, tuple[torch.Tensor, torch.Tensor]],
        capacity: int,
        pool: KVRows | None = None,
        device: torch.device | str = "cpu",
        window_pool: KVRows | None = None,
        window_blocks: tuple[int, ...] = (),
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.conv = {i: c.new_zeros((capacity, *c.shape)) for i, (c, _) in templates.items()}
        self.ssm = {i: s.new_zeros((capacity, *s.shape)) for i, (_, s) in templates.items()}
        self.members: list[SeqState] = []
        self.pool = pool
        self.table = torch.zeros((capacity, MIN_TABLE_WIDTH), dtype=torch.long, device=device)
        """[capacity, width] pool rows of each member (with a pool)."""
        self.lens = torch.zeros(capacity, dtype=torch.long, device=device)
        """[capacity] tokens each member has consumed (with a pool)."""
        if window_pool is not None and pool is None:
            raise ValueError("a window pool needs a pool for the other blocks")
        self.window_pool = window_pool
        self.window_blocks = frozenset(window_blocks) if window_pool is not None else frozenset()
        self.window_table = torch.zeros_like(self.table)
        """[capacity, width] window-pool rows of each member (with a window pool)."""
        self._step: tuple[torch.Tensor, torch.Tensor, int] | None = None
        """(new rows [n], tokens attended over [n], width) of the step `extend` prepared."""
        self._window_new: torch.Tensor | None = None
        """The step's new window rows [n] (with a window pool)."""

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, state: SeqState) -> bool:
        return any(m is state for m in self.members)

    def join(self, state: SeqState) -> None:
        """Copy `state`'s SSM states into the next row; they become views of it."""
        if len(self.members) >= self.capacity:
            raise ValueError(f"decode batch is full ({self.capacity} members)")
        row = len(self.members)
        if self.pool is not None:
            if state.rows is None or len(state.rows) != state.length:
                have = None if state.rows is None else len(state.rows)
                raise ValueError(f"a pooled member needs {state.length} KV rows, got {have}")
            self._widen(state.length + 1)
            self.table[row, : state.length] = state.rows
            self.lens[row] = state.length
            state.rows = None
            if self.window_pool is not None:
                if state.window_rows is None or len(state.window_rows) != state.length:
                    raise ValueError(f"a member needs {state.length} window rows")
                self.window_table[row, : state.length] = state.window_rows
                state.window_rows = None
        for i in self.conv:
            self.conv[i][row].copy_(state.conv[i])
            self.ssm[i][row].copy_(state.ssm[i])
        self.members.append(state)
        self._bind(state, row)

    def leave(self, state: SeqState) -> None:
        """Give `state` its own copy of its row; the last member moves into that row."""
        row = next(r for r, m in enumerate(self.members) if m is state)
        state.conv = {i: t[row].clone() for i, t in self.conv.items()}
        state.ssm = {i: t[row].clone() for i, t in self.ssm.items()}
        if self.pool is not None:
            state.rows = self.table[row, : state.length].clone()
        if self.window_pool is not None:
            state.window_rows = self.window_table[row, : state.length].clone()
        last = len(self.members) - 1
        moved = self.members.pop()
        self._step = None
        self._window_new = None
        if row != last:
            for i in self.conv:
                self.conv[i][row].copy_(self.conv[i][last])
                self.ssm[i][row].copy_(self.ssm[i][last])
            self.table[row] = self.table[last]
            self.window_table[row] = self.window_table[last]
            self.lens[row] = self.lens[last]
            self.members[row] = moved
            self._bind(moved, row)

    # ------------------------------------------------------------------ KV rows
    def extend(self, new_rows: torch.Tensor, new_window_rows: torch.Tensor | None = None) -> None:
        """Give every member (in row order) its row for the next token, `new_rows` [n] on
        the table's device: written at column `lens[r]` in one scatter (and its window
        row, `new_window_rows` [n], which a batch with a window pool needs)."""
        n = len(self.members)
        if self.pool is None:
            raise ValueError("this decode batch has no KV pool")
        if new_rows.shape != (n,):
            raise ValueError(f"need one new row per member ({n}), got {tuple(new_rows.shape)}")
        if (self.window_pool is None) != (new_window_rows is None):
            raise ValueError("new window rows go with a window pool, and only with one")
        if new_window_rows is not None and new_window_rows.shape != (n,):
            raise ValueError(f"need one new window row per member ({n})")
        width = max(m.length for m in self.members) + 1
        self._widen(width)
        members = torch.arange(n, device=self.table.device)
        self.table.index_put_((members, self.lens[:n]), new_rows)
        if new_window_rows is not None:
            self.window_table.index_put_((members, self.lens[:n]), new_window_rows)
        self._window_new = new_window_rows
        self._step = (new_rows, self.lens[:n] + 1, width)

    def decode_kv(self, i: int, kernel: PagedAttention) -> PagedDecode:
        """Attention block i's view of the step `extend` prepared."""
        if self.pool is None or self._step is None:
            raise ValueError("call extend(new_rows) before a pooled decode step")
        new, lens, width = self._step
        n = len(self.members)
        if i in self.window_blocks:
            assert self.window_pool is not None and self._window_new is not None
            k, v = self.window_pool.k[i], self.window_pool.v[i]
            table = self.window_table[:n, :width]
            return PagedDecode(k, v, table, lens, self._window_new, kernel)
        k, v = self.pool.k[i], self.pool.v[i]
        return PagedDecode(k, v, self.table[:n, :width], lens, new, kernel)

    def window_step_rows(self) -> torch.Tensor | None:
        """The new window rows [n] of the step `extend` prepared (None without a window
        pool)."""
        return self._window_new

    def step_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(new rows [n], tokens attended over [n]) of the step `extend` prepared."""
        if self._step is None:
            raise ValueError("call extend(new_rows) before a pooled decode step")
        new, lens, _ = self._step
        return new, lens

    def positions(self) -> torch.Tensor:
        """[n] the position of each member's next token (its length), on the device."""
        return self.lens[: len(self.members)]

    def advance(self) -> None:
        """Count the step's token in: every member's length grows by one."""
        self.lens[: len(self.members)] += 1
        self._step = None
        self._window_new = None

    def _widen(self, width: int) -> None:
        if width > self.table.shape[1]:
            size = (self.capacity, max(width, 2 * self.table.shape[1]))
            for name in ("table", "window_table"):
                old = getattr(self, name)
                grown = old.new_zeros(size)
                grown[:, : old.shape[1]] = old
                setattr(self, name, grown)

    def rows(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv [n, C, K], ssm [n, ...]) views of SSM block i's member rows."""
        n = len(self.members)
        return self.conv[i][:n], self.ssm[i][:n]

    def _bind(self, state: SeqState, row: int) -> None:
        state.conv = {i: t[row] for i, t in self.conv.items()}
        state.ssm = {i: t[row] for i, t in self.ssm.items()}

    def check(self) -> None:
        """Assert the invariant of the module docstring."""
        assert len(self.members) <= self.capacity
        if self.pool is not None:
            lens = self.lens[: len(self.members)].tolist()
            assert lens == [m.length for m in self.members], (lens, "member lengths")
            assert all(m.rows is None and m.window_rows is None for m in self.members)
        for row, m in enumerate(self.members):
            for i in self.conv:
                assert m.conv[i].data_ptr() == self.conv[i][row].data_ptr()
                assert m.ssm[i].data_ptr() == self.ssm[i][row].data_ptr()
