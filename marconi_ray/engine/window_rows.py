"""`WindowRows`: the running KV rows of one sequence's sliding-window blocks
(`HybridModel.window_blocks`, W = `window_state`), in the store's window pool.

Those blocks need only the KV of a sequence's last W positions: the next token attends to its
last W - 1 and itself, and a checkpoint at the current depth keeps the last W
(`StateStore.put_state`). So the worker allocates one window row per token as it is
computed (the store's `window_kv`, beside the token slots of the other blocks) and
frees the rows the window has left (`slide`): a sequence holds at most W rows plus the
tokens of one forward, however long it grows. Its row list (`SeqState.window_rows`, a
decode batch's `window_table`) keeps the freed rows' old indices at the
positions the window hides; every attention kernel attends only the window (the Triton
ones do not read them; the references gather and mask them), so they are never keys.

Invariant: `rows` are the store rows of positions [start, start + len(rows)), each held
by this sequence alone, and every row is given back exactly once (`slide`, `cut`,
`take_all`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Rows = npt.NDArray[np.int64]


@dataclass
class WindowRows:
    """Positions [start, start + len(rows)) of a sequence and their window rows."""

    start: int = 0
    rows: list[int] = field(default_factory=list)

    @property
    def end(self) -> int:
        """The position after the last one held."""
        return self.start + len(self.rows)

    def add(self, rows: Rows, at: int) -> None:
        """Hold `rows` for positions [at, at + len(rows)): the next ones (ValueError
        otherwise), or the first ones of an empty holding."""
        if self.rows and at != self.end:
            raise ValueError(f"window rows added at position {at}, the next is {self.end}")
        if not self.rows:
            self.start = at
        self.rows.extend(np.asarray(rows, dtype=np.int64).tolist())

    def slide(self, length: int, window: int) -> Rows:
        """Stop holding the positions before `length - window` (the window of a
        sequence `length` tokens long); returns their rows, to free."""
        drop = min(len(self.rows), max(0, length - window - self.start))
        out = np.asarray(self.rows[:drop], dtype=np.int64)
        del self.rows[:drop]
        self.start += drop
        return out

    def cut(self, end: int) -> Rows:
        """Stop holding the positions from `end` on (rejected speculative drafts);
        returns their rows, to free."""
        keep = min(len(self.rows), max(0, end - self.start))
        out = np.asarray(self.rows[keep:], dtype=np.int64)
        del self.rows[keep:]
        return out

    def at(self, depth: int, window: int) -> Rows:
        """The rows of a checkpoint at `depth`: positions [depth - m, depth), m =
        min(depth, window) (AssertionError when they are not all held)."""
        first = max(0, depth - window)
        assert self.start <= first and depth <= self.end, (self.start, self.end, depth)
        return np.asarray(self.rows[first - self.start : depth - self.start], dtype=np.int64)

    def take_all(self) -> Rows:
        """Every row held (to free); the holding is empty after."""
        out = np.asarray(self.rows, dtype=np.int64)
        self.rows = []
        return out
