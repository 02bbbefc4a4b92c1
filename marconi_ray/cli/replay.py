"""`marconi-ray replay`: a trace through several systems x cache sizes, with table and plot.

Everything (options, model, trace) is validated before the output folder is created, so a
bad input writes nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from marconi_ray import __version__
from marconi_ray.cli import values
from marconi_ray.cli.model import MODEL_HELP, load_cost_model
from marconi_ray.cli.table import format_table
from marconi_ray.cli.trace_source import (
    add_source_options,
    add_trace_option,
    default_trace,
    load_from_args,
    trace_stats,
)
from marconi_ray.core.cache.eviction import RECENCY_MODES
from marconi_ray.core.cache.explain import Decision, summarize
from marconi_ray.core.cache.host_tier import DEFAULT_HOST_GBPS, DEFAULT_PREFILL_TFLOPS, PLACEMENTS
from marconi_ray.core.cache.systems import SYSTEMS, get_system
from marconi_ray.core.cache.tuner import OBJECTIVES, TunerConfig, default_grid
from marconi_ray.core.model.cost_model import DEFAULT_EFFICIENCY, EFFICIENCY_FORMULAS
from marconi_ray.core.sim.replay import (
    RunConfig,
    RunResult,
    oracle_record,
    replay_sweep,
    run_replay,
)
from marconi_ray.traces.trace import Trace

DEFAULT_CACHE_SIZES = "1e9,2e9,5e9,1e10"
RESULTS_FILE = "results.json"
RUN_FILE = "run.json"
PLOT_FILE = "hit_rate_vs_cache.png"
EXPLAIN_FILE = "explain.jsonl"
EXPLAIN_PLOT = "explain.png"


def add_parser(subparsers: Any) -> None:
    """Register the `replay` subcommand."""
    p = subparsers.add_parser(
        "replay",
        help="replay a trace through caching systems at several cache sizes",
        description="Replay a request trace through prefix-caching systems at several "
        f"cache sizes; write {RESULTS_FILE}, {RUN_FILE} and {PLOT_FILE} to --out and print "
        "a results table.",
    )
    add_trace_option(p)
    p.add_argument(
        "--cache-bytes",
        type=values.cache_sizes,
        default=values.cache_sizes(DEFAULT_CACHE_SIZES),
        metavar="SIZES",
        help=f"comma list of cache capacities in bytes, floats allowed "
        f"(default: {DEFAULT_CACHE_SIZES})",
    )
    p.add_argument(
        "--host-bytes",
        type=values.host_sizes,
        default=(0,),
        metavar="SIZES",
        help="comma list of host-tier capacities in bytes per replica, each run with "
        "every --cache-bytes: device evictions then demote to host memory and hits are "
        "promoted back (0: one tier, the device only) (default: 0)",
    )
    p.add_argument(
        "--host-gbps",
        type=values.positive_float,
        default=DEFAULT_HOST_GBPS,
        metavar="GBPS",
        help=f"copy bandwidth between host and device, GB/s: what a host hit costs on the "
        f"clock and what FLOP-aware placement weighs (default: {DEFAULT_HOST_GBPS:g})",
    )
    p.add_argument(
        "--prefill-tflops",
        type=values.positive_float,
        default=DEFAULT_PREFILL_TFLOPS,
        metavar="TFLOPS",
        help=f"prefill speed of the clock that models time to first token (uncached "
        f"tokens' FLOPs / speed + host bytes / bandwidth) (default: "
        f"{DEFAULT_PREFILL_TFLOPS:g})",
    )
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="flop_aware",
        help="what a device eviction does with a two-tier cache: flop_aware demotes a "
        "victim only when a hit on it saves more prefill time than copying it back costs, "
        "lru demotes every victim (default: flop_aware)",
    )
    p.add_argument(
        "--systems",
        type=values.systems,
        default=tuple(SYSTEMS),
        metavar="NAMES",
        help=f"comma list of systems to compare, from {', '.join(SYSTEMS)} (default: all)",
    )
    add_source_options(p)
    p.add_argument("--model", default="paper-7b", help=f"{MODEL_HELP} (default: paper-7b)")
    p.add_argument(
        "--alpha",
        type=values.alpha,
        default=None,
        metavar="auto|FLOAT",
        help="FLOP-aware eviction weight: `auto` bootstrap-tunes it online (marconi), a "
        "number fixes it for every system (default: auto)",
    )
    p.add_argument(
        "--recency",
        choices=RECENCY_MODES,
        default="timestamp",
        help="recency score of FLOP-aware eviction (default: timestamp)",
    )
    p.add_argument(
        "--efficiency",
        choices=tuple(EFFICIENCY_FORMULAS),
        default=DEFAULT_EFFICIENCY,
        help="FLOP-efficiency formula of FLOP-aware eviction: freed (FLOPs a hit on the "
        "node saves over its nearest state-holding ancestor, per byte its eviction frees), "
        "uniform (the same FLOPs per state + edge KV bytes, leaves and inner nodes alike), "
        "paper (FLOPs of the whole prefix per byte of its KV and state) or artifact (the "
        f"edge's FLOPs per byte of state + whole-path KV) (default: {DEFAULT_EFFICIENCY})",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help=f"for one system (FLOP-aware eviction) at one cache size: record why each "
        f"eviction chose its victim (normalised recency, efficiency, score, rank by "
        f"recency) into {EXPLAIN_FILE} and {EXPLAIN_PLOT}, and print a summary",
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="token_hit_rate",
        help="what alpha tuning maximizes (default: token_hit_rate, as the paper)",
    )
    p.add_argument(
        "--multiplier",
        type=values.positive_int,
        default=5,
        metavar="N",
        help="tuning window = N x the requests served before the first eviction (default: 5)",
    )
    p.add_argument(
        "--alpha-grid",
        type=values.alpha_grid,
        default=default_grid(),
        metavar="GRID",
        help="alphas tried by tuning: start:stop:step (stop included) or a comma list "
        "(default: 0:2:0.1)",
    )
    p.add_argument(
        "--retune-every",
        type=values.positive_int,
        default=None,
        metavar="N",
        help="after the first tuning, re-tune on every following window of N requests "
        "(default: tune once)",
    )
    p.add_argument(
        "--jobs",
        type=values.positive_int,
        default=os.cpu_count() or 1,
        metavar="N",
        help="parallel worker processes, one run each (default: the CPU count)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="debug mode: check every hit against a brute-force reference cache and the "
        "tree invariants after every request (slow)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created if missing)")
    p.set_defaults(func=run)


def _configs(args: argparse.Namespace) -> list[RunConfig]:
    tuner = TunerConfig(
        multiplier=args.multiplier,
        grid=tuple(args.alpha_grid),
        objective=args.objective,
        retune_every=args.retune_every,
    )
    configs = [
        RunConfig(
            system,
            size,
            args.alpha,
            args.recency,
            tuner,
            args.check,
            args.efficiency,
            host_bytes=host,
            host_gbps=args.host_gbps,
            prefill_tflops=args.prefill_tflops,
            placement=args.placement,
        )
        for system in args.systems
        for size in args.cache_bytes
        for host in args.host_bytes
    ]
    if args.explain:
        if len(configs) != 1:
            raise ValueError(
                f"--explain explains one run: give one system and one cache size, got "
                f"{len(args.systems)} system(s) x {len(args.cache_bytes)} size(s) x "
                f"{len(args.host_bytes)} host size(s)"
            )
        if get_system(configs[0].system).eviction != "flop_aware":
            raise ValueError(
                f"--explain needs a system with flop_aware eviction, got {configs[0].system}"
            )
    return configs


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} exists and is not a folder")


def _sweep(trace: Trace, cost: Any, configs: Sequence[RunConfig], jobs: int) -> list[RunResult]:
    with tqdm(total=len(configs), desc="replay", unit="run", file=sys.stderr) as bar:

        def advance(result: RunResult) -> None:
            bar.set_postfix_str(f"{result.system} {result.cache_bytes / 1e9:g} GB")
            bar.update()

        return replay_sweep(trace.requests, cost, configs, jobs=jobs, on_result=advance)


def _options(args: argparse.Namespace, trace_spec: str) -> dict[str, Any]:
    opts = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    opts["trace"] = trace_spec
    for key in ("cache_bytes", "host_bytes", "systems", "alpha_grid"):
        opts[key] = list(opts[key])
    return opts


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Validate, replay, print the table and write the outputs; 0 on success."""
    start = time.perf_counter()
    configs = _configs(args)
    model_name, cost = load_cost_model(args.model)
    out = Path(args.out)
    _check_out(out)
    trace_spec = args.trace if args.trace is not None else default_trace(args.data_dir)
    trace = load_from_args(trace_spec, args)
    out.mkdir(parents=True, exist_ok=True)

    decisions: list[Decision] = []
    if args.explain:
        results = [run_replay(trace.requests, cost, configs[0], explain=decisions)]
    else:
        results = _sweep(trace, cost, configs, args.jobs)
    oracle = oracle_record(trace.requests)
    records: list[dict[str, Any]] = [r.to_record() for r in results]
    records.append(oracle)
    stats = trace_stats(trace)
    print(
        f"trace {trace.name}: {len(trace)} requests, {trace.n_sessions} sessions, "
        f"mean input {stats['mean_input_tokens']:.0f} tokens; model {model_name}"
    )
    print(format_table(records))

    _write_json(out / RESULTS_FILE, records)
    from marconi_ray.cli.plot import plot_hit_rate_vs_cache  # matplotlib is slow to import

    title = f"Token hit rate vs cache size: {trace.name} ({trace.n_sessions} sessions), "
    title += model_name
    oracle_rate = oracle["token_hit_rate"]
    plot_hit_rate_vs_cache(
        records, out / PLOT_FILE, title, oracle_rate if isinstance(oracle_rate, float) else None
    )
    _write_json(
        out / RUN_FILE,
        {
            "command": "replay",
            "argv": list(argv),
            "options": _options(args, trace_spec),
            "model": {"name": model_name, **dataclasses.asdict(cost)},
            "trace": stats,
            "version": __version__,
            "wall_s": time.perf_counter() - start,
        },
    )
    print(f"wrote {out / RESULTS_FILE}, {out / PLOT_FILE}, {out / RUN_FILE}")
    if args.explain:
        _write_explain(
            out,
            decisions,
            f"{configs[0].system} at {configs[0].cache_bytes / 1e9:g} GB, {trace.name}",
        )
    return 0


def _write_explain(out: Path, decisions: list[Decision], what: str) -> None:
    from marconi_ray.cli.plot import plot_eviction_decisions

    with (out / EXPLAIN_FILE).open("w", encoding="utf-8") as f:
        for d in decisions:
            f.write(json.dumps(dataclasses.asdict(d)) + "\n")
    plot_eviction_decisions(decisions, out / EXPLAIN_PLOT, f"Eviction decisions: {what}")
    summary = summarize(decisions)
    print(f"explained {summary.decisions} eviction decisions ({what})")
    if decisions:
        print(
            f"  the victim was the least recent candidate (LRU's choice) in "
            f"{100 * summary.lru_choice_share:.1f}% of decisions; "
            f"median rank by recency {summary.median_lru_rank:.0f} of "
            f"{summary.median_candidates:.0f} candidates"
        )
        print(
            f"  victims: {100 * summary.leaf_share:.1f}% leaves; median normalised "
            f"recency {summary.median_recency:.3f}, efficiency "
            f"{summary.median_efficiency:.3f}; by admission reason "
            f"{summary.victims_by_reason}"
        )
    print(f"wrote {out / EXPLAIN_FILE}, {out / EXPLAIN_PLOT}")
