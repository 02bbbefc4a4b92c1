"""Benchmark of the caching brain (issue "The caching brain"), all measured in one run.

1. Hit rates of vllm+, sglang+ and marconi on the artifact-faithful ShareGPT trace
   (100 sessions, 1 session/s) at 1e9, 2e9, 5e9, 1e10 bytes, next to the artifact's
   numbers, with the ratios marconi/vllm+ and marconi/sglang+ and peak bytes/capacity.
2. Replay speed: wall time of that 12-run sweep; requests/s and input tokens/s per run.
3. Tuner: one 21-alpha grid over a 1,000-request window, serial vs a 2-process pool.
4. The same sweep on the SWE-bench agent trace (mean input ~15k tokens).
5. Cost of one eviction decision with 10k candidate nodes (LRU and FLOP-aware).

Writes `OUT/bench_core.json` and `OUT/sharegpt_hit_rates.png`; prints a table.
Needs the shared data folder (../shared/data or $MARCONI_DATA_DIR).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from marconi_ray.cli.plot import plot_hit_rate_vs_cache
from marconi_ray.core import cache_codec
from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.prefix_cache import PrefixCache
from marconi_ray.core.presets import get_preset
from marconi_ray.core.replay import RunConfig, RunResult, oracle_record, replay_sweep
from marconi_ray.core.systems import get_system
from marconi_ray.core.tuner import TuneJob, default_grid, run_grid
from marconi_ray.traces.registry import load_trace

SIZES = (int(1e9), int(2e9), int(5e9), int(1e10))
SWE_SIZES = (int(1e10), int(2e10), int(5e10), int(1e11))
SYSTEMS = ("vllm+", "sglang+", "marconi")
ARTIFACT = {  # token hit rate (%) measured with the authors' simulator (artifact-notes.md)
    "vllm+": (3.17, 3.96, 8.45, 17.80),
    "sglang+": (15.58, 34.45, 68.75, 86.19),
    "marconi": (19.99, 31.83, 75.08, 90.36),
}


def sweep(requests, cost, sizes, jobs):  # type: ignore[no-untyped-def]
    configs = [RunConfig(s, c) for s in SYSTEMS for c in sizes]
    start = time.perf_counter()
    results = replay_sweep(requests, cost, configs, jobs=jobs)
    return results, time.perf_counter() - start


def hit_table(results: list[RunResult], sizes: tuple[int, ...], artifact: bool) -> list[dict]:
    by = {(r.system, r.cache_bytes): r for r in results}
    rows = []
    for i, size in enumerate(sizes):
        v, s, m = (by[(name, size)] for name in SYSTEMS)
        row = {
            "cache_bytes": size,
            **{f"{r.system}_token_hit_rate": r.token_hit_rate for r in (v, s, m)},
            "marconi_over_vllm+": m.token_hit_rate / max(v.token_hit_rate, 1e-12),
            "marconi_over_sglang+": m.token_hit_rate / max(s.token_hit_rate, 1e-12),
            "max_peak_over_capacity": max(r.peak_bytes / size for r in (v, s, m)),
            "marconi_alpha": m.alpha,
        }
        if artifact:
            row.update({f"artifact_{k}": ARTIFACT[k][i] / 100 for k in SYSTEMS})
        rows.append(row)
    return rows


def print_hit_table(title: str, rows: list[dict], artifact: bool) -> None:
    print(f"\n{title}")
    head = f"{'cache':>8} | {'vllm+':>7} {'sglang+':>8} {'marconi':>8} | {'m/v':>6} {'m/s':>5}"
    head += f" | {'peak/cap':>8} {'alpha':>5}" + (" | artifact v / s / m" if artifact else "")
    print(head)
    for r in rows:
        line = (
            f"{r['cache_bytes'] / 1e9:>6.0f}GB | {100 * r['vllm+_token_hit_rate']:>6.2f}%"
            f" {100 * r['sglang+_token_hit_rate']:>7.2f}%"
            f" {100 * r['marconi_token_hit_rate']:>7.2f}%"
            f" | {r['marconi_over_vllm+']:>5.1f}x {r['marconi_over_sglang+']:>4.2f}x"
            f" | {r['max_peak_over_capacity']:>8.3f} {r['marconi_alpha']:>5.1f}"
        )
        if artifact:
            line += " | " + " / ".join(f"{100 * r[f'artifact_{k}']:.2f}%" for k in SYSTEMS)
        print(line)


def tuner_job(requests, cost, capacity: int, window: int) -> TuneJob:  # type: ignore[no-untyped-def]
    """Serve until the first eviction, snapshot, and take the next `window` requests."""
    cache = PrefixCache(cost, get_system("marconi").cache_config(capacity))
    for i, req in enumerate(requests):
        cache.serve(req.input_tokens, req.output_tokens)
        if cache.stats.evictions:
            later = requests[i + 1 : i + 1 + window]
            if len(later) < window:
                break
            pairs = tuple((r.input_tokens, r.output_tokens) for r in later)
            snap = cache_codec.snapshot(cache)
            return TuneJob(snap, pairs, default_grid(), "token_hit_rate", i + 1)
    raise RuntimeError(f"trace too short for a {window}-request window at {capacity} bytes")


def eviction_decision_cost(cost: CostModel, n_candidates: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    out = {}
    for eviction, alpha in (("lru", 0.0), ("flop_aware", 1.0)):
        system = "sglang+" if eviction == "lru" else "marconi"
        cache = PrefixCache(cost, get_system(system).cache_config(10**15, alpha))
        for i in range(n_candidates):
            seq = np.concatenate([[i + 1], rng.integers(0, 32000, int(rng.integers(10, 400)))])
            cache.serve(seq.astype(np.int32), np.zeros(0, np.int32))
        assert int(cache.tree.table.evictable.sum()) >= n_candidates
        reps = 2000
        start = time.perf_counter()
        for _ in range(reps):
            cache.eviction.choose(cache.tree, cache.clock)
        out[eviction] = (time.perf_counter() - start) / reps * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/core", help="output folder")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes for sweeps")
    parser.add_argument("--window", type=int, default=1000, help="tuner window (requests)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cost = CostModel.from_spec(get_preset("paper-7b"))
    report: dict[str, object] = {"model": "paper-7b"}

    share = load_trace("sharegpt", n_sessions=100, sessions_per_second=1.0)
    reqs = list(share.requests)
    results, wall = sweep(reqs, cost, SIZES, args.jobs)
    rows = hit_table(results, SIZES, artifact=True)
    print_hit_table(f"ShareGPT, 100 sessions, {len(reqs)} requests: token hit rate", rows, True)
    oracle = oracle_record(reqs)
    print(f"oracle bound: {100 * oracle['token_hit_rate']:.2f}%")
    n_tok = sum(len(r.input_tokens) for r in reqs)
    speed = [
        {
            "system": r.system,
            "cache_bytes": r.cache_bytes,
            "wall_s": r.wall_s,
            "requests_per_s": len(reqs) / r.wall_s,
            "input_tokens_per_s": n_tok / r.wall_s,
        }
        for r in results
    ]
    print(f"12-run sweep wall time: {wall:.2f} s with {args.jobs} processes")
    print(
        f"per run: {min(s['requests_per_s'] for s in speed):,.0f}.."
        f"{max(s['requests_per_s'] for s in speed):,.0f} requests/s, "
        f"{min(s['input_tokens_per_s'] for s in speed) / 1e6:.1f}.."
        f"{max(s['input_tokens_per_s'] for s in speed) / 1e6:.1f} M input tokens/s"
    )
    report["sharegpt"] = {
        "rows": rows,
        "oracle": oracle,
        "sweep_wall_s": wall,
        "runs": speed,
        "records": [r.to_record() for r in results],
    }
    plot_hit_rate_vs_cache(
        [r.to_record() for r in results],
        out / "sharegpt_hit_rates.png",
        title="ShareGPT (100 sessions, 1 sps), paper 7B hybrid",
        oracle_hit_rate=float(oracle["token_hit_rate"]),  # type: ignore[arg-type]
    )

    job = tuner_job(reqs, cost, SIZES[0], args.window)
    serial = run_grid(job)
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
        pool.submit(int).result()  # workers up before timing
        parallel = run_grid(job, pool.map, n_tasks=2)
    assert serial.scores == parallel.scores
    print(
        f"\ntuner grid (21 alphas, {len(job.window)}-request window): serial "
        f"{serial.wall_s:.2f} s, 2 processes {parallel.wall_s:.2f} s "
        f"({serial.wall_s / parallel.wall_s:.2f}x), best alpha {serial.best_alpha}"
    )
    report["tuner"] = {
        "window": len(job.window),
        "serial_s": serial.wall_s,
        "two_process_s": parallel.wall_s,
        "best_alpha": serial.best_alpha,
    }

    swe = load_trace("swebench")
    swe_reqs = list(swe.requests)
    stats = swe.stats()
    swe_results, swe_wall = sweep(swe_reqs, cost, SWE_SIZES, args.jobs)
    swe_rows = hit_table(swe_results, SWE_SIZES, artifact=False)
    print_hit_table(
        f"SWE-bench agent trace, {len(swe_reqs)} requests, mean input "
        f"{stats['mean_input_tokens']:,.0f} tokens",
        swe_rows,
        False,
    )
    print(f"12-run SWE sweep wall time: {swe_wall:.2f} s with {args.jobs} processes")
    report["swebench"] = {
        "rows": swe_rows,
        "sweep_wall_s": swe_wall,
        "stats": stats,
        "oracle": oracle_record(swe_reqs),
    }

    decision = eviction_decision_cost(cost, 10_000)
    print(
        f"\none eviction decision over 10k candidates: LRU {decision['lru']:.0f} us, "
        f"FLOP-aware {decision['flop_aware']:.0f} us"
    )
    report["eviction_decision_us"] = decision
    (out / "bench_core.json").write_text(json.dumps(report, indent=2, default=float))
    print(f"\nwrote {out / 'bench_core.json'} and {out / 'sharegpt_hit_rates.png'}")


if __name__ == "__main__":
    main()
