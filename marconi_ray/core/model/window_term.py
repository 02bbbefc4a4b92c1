"""`WindowTerm`: the FLOPs of attention over a sliding window, as a function of length.

Full attention's score and AV products over a from-scratch prefill of n tokens cost
`c * n * n` (the paper's non-causal count, `core.model.layers`). A sliding-window layer's
queries each see at most `window` keys, so they cost `c * n * min(n, window)`: quadratic
up to the window, linear past it. Such a term cannot be folded into a model's two
(linear, quadratic) coefficients, so the cost model carries it beside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from marconi_ray.core.model.spec_checks import require_positive


@dataclass(frozen=True)
class WindowTerm:
    """`coefficient * n * min(n, window)` FLOPs over a from-scratch prefill of n tokens.

    Attributes:
        coefficient: FLOPs per (query, key) pair, summed over the layers of this window.
        window: the keys a query sees, itself included (tokens, >= 1).
    """

    coefficient: float
    window: int

    def __post_init__(self) -> None:
        if not self.coefficient >= 0 or self.coefficient == float("inf"):
            raise ValueError(f"window coefficient must be finite and >= 0, got {self.coefficient}")
        require_positive("window", self.window)

    def pairs(self, n: int) -> int:
        """(query, key) pairs of a from-scratch prefill of n tokens: n * min(n, window)."""
        return n * min(n, self.window)

    def pairs_array(self, n: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """`pairs` of many lengths (int64, exact)."""
        out: npt.NDArray[np.int64] = n * np.minimum(n, self.window)
        return out


def group_windows(terms: list[WindowTerm]) -> tuple[WindowTerm, ...]:
    """One term per window, coefficients summed in order, windows ascending."""
    by_window: dict[int, float] = {}
    for t in terms:
        by_window[t.window] = by_window.get(t.window, 0.0) + t.coefficient
    return tuple(WindowTerm(c, w) for w, c in sorted(by_window.items()))
