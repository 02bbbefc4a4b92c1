"""Session arrival times and think-time specs.

Arrivals follow vLLM's `bench serve` convention: inter-arrival gaps are gamma-distributed
with shape ``burstiness`` and mean ``1 / rate`` (shape 1 is a Poisson process); the first
session starts at t = 0. Think time is the pause between a turn's completion and the next
turn of the same session.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

THINK_KINDS = ("trace", "fixed", "exp")
ARRIVALS = ("rate", "trace")
"""Session arrival processes: at a rate (`session_start_times`) or the trace's own clock
(`trace_start_times`)."""


def session_start_times(
    n: int, rate: float, burstiness: float, rng: np.random.Generator
) -> list[float]:
    """Start times (seconds, non-decreasing, first 0.0) of ``n`` sessions.

    Gaps are gamma(shape=burstiness, scale=1/(rate*burstiness)); ValueError naming a bad
    ``n`` (< 0), ``rate`` or ``burstiness`` (not finite and > 0).
    """
    if n < 0:
        raise ValueError(f"number of sessions must be >= 0, got {n}")
    if not math.isfinite(rate) or rate <= 0:
        raise ValueError(f"session rate must be finite and > 0, got {rate}")
    if not math.isfinite(burstiness) or burstiness <= 0:
        raise ValueError(f"burstiness must be finite and > 0, got {burstiness}")
    if n == 0:
        return []
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]


def trace_start_times(firsts: list[float], scale: float) -> list[float]:
    """Start times of sessions whose first requests arrive at `firsts` (seconds, in
    the trace's clock): their offsets from the earliest, times `scale`. ValueError
    naming a bad `scale` (not finite and > 0)."""
    if not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"time scale must be finite and > 0, got {scale}")
    if not firsts:
        return []
    origin = min(firsts)
    return [(t - origin) * scale for t in firsts]


@dataclass(frozen=True)
class ThinkTime:
    """A think-time rule: ``trace`` (the trace's gap), ``fixed`` (``value`` seconds) or
    ``exp`` (exponential with mean ``value`` seconds)."""

    kind: str
    value: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in THINK_KINDS:
            raise ValueError(f"think kind {self.kind!r} is not one of {', '.join(THINK_KINDS)}")
        if not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"think time must be finite and >= 0, got {self.value}")

    def sample(self, trace_gap: float, rng: np.random.Generator) -> float:
        """Seconds to wait before the next turn (>= 0); ``trace_gap`` is used by ``trace``."""
        if self.kind == "trace":
            return max(0.0, float(trace_gap))
        if self.kind == "fixed":
            return self.value
        return float(rng.exponential(self.value)) if self.value > 0 else 0.0


def parse_think(spec: str) -> ThinkTime:
    """Parse ``trace``, ``fixed:S`` or ``exp:MEAN``; ValueError naming a bad ``spec``."""
    text = spec.strip()
    if text == "trace":
        return ThinkTime("trace")
    kind, sep, value = text.partition(":")
    if not sep or kind not in ("fixed", "exp"):
        raise ValueError(f"think spec {spec!r} must be 'trace', 'fixed:SECONDS' or 'exp:MEAN'")
    try:
        seconds = float(value)
    except ValueError:
        raise ValueError(f"think spec {spec!r}: {value!r} is not a number") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"think spec {spec!r}: seconds must be finite and >= 0")
    return ThinkTime(kind, seconds)
