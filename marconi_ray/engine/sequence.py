"""`Sequence`: one in-flight request inside a worker (its order, model state, output)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from marconi_ray.engine.model.seq_state import SeqState
from marconi_ray.engine.spec.stats import SpecStats
from marconi_ray.engine.window_rows import WindowRows
from marconi_ray.protocol.orders import PrefillOrder
from marconi_ray.protocol.results import Logprob


@dataclass
class Sequence:
    """Worker-side bookkeeping of one request, from its prefill order to `Finished`.

    Attributes:
        state_ids: depth -> store state id of every checkpoint captured so far.
        finishing: the last token is sampled; one more decode step consumes it so the
            state after the whole sequence can be checkpointed (`consumes_last`).
        prefilled: prompt tokens consumed so far (a chunked prefill advances it step by
            step; the sequence decodes once it reaches the prompt's length).
        own: the KV slot ids the worker allocated for the tokens this request computed,
            in order (positions hit_len, hit_len + 1, ...; one per consumed token past
            the hit): handed to the cache when it ends, those it keeps, or freed.
        staged: device slots holding copies of the hit's host-tier KV (freed at the end).
        reads: the hit's device slots whose rows it reads in place (`StateStore.pin_reads`
            from its start to its end: a free of them waits for it).
        window: its windowed blocks' running rows (`engine.window_rows`; empty for a
            model without such blocks): freed as the window leaves them and when it ends.
        reserved: KV rows admission set aside for it (`Worker.rows_needed`), given back
            when it ends.
        prompt_lps: prompt log-probabilities scored so far (prompt tokens 1, 2, ...; when
            its params ask for them), sent with its first token.
        matcher: its grammar's matcher (`engine.constrained`) when its params have a
            grammar, advanced by every token it samples.
        spec: its speculative tokens drafted and kept so far, by draft position.
        spec_backoff, spec_wait: its current back-off length after failed drafts and
            the steps it still waits before drafting again.
        spec_k: tokens it drafts next (0: `num_speculative_tokens`).
        draft_cursor: a stateful drafter's context for it (`engine.spec.mtp.MTPCursor`),
            made when it first drafts.
    """

    order: PrefillOrder
    state: SeqState
    generator: torch.Generator | None
    output: list[int] = field(default_factory=list)
    state_ids: dict[int, int] = field(default_factory=dict)
    first_token_at: float | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0
    finish_reason: str | None = None
    finishing: bool = False
    prefilled: int = 0
    own: list[int] = field(default_factory=list)
    staged: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    reads: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int64))
    window: WindowRows = field(default_factory=WindowRows)
    reserved: int = 0
    prompt_lps: list[Logprob] = field(default_factory=list)
    matcher: Any = None
    spec: SpecStats = field(default_factory=SpecStats)
    spec_backoff: int = 0
    spec_wait: int = 0
    spec_k: int = 0
    draft_cursor: Any = None

    def consumes_last(self) -> bool:
        """Whether its last sampled token must be consumed by one more decode step: the
        cache keeps the state after the whole sequence (`keep_final`), or the sequence
        ends exactly at one of its capture depths (a block boundary the cache keeps a
        state at, whatever made the request stop there)."""
        final = len(self.order.prompt) + len(self.output)
        return self.order.keep_final or final in self.order.capture

    @property
    def request_id(self) -> int:
        return self.order.request_id

    @property
    def started(self) -> float:
        return self.order.submitted or time.time()
