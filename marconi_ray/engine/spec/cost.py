"""`StepCost`: whether speculation pays on this worker, measured as it runs.

It keeps the tokens per second of decode steps with verification and without (moving
averages). After each verified step rank 0's verdict (`verdict`: the verified steps'
rate is at least the plain steps') is broadcast with the accepted tokens, and every rank
`adopt`s it: a losing verdict pauses all drafting for 2, 4, ... up to `limit` steps
(plain steps, which keep the plain rate measured), a winning one ends the pause. So
speculation that does not pay on this hardware, this model or this load costs a few
verified steps, not a fraction of every step; and the ranks, deciding on rank 0's
verdict, take the same steps.
"""

from __future__ import annotations

DECAY = 0.8


class StepCost:
    def __init__(self) -> None:
        self.plain_rate: float | None = None
        """Tokens per second of steps without verification (None: none timed yet)."""
        self.spec_rate: float | None = None
        """Tokens per second of steps with verification."""
        self.pause = 0
        self.window = 0

    def observe(self, tokens: int, seconds: float, verified: bool) -> None:
        """Fold one decode step (`tokens` made in `seconds`) into its kind's rate."""
        if seconds <= 0 or tokens <= 0:
            return
        rate = tokens / seconds
        name = "spec_rate" if verified else "plain_rate"
        old = getattr(self, name)
        setattr(self, name, rate if old is None else DECAY * old + (1 - DECAY) * rate)

    def may_draft(self) -> bool:
        """Whether this step may draft: a plain step has been timed (what speculation
        must beat) and no pause is running (which this step then counts down)."""
        if self.plain_rate is None:
            return False
        if self.pause > 0:
            self.pause -= 1
            return False
        return True

    def verdict(self) -> int:
        """1 when verified steps make tokens at least as fast as plain ones (or one of
        the two is not timed yet), else 0: this rank's, to broadcast."""
        if self.plain_rate is None or self.spec_rate is None:
            return 1
        return int(self.spec_rate >= self.plain_rate)

    def adopt(self, verdict: int, limit: int) -> None:
        """Apply the broadcast verdict: a loss pauses drafting for the next window
        (doubling from 2, at most `limit` steps), a win ends it."""
        if verdict:
            self.window = 0
            return
        self.window = min(max(2, 2 * self.window), limit)
        self.pause = self.window
