"""`StepCost`: what a verified step costs next to a plain decode step, measured as the
worker runs (exponential moving averages of both steps' seconds), so a request speculates
only while its verified steps emit more tokens than they cost (`Worker._verify`).

The ratio one rank measures is not another's: rank 0's is broadcast with the step's
accepted tokens, and every rank decides with that one value (`ratio_milli`).
"""

from __future__ import annotations

DECAY = 0.8


class StepCost:
    def __init__(self) -> None:
        self.decode_s: float | None = None
        self.verify_s: float | None = None
        self.ratio = 1.0
        """The ratio every rank decides with (rank 0's, as broadcast); 1.0 until both
        steps have been seen."""

    def observe(self, kind: str, seconds: float) -> None:
        """Fold one step's seconds (`kind`: `decode` or `verify`) into its average."""
        old = getattr(self, f"{kind}_s")
        setattr(self, f"{kind}_s", seconds if old is None else DECAY * old + (1 - DECAY) * seconds)

    def ratio_milli(self) -> int:
        """This rank's measured verify / decode ratio (>= 1), in thousandths, to broadcast."""
        if self.decode_s is None or self.verify_s is None or self.decode_s <= 0:
            return 1000
        return max(1000, round(1000 * self.verify_s / self.decode_s))
