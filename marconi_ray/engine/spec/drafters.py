"""Drafters: what a sequence's next tokens may be, proposed without the target model.

Contract: `propose(tokens, k)` returns at most k token ids (possibly none) given the
sequence so far (prompt + output); it is a pure function of its arguments and the
drafter's settings, so every tensor-parallel rank proposes the same drafts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from marconi_ray.protocol.speculative import SpeculativeConfig

Tokens = Sequence[int] | npt.NDArray[np.integer]
"""A sequence so far (prompt + output), as ids."""


class Drafter(Protocol):
    def propose(self, tokens: Tokens, k: int) -> list[int]: ...


class NgramDrafter:
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the
    sequence's last n tokens, for n from `max_n` down to `min_n` (the first n that
    occurs wins); none when no suffix recurs. Copy-heavy outputs (code edits, quoted
    context, agents repeating tool output) draft well."""

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, tokens: Tokens, k: int) -> list[int]:
        seq = np.asarray(tokens, dtype=np.int64)
        n_tokens = len(seq)
        for n in range(min(self.max_n, n_tokens - 1), self.min_n - 1, -1):
            suffix = seq[n_tokens - n :]
            # windows starting at 0 .. n_tokens - n - 1 (the suffix itself excluded)
            windows = np.lib.stride_tricks.sliding_window_view(seq[: n_tokens - 1], n)
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if len(hits):
                start = int(hits[-1]) + n
                return [int(t) for t in seq[start : start + k]]
        return []


class OracleDrafter:
    """For benchmarks and tests: drafts the true continuation of a known sequence
    (`futures`: a prefix's tuple -> the tokens that follow it, e.g. a run without
    speculation), the n-th drafted token (over all calls) correct exactly when
    floor((n + 1) * rate) > floor(n * rate), else a wrong id: a `rate` share of the drafted
    tokens is correct, spread evenly, so acceptance is forced to about `rate`."""

    def __init__(
        self, futures: Mapping[tuple[int, ...], Sequence[int]], rate: float, vocab: int
    ) -> None:
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"rate must be in [0, 1], got {rate}")
        self.futures = {tuple(p): list(f) for p, f in futures.items()}
        self.rate = rate
        self.vocab = vocab
        self.drafted = 0

    def propose(self, tokens: Tokens, k: int) -> list[int]:
        seq = tuple(int(t) for t in tokens)
        for prefix, future in self.futures.items():
            if seq[: len(prefix)] == prefix and len(seq) - len(prefix) <= len(future):
                done = len(seq) - len(prefix)
                out = []
                for t in future[done : done + k]:
                    n, self.drafted = self.drafted, self.drafted + 1
                    right = int((n + 1) * self.rate) > int(n * self.rate)
                    out.append(t if right else (t + 1) % self.vocab)
                return out
        return []


DRAFTERS: dict[str, Callable[[SpeculativeConfig], Drafter]] = {
    "ngram": lambda cfg: NgramDrafter(cfg.prompt_lookup_min, cfg.prompt_lookup_max),
}
"""Drafters a config alone builds, by `SpeculativeConfig.method` (a draft model is built
by `engine.draft_model`, which needs an engine; the oracle by benchmarks and tests)."""


def make_drafter(config: SpeculativeConfig) -> Drafter:
    """The drafter `config` names; ValueError for one a config alone cannot build."""
    if config.method not in DRAFTERS:
        raise ValueError(
            f"drafter {config.method!r} cannot be built from a config alone "
            "(a draft model: engine.draft_model.drafter_for)"
        )
    return DRAFTERS[config.method](config)
