"""Replay simulator: a trace through one or more systems and cache sizes.

Requests are served one at a time in arrival order (plan, then commit of input +
output), as in the paper's simulator. Several runs go to parallel worker processes;
the trace reaches each worker once (fork), not once per run.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np

from marconi_ray.core.cost_model import DEFAULT_EFFICIENCY, CostModel, validate_efficiency
from marconi_ray.core.eviction import FlopAwareEviction
from marconi_ray.core.explain import Decision, ExplainingEviction
from marconi_ray.core.invariants import check_tree
from marconi_ray.core.oracle import oracle_hits
from marconi_ray.core.prefix_cache import PrefixCache
from marconi_ray.core.reference import ReferenceCache, checked_serve
from marconi_ray.core.systems import get_system
from marconi_ray.core.tuner import BootstrapTuner, MapFn, RequestLike, TunerConfig, run_grid


@dataclass(frozen=True)
class RunConfig:
    """One replay run.

    Attributes:
        system: a name from `core.systems.SYSTEMS`.
        cache_bytes: capacity.
        alpha: fixed alpha; None means 0 for untuned systems and bootstrap tuning for
            tuned ones (`marconi`).
        recency: `timestamp` or `inverse_age` (FLOP-aware eviction only).
        efficiency: the FLOP-efficiency formula of FLOP-aware eviction, a name from
            `cost_model.EFFICIENCY_FORMULAS` (`freed`, `paper`, `artifact`, `uniform`).
        tuner: bootstrap tuner settings for tuned systems.
        check: debug mode: check every hit against a brute-force reference and the tree
            invariants after every request (slow; for tests).
        max_output: reserve room for this many output tokens when each request is
            planned, as the live service does (for comparing a replay with a served run);
            None reserves nothing, as the paper's simulator.
    """

    system: str
    cache_bytes: int
    alpha: float | None = None
    recency: str = "timestamp"
    tuner: TunerConfig = field(default_factory=TunerConfig)
    check: bool = False
    efficiency: str = DEFAULT_EFFICIENCY
    max_output: int | None = None

    def __post_init__(self) -> None:
        get_system(self.system)
        validate_efficiency(self.efficiency)
        if self.max_output is not None and self.max_output < 0:
            raise ValueError(f"max_output must be >= 0, got {self.max_output}")
        if not self.cache_bytes > 0:
            raise ValueError(f"cache size must be > 0 bytes, got {self.cache_bytes}")


@dataclass(frozen=True)
class RunResult:
    """Metrics of one run; `to_record` is one row of `results.json`.

    `bytes_by_kind` is what the cache holds at the end of the run (KV vs SSM).
    `admission`, `eviction` and `efficiency` name what ran (e.g. which vLLM+ variant);
    the `*_by_reason` maps count per admission reason: states admitted, states that
    served at least one hit, hits served, input tokens those hits reused.
    `speculate` is the `marconi+` knob at the end (None for other systems).
    """

    system: str
    admission: str
    eviction: str
    efficiency: str
    cache_bytes: int
    token_hit_rate: float
    request_hit_rate: float
    flops_saved: float
    flops_saved_fraction: float
    peak_bytes: int
    bytes_by_kind: dict[str, int]
    states_admitted: int
    states_by_reason: dict[str, int]
    states_hit_by_reason: dict[str, int]
    hits_by_reason: dict[str, int]
    hit_tokens_by_reason: dict[str, int]
    states_superseded: int
    speculate: bool | None
    states_dropped: int
    evictions: int
    alpha: float
    alpha_history: tuple[tuple[int, float], ...]
    requests: int
    input_tokens: int
    wall_s: float

    def to_record(self) -> dict[str, object]:
        rec = dict(self.__dict__)
        rec["alpha_history"] = [list(x) for x in self.alpha_history]
        return rec


def run_replay(
    requests: Sequence[RequestLike],
    cost: CostModel,
    cfg: RunConfig,
    tune_map: MapFn = map,
    explain: list[Decision] | None = None,
) -> RunResult:
    """Replay `requests` through one system at one cache size.

    Args:
        explain: when a list, every eviction decision is appended to it (`core.explain`);
            the system must use `flop_aware` eviction (ValueError otherwise).
    """
    start = time.perf_counter()
    system = get_system(cfg.system)
    tuned = system.tuned and cfg.alpha is None
    alpha = 0.0 if cfg.alpha is None else cfg.alpha
    config = system.cache_config(cfg.cache_bytes, alpha, cfg.recency, cfg.efficiency)
    cache = PrefixCache(cost, config)
    explaining: ExplainingEviction | None = None
    if explain is not None:
        if not isinstance(cache.eviction, FlopAwareEviction):
            raise ValueError(
                f"explain needs flop_aware eviction; {cfg.system} uses {config.eviction}"
            )
        explaining = ExplainingEviction(cache.eviction, cache.reasons)
        cache.eviction = explaining
    tuner = BootstrapTuner(cfg.tuner) if tuned else None
    ref = ReferenceCache() if cfg.check else None
    for i, req in enumerate(requests):
        if explaining is not None:
            explaining.request = i
        if ref is not None:
            checked_serve(cache, ref, req.input_tokens, req.output_tokens, cfg.max_output)
            check_tree(cache.tree)
        else:
            cache.serve(req.input_tokens, req.output_tokens, cfg.max_output)
        if tuner is not None:
            job = tuner.after_request(cache, req)
            if job is not None:
                tuner.adopt(run_grid(job, tune_map), cache)
    if explain is not None and explaining is not None:
        explain.extend(explaining.decisions)
    stats = cache.stats
    history = () if tuner is None else tuple((r.start_request, r.best_alpha) for r in tuner.history)
    admission_state = cache.admission.state()
    return RunResult(
        system=cfg.system,
        admission=config.admission,
        eviction=config.eviction,
        efficiency=config.efficiency,
        cache_bytes=cfg.cache_bytes,
        token_hit_rate=stats.token_hit_rate,
        request_hit_rate=stats.request_hit_rate,
        flops_saved=stats.flops_saved,
        flops_saved_fraction=stats.flops_saved_fraction,
        peak_bytes=stats.peak_bytes,
        bytes_by_kind=cache.bytes_by_kind(),
        states_admitted=sum(stats.states_admitted.values()),
        states_by_reason=dict(stats.states_admitted),
        states_hit_by_reason=dict(stats.states_hit),
        hits_by_reason=dict(stats.hits_by_reason),
        hit_tokens_by_reason=dict(stats.hit_tokens_by_reason),
        states_superseded=stats.states_superseded,
        speculate=bool(admission_state["speculate"]) if "speculate" in admission_state else None,
        states_dropped=stats.states_dropped,
        evictions=stats.evictions,
        alpha=cache.alpha,
        alpha_history=history,
        requests=stats.requests,
        input_tokens=stats.input_tokens,
        wall_s=time.perf_counter() - start,
    )


def oracle_record(requests: Sequence[RequestLike]) -> dict[str, object]:
    """The `oracle` row: hit rates of an infinite cache with a state at every token."""
    hits = oracle_hits(requests)
    n_input = sum(len(r.input_tokens) for r in requests)
    return {
        "system": "oracle",
        "cache_bytes": None,
        "token_hit_rate": sum(hits) / n_input if n_input else 0.0,
        "request_hit_rate": float(np.mean([h > 0 for h in hits])) if hits else 0.0,
        "requests": len(hits),
        "input_tokens": n_input,
    }


class _WorkerInputs:
    """The trace and cost model a worker process replays (set once per process)."""

    requests: Sequence[RequestLike] = ()
    cost: CostModel | None = None


def _init_worker(requests: Sequence[RequestLike], cost: CostModel) -> None:
    _WorkerInputs.requests = requests
    _WorkerInputs.cost = cost


def _run_in_worker(cfg: RunConfig) -> RunResult:
    assert _WorkerInputs.cost is not None
    return run_replay(_WorkerInputs.requests, _WorkerInputs.cost, cfg)


def replay_sweep(
    requests: Sequence[RequestLike],
    cost: CostModel,
    configs: Sequence[RunConfig],
    jobs: int = 1,
    on_result: Callable[[RunResult], None] | None = None,
) -> list[RunResult]:
    """Run every config; results come back in the order of `configs`.

    Args:
        jobs: worker processes (1 runs in this process).
        on_result: called as each run finishes (e.g. to advance a progress bar).
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    results: dict[int, RunResult] = {}
    if jobs == 1 or len(configs) == 1:
        for i, cfg in enumerate(configs):
            results[i] = run_replay(requests, cost, cfg)
            if on_result is not None:
                on_result(results[i])
    else:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            max_workers=min(jobs, len(configs)),
            mp_context=ctx,
            initializer=_init_worker,
            initargs=(requests, cost),
        ) as pool:
            futures = {pool.submit(_run_in_worker, cfg): i for i, cfg in enumerate(configs)}
            for fut in as_completed(futures):
                results[futures[fut]] = fut.result()
                if on_result is not None:
                    on_result(results[futures[fut]])
    return [results[i] for i in range(len(configs))]
