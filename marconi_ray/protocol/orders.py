"""The messages between the cache side (planner / coordinator) and the tensor side
(worker / TP shards). Plain frozen dataclasses of numpy arrays and ints: they pickle for
Ray and carry no torch tensors, so tensors never leave the worker that made them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from marconi_ray.protocol.results import Logprob, SpecCounts, Timings
from marconi_ray.protocol.sampling import SamplingParams

Slots = npt.NDArray[np.int64]

DEFAULT_MAX_BATCH_TOKENS = 2048
"""Tokens one worker step processes at most by default: its decode rows plus a chunk of a
long prompt's prefill (chunked prefill)."""


def no_slots() -> Slots:
    return np.empty(0, dtype=np.int64)


@dataclass(frozen=True)
class PrefillOrder:
    """What the cache decided for one request: everything a worker needs to run it.

    Attributes:
        hit_len: prompt tokens served from the cache; `hit_state` is the state id at that
            depth (-1 when 0) and `hit_slots` the KV slot ids of `prompt[:hit_len]`.
        checkpoints: prefill depths in (hit_len, len(prompt)] whose states to keep.
        capture: decode depths whose states to keep if decoding reaches them.
        keep_final: keep the state after the whole sequence (prompt + output); the worker
            then consumes the last sampled token in one more decode step.
        max_new: tokens to generate at most (already capped by the context limit).
        submitted: wall-clock `time.time()` when the request arrived (TTFT is measured
            from it, also by a worker in another process).
    """

    request_id: int
    prompt: npt.NDArray[np.int32]
    params: SamplingParams
    max_new: int
    hit_len: int = 0
    hit_state: int = -1
    hit_slots: Slots = field(default_factory=no_slots)
    checkpoints: tuple[int, ...] = ()
    capture: tuple[int, ...] = ()
    keep_final: bool = False
    submitted: float = 0.0


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of a request; `finished` on its last one.

    Attributes:
        logprob: the token's `Logprob` when the request asked for `logprobs`.
        prompt_logprobs: on a request's first event when it asked for `prompt_logprobs`:
            one entry per prompt token, None for the first (nothing predicts it).
    """

    request_id: int
    token: int
    finished: bool
    logprob: Logprob | None = None
    prompt_logprobs: tuple[Logprob | None, ...] = ()


@dataclass(frozen=True)
class Finished:
    """A request the worker has finished, ready for the cache's commit.

    Attributes:
        state_ids: depth -> worker state id of every state captured for it.
        kv_slots: slot ids now holding the KV of positions [hit_len, hit_len + len).
        spec: tokens drafted for it and drafts kept (speculative decoding).
    """

    request_id: int
    tokens: tuple[int, ...]
    finish_reason: str
    state_ids: dict[int, int]
    kv_slots: Slots
    timings: Timings
    spec: SpecCounts = field(default_factory=SpecCounts)

    def stored(self) -> Release:
        """Everything the request stored (to free when the cache keeps none of it)."""
        return Release(tuple(self.state_ids.values()), self.kv_slots)


@dataclass(frozen=True)
class Move:
    """State ids and KV slots to copy to the other tier of a two-tier cache: to the host
    (`to_host`, a demotion) or back to the device (a promotion). The ids stay the same;
    only where their tensors live changes."""

    to_host: bool
    states: tuple[int, ...] = ()
    slots: Slots = field(default_factory=no_slots)


@dataclass(frozen=True)
class Release:
    """What the worker's store must do after cache mutations: first every move of
    `moves`, in order, then free `states` and `slots` (evicted, rejected or unused).
    An id may be moved and then freed; a freed id is never moved after.

    `settled`: (request id, taken) for each plan this release closes (a commit or the
    abort of an open plan). `taken` is True when the cache took charge of what the
    request stored (a commit, or an abort that carried its `Finished`: what the cache
    keeps none of is in `states` / `slots`), False when the cache never learned it (an
    abort, an expired lease): the replica, if it still holds the request's `Finished`
    waiting for a relayed commit, frees it itself. The store ignores it."""

    states: tuple[int, ...] = ()
    slots: Slots = field(default_factory=no_slots)
    moves: tuple[Move, ...] = ()
    settled: tuple[tuple[int, bool], ...] = ()

    def __add__(self, other: Release) -> Release:
        return Release(
            self.states + other.states,
            np.concatenate([self.slots, other.slots]),
            self.moves + other.moves,
            self.settled + other.settled,
        )

    def settling(self, request_id: int, taken: bool) -> Release:
        """This release, also closing the plan of `request_id` (see `settled`)."""
        return Release(self.states, self.slots, self.moves, (*self.settled, (request_id, taken)))

    def for_store(self) -> Release:
        """The store's part: this release without `settled`."""
        return Release(self.states, self.slots, self.moves) if self.settled else self

    def without(self, states: set[int], slots: set[int]) -> Release:
        """This release less the state ids in `states` and the KV slots in `slots` (what
        a tree still refers to must not be freed)."""
        kv = np.asarray(self.slots, dtype=np.int64)
        keep = ~np.isin(kv, np.fromiter(slots, dtype=np.int64, count=len(slots)))
        kept = tuple(s for s in self.states if s not in states)
        return Release(kept, kv[keep], self.moves, self.settled)


@dataclass(frozen=True)
class StepInput:
    """Everything a replica asks of its worker(s) for one step, in one call.

    Applied in this order: free `release`, start `start` (each prefilled, or queued for a
    chunked prefill), finish `stop` early (a request still prefilling is cancelled
    instead: it has no output to keep), cancel `cancel`, then one step: the decode batch,
    plus a chunk of a long prompt's prefill unless this step started requests (their
    first tokens then leave after their own prefills, not after a chunk as well). A
    start that fails is reported, not raised, so one bad request does not fail others.
    """

    release: Release = field(default_factory=Release)
    start: tuple[PrefillOrder, ...] = ()
    stop: tuple[int, ...] = ()
    cancel: tuple[int, ...] = ()


@dataclass(frozen=True)
class StepOutput:
    """What one step produced: the step's token events (every request's, in one batch),
    the requests that finished (ready to commit), starts that failed (request id,
    message), stops that became cancellations (their plans must be aborted) and what the
    store refused of the step's release (`Worker.release`: the replica must reconcile)."""

    events: tuple[TokenEvent, ...] = ()
    finished: tuple[Finished, ...] = ()
    failed: tuple[tuple[int, str], ...] = ()
    cancelled: tuple[int, ...] = ()
    refused: tuple[str, ...] = ()
