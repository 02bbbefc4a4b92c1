"""Replay simulator: a trace through one or more systems and cache sizes.

Requests are served one at a time in arrival order (plan, then commit of input +
output), as in the paper's simulator. Several runs go to parallel worker processes;
the trace reaches each worker once (fork), not once per run.

A clock models what the hits are worth in time: each request's time to first token is
the prefill of its uncached tokens at `prefill_tflops` plus, for a hit whose bytes were
on the host tier, their copy at `host_gbps` (no queueing: one request at a time). A run
reports that modelled TTFT (mean, P95) and the fraction of the no-cache TTFT it saves.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from marconi_ray.core.cache.eviction import FlopAwareEviction
from marconi_ray.core.cache.explain import Decision, ExplainingEviction
from marconi_ray.core.cache.host_tier import (
    DEFAULT_HOST_GBPS,
    DEFAULT_PREFILL_TFLOPS,
    NO_HOST_TIER,
    HostTier,
)
from marconi_ray.core.cache.invariants import check_cache_tiers, check_tree
from marconi_ray.core.cache.prefix_cache import PrefixCache
from marconi_ray.core.cache.systems import get_system
from marconi_ray.core.cache.tuner import BootstrapTuner, MapFn, RequestLike, TunerConfig, run_grid
from marconi_ray.core.model.cost_model import DEFAULT_EFFICIENCY, CostModel, validate_efficiency
from marconi_ray.core.sim.oracle import oracle_hits
from marconi_ray.core.sim.reference import (
    ReferenceCache,
    TieredReference,
    checked_serve,
    checked_serve_tiered,
)


@dataclass(frozen=True)
class RunConfig:
    """One replay run.

    Attributes:
        system: a name from `core.cache.systems.SYSTEMS`.
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
        host_bytes: the host tier's capacity (0: one tier of `cache_bytes`).
        host_gbps: copy bandwidth between the tiers, GB/s.
        prefill_tflops: prefill speed of the clock (and of FLOP-aware placement).
        placement: `flop_aware` or `lru` (`core.cache.host_tier.PLACEMENTS`).
    """

    system: str
    cache_bytes: int
    alpha: float | None = None
    recency: str = "timestamp"
    tuner: TunerConfig = field(default_factory=TunerConfig)
    check: bool = False
    efficiency: str = DEFAULT_EFFICIENCY
    max_output: int | None = None
    host_bytes: int = 0
    host_gbps: float = DEFAULT_HOST_GBPS
    prefill_tflops: float = DEFAULT_PREFILL_TFLOPS
    placement: str = "flop_aware"

    def __post_init__(self) -> None:
        get_system(self.system)
        HostTier(self.host_bytes, self.host_gbps, self.prefill_tflops, self.placement)
        validate_efficiency(self.efficiency)
        if self.max_output is not None and self.max_output < 0:
            raise ValueError(f"max_output must be >= 0, got {self.max_output}")
        if not self.cache_bytes > 0:
            raise ValueError(f"cache size must be > 0 bytes, got {self.cache_bytes}")

    @property
    def host(self) -> HostTier:
        """The run's host tier (its clock even when it holds 0 bytes)."""
        return HostTier(self.host_bytes, self.host_gbps, self.prefill_tflops, self.placement)


@dataclass(frozen=True)
class RunResult:
    """Metrics of one run; `to_record` is one row of `results.json`.

    `bytes_by_kind` is what the cache holds at the end of the run (KV vs SSM).
    `admission`, `eviction` and `efficiency` name what ran (e.g. which vLLM+ variant);
    the `*_by_reason` maps count per admission reason: states admitted, states that
    served at least one hit, hits served, input tokens those hits reused.
    `speculate` is the `marconi+` knob at the end (None for other systems).
    Tiers: `host_hit_tokens` of the hit tokens were on the host when planned; moves and
    bytes copied each way; the clock's modelled TTFT (mean, P95, seconds) and the fraction
    of the no-cache TTFT the hits saved, copies paid (`ttft_saved_fraction`).
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
    host_bytes: int = 0
    placement: str = "flop_aware"
    hit_tokens: int = 0
    host_hit_tokens: int = 0
    promotions: int = 0
    promoted_bytes: int = 0
    demotions: int = 0
    demoted_bytes: int = 0
    host_evictions: int = 0
    host_peak_bytes: int = 0
    ttft_mean_s: float = 0.0
    ttft_p95_s: float = 0.0
    ttft_saved_fraction: float = 0.0

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
        explain: when a list, every eviction decision is appended to it (`core.cache.explain`);
            the system must use `flop_aware` eviction (ValueError otherwise).
    """
    start = time.perf_counter()
    system = get_system(cfg.system)
    tuned = system.tuned and cfg.alpha is None
    alpha = 0.0 if cfg.alpha is None else cfg.alpha
    host = cfg.host
    config = system.cache_config(
        cfg.cache_bytes, alpha, cfg.recency, cfg.efficiency, host if host.enabled else NO_HOST_TIER
    )
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
    serve = _serving(cache, cfg)
    ttft = np.zeros(len(requests))
    no_cache = 0.0
    for i, req in enumerate(requests):
        if explaining is not None:
            explaining.request = i
        n = len(req.input_tokens)
        hit_len, host_read = serve(req.input_tokens, req.output_tokens)
        ttft[i] = host.prefill_seconds(cost.prefill_flops(n - hit_len, hit_len))
        ttft[i] += host.copy_seconds(host_read)
        no_cache += host.prefill_seconds(cost.prefill_flops(n))
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
        host_bytes=cfg.host_bytes,
        placement=cfg.placement,
        hit_tokens=stats.hit_tokens,
        host_hit_tokens=stats.host_hit_tokens,
        promotions=stats.promotions,
        promoted_bytes=stats.promoted_bytes,
        demotions=stats.demotions,
        demoted_bytes=stats.demoted_bytes,
        host_evictions=stats.host_evictions,
        host_peak_bytes=stats.host_peak_bytes,
        ttft_mean_s=float(ttft.mean()) if len(ttft) else 0.0,
        ttft_p95_s=float(np.percentile(ttft, 95)) if len(ttft) else 0.0,
        ttft_saved_fraction=1.0 - float(ttft.sum()) / no_cache if no_cache else 0.0,
    )


Serve = Callable[[npt.NDArray[np.int32], npt.NDArray[np.int32]], tuple[int, int]]


def _serving(cache: PrefixCache, cfg: RunConfig) -> Serve:
    """How a run serves one request: (input, output) -> (hit length, host bytes the hit
    read), plan then commit, with `cfg.check`'s brute-force reference and invariant
    checks after every request."""
    max_output = cfg.max_output
    if cfg.check and cache.tiers is not None:
        tiered = TieredReference()
        next_kv = [0]

        def serve_tiered(inp: npt.NDArray[np.int32], out: npt.NDArray[np.int32]) -> tuple[int, int]:
            plan, next_kv[0] = checked_serve_tiered(cache, tiered, inp, out, next_kv[0], max_output)
            check_cache_tiers(cache)
            return plan.hit_len, plan.host_bytes

        return serve_tiered
    if cfg.check:
        ref = ReferenceCache()

        def serve_checked(
            inp: npt.NDArray[np.int32], out: npt.NDArray[np.int32]
        ) -> tuple[int, int]:
            hit = checked_serve(cache, ref, inp, out, max_output)
            check_tree(cache.tree)
            return hit, 0

        return serve_checked

    def serve(inp: npt.NDArray[np.int32], out: npt.NDArray[np.int32]) -> tuple[int, int]:
        plan = cache.serve_plan(inp, out, max_output)
        return plan.hit_len, plan.host_bytes

    return serve


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
