"""Bootstrap tuning of alpha (Marconi section 4.2), plus optional periodic re-tuning.

Protocol, driven by whoever serves requests (the replay loop, the live tuner actor):
- alpha = 0 until the cache's first eviction; then a snapshot of the cache is taken and
  the next `multiplier x (requests before the first eviction)` requests are recorded.
- When the window is full, `after_request` returns a `TuneJob`: replay the window from
  the snapshot once per alpha on the grid (through any parallel `map`), pick the alpha
  with the best objective (ties: the smallest alpha) and `adopt` it. When the cache's
  admission policy has a `speculate` knob (`marconi+`), every alpha is replayed with
  speculation on and off, and the pair that scores best is adopted (ties: off). The
  knob starts on (until the cache is first full, a speculative state costs nothing) and
  is off while the first window is recorded (bytes are scarce from then on, and whether
  speculation pays is not known yet).
- With `retune_every = k`, a new snapshot is taken at adoption and the next k requests
  form the next window, forever.
Snapshots are `cache_codec.snapshot` bytes (msgpack, no pickle); `BootstrapTuner.to_record`
gives the tuner itself as a plain structure for the coordinator's journal.
The grid evaluation is a pure function of the job, so serial, process-pool and Ray maps
give the same answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache import cache_codec
from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.core.wire import (
    SCHEMA_VERSION,
    Fields,
    Record,
    check_float,
    check_header,
    decode_array,
    encode_array,
)

OBJECTIVES = ("token_hit_rate", "flops_saved")


class RequestLike(Protocol):
    @property
    def input_tokens(self) -> npt.NDArray[np.int32]: ...

    @property
    def output_tokens(self) -> npt.NDArray[np.int32]: ...


MapFn = Callable[
    [Callable[["AlphaTask"], list[float]], Iterable["AlphaTask"]], Iterable[list[float]]
]


def default_grid() -> tuple[float, ...]:
    """0.0, 0.1, ..., 2.0 (21 values, rounded so they print cleanly)."""
    return tuple(round(0.1 * i, 1) for i in range(21))


@dataclass(frozen=True)
class TunerConfig:
    """Attributes:
    multiplier: window = multiplier x requests seen before the first eviction.
    grid: candidate alphas.
    objective: `token_hit_rate` (paper) or `flops_saved` (artifact).
    retune_every: re-tune on each following window of this many requests (None: once).
    """

    multiplier: int = 5
    grid: tuple[float, ...] = field(default_factory=default_grid)
    objective: str = "token_hit_rate"
    retune_every: int | None = None

    def __post_init__(self) -> None:
        if self.multiplier <= 0:
            raise ValueError(f"multiplier must be > 0, got {self.multiplier}")
        if not self.grid:
            raise ValueError("the alpha grid is empty")
        if any(not np.isfinite(a) or a < 0 for a in self.grid):
            raise ValueError(f"alpha grid values must be finite and >= 0, got {self.grid}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; choose from {OBJECTIVES}")
        if self.retune_every is not None and self.retune_every <= 0:
            raise ValueError(f"retune_every must be > 0, got {self.retune_every}")


Knob = bool | None
"""A `speculate` setting of the admission policy (None: the policy has no knob)."""


@dataclass(frozen=True)
class AlphaTask:
    """A share of the grid: replay `window` from `snapshot` once per alpha in `alphas`,
    with the admission policy's `speculate` knob at `speculate[i]` for `alphas[i]` (empty:
    leave the policy as the snapshot has it)."""

    snapshot: bytes
    window: tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]], ...]
    alphas: tuple[float, ...]
    objective: str
    speculate: tuple[Knob, ...] = ()


@dataclass(frozen=True)
class TuneJob:
    snapshot: bytes
    window: tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]], ...]
    grid: tuple[float, ...]
    objective: str
    start_request: int
    knobs: tuple[Knob, ...] = (None,)
    """`speculate` values to try with every alpha ((None,): the policy has no knob)."""

    @property
    def settings(self) -> list[tuple[float, Knob]]:
        """(alpha, knob) pairs in evaluation order: the grid once per knob value."""
        return [(alpha, knob) for knob in self.knobs for alpha in self.grid]

    def tasks(self, n_tasks: int | None = None) -> list[AlphaTask]:
        """Split the settings into `n_tasks` interleaved shares (None: one per setting).

        Fewer tasks than settings send the window to each worker fewer times; task i
        holds settings[i::n_tasks].
        """
        settings = self.settings
        n = len(settings) if n_tasks is None else max(1, min(n_tasks, len(settings)))
        tasks = []
        for i in range(n):
            share = settings[i::n]
            knobs = tuple(k for _, k in share) if self.knobs != (None,) else ()
            tasks.append(
                AlphaTask(
                    self.snapshot, self.window, tuple(a for a, _ in share), self.objective, knobs
                )
            )
        return tasks


@dataclass(frozen=True)
class TuneResult:
    """The winner of a grid search: `best_alpha` (and `best_speculate`, None without a
    knob); `scores` are (alpha, score) with the winning knob, `knob_scores` (alpha, knob,
    score) for every setting when there was a knob."""

    best_alpha: float
    scores: tuple[tuple[float, float], ...]
    window_requests: int
    start_request: int
    wall_s: float
    best_speculate: Knob = None
    knob_scores: tuple[tuple[float, bool, float], ...] = ()


def evaluate_alphas(task: AlphaTask) -> list[float]:
    """Objective of replaying the task's window from its snapshot, per alpha (and knob)."""
    knobs: Sequence[Knob] = task.speculate or [None] * len(task.alphas)
    return [
        _evaluate(task.snapshot, task.window, alpha, task.objective, knob)
        for alpha, knob in zip(task.alphas, knobs, strict=True)
    ]


def _evaluate(
    snapshot: bytes,
    window: Sequence[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]],
    alpha: float,
    objective: str,
    knob: Knob = None,
) -> float:
    cache = cache_codec.restore(snapshot)
    cache.set_alpha(alpha)
    if knob is not None:
        cache.set_speculate(knob)
    before_hit, before_in = cache.stats.hit_tokens, cache.stats.input_tokens
    before_saved = cache.stats.flops_saved
    for inp, out in window:
        cache.serve(inp, out)
    if objective == "flops_saved":
        return cache.stats.flops_saved - before_saved
    n_in = cache.stats.input_tokens - before_in
    return (cache.stats.hit_tokens - before_hit) / n_in if n_in else 0.0


def pick_best(grid: Sequence[float], scores: Sequence[float]) -> float:
    """Highest score; ties go to the smallest alpha."""
    best = max(scores)
    return min(a for a, s in zip(grid, scores, strict=True) if s == best)


def run_grid(job: TuneJob, map_fn: MapFn = map, n_tasks: int | None = None) -> TuneResult:
    """Evaluate every alpha of the job through `map_fn` and pick the winner.

    Args:
        map_fn: `map`, a process pool's `map`, or a Ray-backed map.
        n_tasks: how many shares to split the grid into (see `TuneJob.tasks`); set it
            to the number of workers so the window travels to each worker once.
    """
    start = time.perf_counter()
    tasks = job.tasks(n_tasks)
    settings = job.settings
    scores = [0.0] * len(settings)
    for i, share in enumerate(map_fn(evaluate_alphas, tasks)):
        scores[i :: len(tasks)] = share
    if job.knobs == (None,):
        best = pick_best(job.grid, scores)
        return TuneResult(
            best,
            tuple(zip(job.grid, scores, strict=True)),
            len(job.window),
            job.start_request,
            time.perf_counter() - start,
        )
    top = max(scores)  # ties: knob off before on, then the smallest alpha
    alpha, knob = min(
        (s for s, v in zip(settings, scores, strict=True) if v == top),
        key=lambda s: (bool(s[1]), s[0]),
    )
    return TuneResult(
        alpha,
        tuple((a, v) for (a, k), v in zip(settings, scores, strict=True) if k == knob),
        len(job.window),
        job.start_request,
        time.perf_counter() - start,
        knob,
        tuple((a, bool(k), v) for (a, k), v in zip(settings, scores, strict=True)),
    )


class BootstrapTuner:
    """State machine over served requests; see the module docstring."""

    def __init__(self, config: TunerConfig) -> None:
        self.config = config
        self.seen = 0
        self.window_target = 0
        self.window_start = 0
        self.snapshot: bytes | None = None
        self.window: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]] = []
        self.history: list[TuneResult] = []
        self.done = False
        self.pending = False

    @property
    def phase(self) -> str:
        if self.done:
            return "done"
        if self.pending:
            return "tuning"
        return "waiting" if self.snapshot is None else "recording"

    def after_request(self, cache: PrefixCache, request: RequestLike) -> TuneJob | None:
        """Feed one served request; return a job when a window is complete."""
        self.seen += 1
        if self.done or self.pending:
            return None
        if self.snapshot is None:
            if cache.stats.evictions > 0:
                if cache.admission.tunable:
                    cache.set_speculate(False)  # full now: speculate only once it pays
                self._open_window(cache, self.config.multiplier * self.seen)
            return None
        self.window.append((request.input_tokens, request.output_tokens))
        if len(self.window) < self.window_target:
            return None
        self.pending = True
        return self.pending_job(cache)

    def pending_job(self, cache: PrefixCache) -> TuneJob | None:
        """The job of the window that waits for `adopt` (None when none waits). The
        window and its snapshot are kept until the result is adopted, so a job lost on
        its way (the tuner actor died, a coordinator restarted) can be sent again and
        gives the same result."""
        if not self.pending or self.snapshot is None:
            return None
        return TuneJob(
            self.snapshot,
            tuple(self.window),
            self.config.grid,
            self.config.objective,
            self.window_start,
            (True, False) if cache.admission.tunable else (None,),
        )

    def expects(self, result: TuneResult) -> bool:
        """Whether `result` answers the window that waits (a repeated or stale result,
        e.g. of a job sent twice, does not)."""
        return self.pending and result.start_request == self.window_start

    def adopt(self, result: TuneResult, cache: PrefixCache) -> None:
        """Apply a finished grid search to the live cache and arm the next window."""
        cache.set_alpha(result.best_alpha)
        if result.best_speculate is not None:
            cache.set_speculate(result.best_speculate)
        self.history.append(result)
        self.pending = False
        self.snapshot, self.window = None, []
        if self.config.retune_every is None:
            self.done = True
        else:
            self._open_window(cache, self.config.retune_every)

    def _open_window(self, cache: PrefixCache, size: int) -> None:
        self.snapshot = cache_codec.snapshot(cache)
        self.window_target = size
        self.window_start = self.seen
        self.window = []

    # ------------------------------------------------------------------ state
    def to_record(self) -> Record:
        """The tuner as a plain structure (`cache_codec` conventions): its config, counters,
        the window's snapshot (bytes) and requests (int32 arrays), its history."""
        config = self.config
        return {
            "kind": TUNER_KIND,
            "version": SCHEMA_VERSION,
            "config": {
                "multiplier": int(config.multiplier),
                "grid": [float(a) for a in config.grid],
                "objective": str(config.objective),
                "retune_every": None if config.retune_every is None else int(config.retune_every),
            },
            "seen": int(self.seen),
            "window_target": int(self.window_target),
            "window_start": int(self.window_start),
            "snapshot": self.snapshot,
            "window": [
                [encode_array(inp, "<i4"), encode_array(out, "<i4")] for inp, out in self.window
            ],
            "history": [result_record(r) for r in self.history],
            "done": bool(self.done),
            "pending": bool(self.pending),
        }

    @classmethod
    def from_record(cls, state: object) -> BootstrapTuner:
        """Validate a `to_record` structure and rebuild the tuner; ValueError if malformed.

        The snapshot bytes are checked when a job replays them (`cache_codec.restore`).
        A tuner restored while `pending` waits for `adopt`, as the original did, and keeps
        the window its job replays (`pending_job`).
        """
        top = check_header(state, "tuner", TUNER_KIND, _TUNER_KEYS)
        tuner = cls(_tuner_config_from(top.get("config")))
        tuner.seen = top.get_int("seen", 0)
        tuner.window_target = top.get_int("window_target", 0)
        tuner.window_start = top.get_int("window_start", 0)
        snapshot = top.get("snapshot")
        tuner.snapshot = None if snapshot is None else top.get_bytes("snapshot")
        tuner.window = [_window_item(item, i) for i, item in enumerate(top.get_list("window"))]
        tuner.history = [
            result_from(obj, f"tuner.history[{i}]") for i, obj in enumerate(top.get_list("history"))
        ]
        tuner.done = top.get_bool("done")
        tuner.pending = top.get_bool("pending")
        if tuner.snapshot is None and tuner.window:
            raise ValueError("tuner: a window is recorded without its snapshot")
        if tuner.pending and tuner.done:
            raise ValueError("tuner: pending together with done")
        if tuner.pending and tuner.snapshot is not None and len(tuner.window) < tuner.window_target:
            raise ValueError("tuner: pending while its window is still being recorded")
        return tuner


TUNER_KIND = "bootstrap_tuner"
_TUNER_KEYS = (
    "kind",
    "version",
    "config",
    "seen",
    "window_target",
    "window_start",
    "snapshot",
    "window",
    "history",
    "done",
    "pending",
)
_CONFIG_KEYS = ("multiplier", "grid", "objective", "retune_every")
_RESULT_KEYS = (
    "best_alpha",
    "scores",
    "window_requests",
    "start_request",
    "wall_s",
    "best_speculate",
    "knob_scores",
)


def _tuner_config_from(obj: object) -> TunerConfig:
    fields = Fields(obj, "tuner.config", _CONFIG_KEYS)
    grid = tuple(
        check_float(a, f"tuner.config.grid[{i}]") for i, a in enumerate(fields.get_list("grid"))
    )
    retune = fields.get("retune_every")
    return TunerConfig(
        multiplier=fields.get_int("multiplier"),
        grid=grid,
        objective=fields.get_str("objective"),
        retune_every=None if retune is None else fields.get_int("retune_every"),
    )


def _window_item(item: Any, i: int) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    where = f"tuner.window[{i}]"
    if not isinstance(item, list) or len(item) != 2:
        raise ValueError(f"{where}: expected an [input, output] pair")
    inp = decode_array(item[0], "<i4", f"{where}[0]")
    out = decode_array(item[1], "<i4", f"{where}[1]")
    if not len(inp) or min(inp.min(), out.min(initial=0)) < 0:
        raise ValueError(f"{where}: tokens must be >= 0 and the input non-empty")
    return inp, out


def result_record(r: TuneResult) -> Record:
    """A `TuneResult` as a plain structure (journal and tuner records)."""
    return {
        "best_alpha": float(r.best_alpha),
        "scores": [[float(alpha), float(score)] for alpha, score in r.scores],
        "window_requests": int(r.window_requests),
        "start_request": int(r.start_request),
        "wall_s": float(r.wall_s),
        "best_speculate": None if r.best_speculate is None else bool(r.best_speculate),
        "knob_scores": [[float(a), bool(k), float(v)] for a, k, v in r.knob_scores],
    }


def result_from(obj: object, path: str) -> TuneResult:
    """Validate a `result_record` structure (records from before the speculate knob lack
    its two keys) and rebuild the result; ValueError naming `path` if malformed."""
    if isinstance(obj, dict):
        obj = {"best_speculate": None, "knob_scores": [], **obj}
    fields = Fields(obj, path, _RESULT_KEYS)
    scores: list[tuple[float, float]] = []
    for j, pair in enumerate(fields.get_list("scores")):
        where = f"{path}.scores[{j}]"
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"{where}: expected an [alpha, score] pair")
        scores.append((check_float(pair[0], where), check_float(pair[1], where)))
    knob_scores: list[tuple[float, bool, float]] = []
    for j, row in enumerate(fields.get_list("knob_scores")):
        where = f"{path}.knob_scores[{j}]"
        if not isinstance(row, list) or len(row) != 3 or not isinstance(row[1], bool):
            raise ValueError(f"{where}: expected an [alpha, speculate, score] triple")
        knob_scores.append((check_float(row[0], where), row[1], check_float(row[2], where)))
    speculate = fields.get("best_speculate")
    if speculate is not None and not isinstance(speculate, bool):
        raise ValueError(f"{path}.best_speculate: expected a bool or None, got {speculate!r}")
    return TuneResult(
        fields.get_float("best_alpha"),
        tuple(scores),
        fields.get_int("window_requests", 0),
        fields.get_int("start_request", 0),
        fields.get_float("wall_s"),
        speculate,
        tuple(knob_scores),
    )
