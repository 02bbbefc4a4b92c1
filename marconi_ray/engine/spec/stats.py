"""`SpecStats`: speculative decoding totals (a request's, a worker's), for its result and
its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from marconi_ray.protocol.results import SpecCounts


@dataclass
class SpecStats:
    """Drafted and kept tokens so far, and per draft position j (0: the first draft of a
    step) how often a draft was proposed there and kept there (acceptance by position:
    `kept_at[j] / drafted_at[j]`). Invariant: `accepted == sum(kept_at)`, `drafted ==
    sum(drafted_at)`, and `kept_at[j] <= drafted_at[j]`."""

    drafted: int = 0
    accepted: int = 0
    steps: int = 0
    drafted_at: list[int] = field(default_factory=list)
    kept_at: list[int] = field(default_factory=list)

    def record(self, drafted: int, kept: int) -> None:
        """One sequence's verified step: `drafted` drafts, the first `kept` kept."""
        grow = drafted - len(self.drafted_at)
        if grow > 0:
            self.drafted_at += [0] * grow
            self.kept_at += [0] * grow
        for j in range(drafted):
            self.drafted_at[j] += 1
            self.kept_at[j] += j < kept
        self.drafted += drafted
        self.accepted += kept
        self.steps += 1

    def counts(self) -> SpecCounts:
        """The totals as the protocol carries them."""
        return SpecCounts(self.drafted, self.accepted, tuple(self.drafted_at), tuple(self.kept_at))
