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

Invariant (checked by `check`): `members[r].conv[i]` is `conv[i][r]` for every member
row r and SSM block i, and `len(members) <= capacity`.
"""

from __future__ import annotations

import torch

from marconi_ray.engine.model.seq_state import SeqState


class DecodeBatch:
    """Rows of decode state for at most `capacity` sequences of one model rank.

    Args:
        templates: SSM block index -> (conv, ssm) zero states of one sequence (shapes and
            dtypes of `Mixer.empty_state`).
        capacity: most members (the worker's `max_batch`).
    """

    def __init__(
        self, templates: dict[int, tuple[torch.Tensor, torch.Tensor]], capacity: int
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.conv = {i: c.new_zeros((capacity, *c.shape)) for i, (c, _) in templates.items()}
        self.ssm = {i: s.new_zeros((capacity, *s.shape)) for i, (_, s) in templates.items()}
        self.members: list[SeqState] = []

    def __len__(self) -> int:
        return len(self.members)

    def __contains__(self, state: SeqState) -> bool:
        return any(m is state for m in self.members)

    def join(self, state: SeqState) -> None:
        """Copy `state`'s SSM states into the next row; they become views of it."""
        if len(self.members) >= self.capacity:
            raise ValueError(f"decode batch is full ({self.capacity} members)")
        row = len(self.members)
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
        last = len(self.members) - 1
        moved = self.members.pop()
        if row != last:
            for i in self.conv:
                self.conv[i][row].copy_(self.conv[i][last])
                self.ssm[i][row].copy_(self.ssm[i][last])
            self.members[row] = moved
            self._bind(moved, row)

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
        for row, m in enumerate(self.members):
            for i in self.conv:
                assert m.conv[i].data_ptr() == self.conv[i][row].data_ptr()
                assert m.ssm[i].data_ptr() == self.ssm[i][row].data_ptr()
