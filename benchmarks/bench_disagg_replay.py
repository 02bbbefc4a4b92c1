"""Cluster replay of issue 50, item 7(b): prefill-side-only caching (what vLLM, SGLang and
Dynamo ship for hybrids), caches on both sides, and mixed replicas with and without
remote hits, against one co-located cache, at equal total cache bytes.

Every replica's cache is a real `PrefixCache` (Marconi admission, FLOP-aware eviction at a
fixed alpha); the cluster, its router, its queues and its clock are
`marconi_ray/core/sim/cluster_*.py` (pure Python). Per trace, per total cache size (given
per replica: total = GB x (prefill + decode replicas)) and per load (`--speedups`: the
trace's arrival times divided by it), each system replays the whole trace; reported:
token hit rate, modelled TTFT p50 / p99, how requests were served (own hit, suffix on a
decode replica, pulled hit, recompute), bytes moved per request. The targets: `both`
recovers >= 80% of the hit-rate gap between `prefill_only` and `colocated`;
`mixed+remote` is >= 3 points above `mixed` on Mooncake.

    .venv/bin/python benchmarks/bench_disagg_replay.py                      # defaults
    .venv/bin/python benchmarks/bench_disagg_replay.py --traces mooncake --speedups 1
    .venv/bin/python benchmarks/bench_disagg_replay.py --requests 500       # a quick look

Writes OUT/disagg_replay.json (the configuration, the machine, every run's record and the
targets), OUT/disagg_replay.md (the tables as printed) and OUT/disagg_replay.png. Needs
the shared data folder (../shared/data or $MARCONI_DATA_DIR). The defaults (2 traces x 3
sizes x 2 loads x 6 systems) take about 2 minutes on one core.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from run_info import machine
from tqdm import tqdm

from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.presets import PRESETS, get_preset
from marconi_ray.core.sim.cluster_config import ClusterConfig
from marconi_ray.core.sim.cluster_cost import ClusterCost
from marconi_ray.core.sim.cluster_replay import CLUSTER_SYSTEMS, run_cluster
from marconi_ray.core.sim.cluster_route import RouteRule
from marconi_ray.traces.registry import load_trace

GB = 10**9
TRACES = {"mooncake": "mooncake-chained", "mooncake-unchained": "mooncake", "swebench": "swebench"}
"""Trace names of `--traces` -> `load_trace` specs (Mooncake with its conversations
chained, so a next turn's input holds the previous output, as the decode side needs)."""
GAP = ("prefill_only", "colocated", "both")
REMOTE = ("mixed", "mixed+remote")
GAP_TARGET, REMOTE_TARGET = 0.80, 3.0


def _floats(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what}: comma-separated numbers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"{what}: numbers > 0, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--traces",
        default="mooncake,swebench",
        help=f"comma-separated, of {', '.join(TRACES)} (mooncake: its conversations chained)",
    )
    p.add_argument(
        "--gb-per-replica",
        default="4,10,40",
        help="total cache sizes, as GB per replica: each system's caches hold this times "
        "(prefill + decode replicas) GB together (default: 96, 240 and 960 GB for 24)",
    )
    p.add_argument(
        "--speedups",
        default="1,4",
        help="loads: arrivals replayed at the trace's times divided by each (1: as recorded)",
    )
    p.add_argument(
        "--systems",
        default=",".join(CLUSTER_SYSTEMS),
        help="comma-separated, of " + ", ".join(CLUSTER_SYSTEMS),
    )
    p.add_argument("--prefill", type=int, default=8, help="prefill replicas of the P/D systems")
    p.add_argument(
        "--decode",
        type=int,
        default=16,
        help="decode replicas of the P/D systems (mixed systems run prefill + decode replicas)",
    )
    p.add_argument("--model", default="paper-7b", choices=sorted(PRESETS), help="cost model")
    p.add_argument("--admission", default="marconi", help="every cache's admission policy")
    p.add_argument("--eviction", default="flop_aware", help="every cache's eviction policy")
    p.add_argument(
        "--alpha", type=float, default=0.0, help="FLOP-aware eviction's alpha, fixed (no tuner)"
    )
    cost = ClusterCost()
    p.add_argument(
        "--prefill-tflops",
        type=float,
        default=cost.prefill_tflops,
        help="effective prefill speed of one replica (H200 at ~40%% of its bf16 peak)",
    )
    p.add_argument(
        "--transfer-gbps",
        type=float,
        default=cost.transfer_gbps,
        help="replica-to-replica copy bandwidth, GB/s (one 400 Gb/s link)",
    )
    p.add_argument(
        "--transfer-latency-ms",
        type=float,
        default=1e3 * cost.transfer_latency_s,
        help="set-up time of every copy, ms",
    )
    p.add_argument(
        "--decode-step-ms",
        type=float,
        default=1e3 * cost.decode_step_s,
        help="one batched decode step, ms: a sequence's time per output token",
    )
    p.add_argument(
        "--decode-batch", type=int, default=cost.decode_batch, help="sequences per decode step"
    )
    rule = RouteRule()
    p.add_argument(
        "--load-tokens",
        type=int,
        default=rule.load_tokens,
        help="router: one open request costs the prefill FLOPs of this many tokens",
    )
    p.add_argument(
        "--max-imbalance",
        type=int,
        default=rule.max_imbalance,
        help="router: never pick a replica with more open requests than the least loaded + this",
    )
    p.add_argument(
        "--route-weighs",
        choices=("usable", "kv"),
        default="usable",
        help="router: score each replica's usable (state-backed) hit, as the live router "
        "does, or the prompt KV its tree holds, state or not (a what-if: it gathers requests "
        "that share a prefix before Marconi has checkpointed it)",
    )
    p.add_argument(
        "--requests",
        type=int,
        default=None,
        help="replay only the first N requests of each trace (default: the whole trace)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="check every cache's tree after every request (slow; the end is always checked)",
    )
    p.add_argument("--data-dir", default=None, help="shared data folder (default: ../shared/data)")
    p.add_argument("--out", default="benchmarks/results/disagg_replay", help="output folder")
    args = p.parse_args(argv)
    try:
        args.sizes = _floats(args.gb_per_replica, "--gb-per-replica")
        args.loads = _floats(args.speedups, "--speedups")
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    args.trace_names = [t for t in args.traces.split(",") if t]
    args.system_names = [s for s in args.systems.split(",") if s]
    if bad := [t for t in args.trace_names if t not in TRACES]:
        p.error(f"--traces: unknown {bad}; choose from {list(TRACES)}")
    if bad := [s for s in args.system_names if s not in CLUSTER_SYSTEMS]:
        p.error(f"--systems: unknown {bad}; choose from {list(CLUSTER_SYSTEMS)}")
    if args.requests is not None and args.requests < 1:
        p.error(f"--requests must be >= 1, got {args.requests}")
    return args


def base_config(args: argparse.Namespace) -> ClusterConfig:
    """The shared settings of every run (ValueError naming a bad value)."""
    clock = ClusterCost(
        args.prefill_tflops,
        args.transfer_gbps,
        args.transfer_latency_ms / 1e3,
        args.decode_step_ms / 1e3,
        args.decode_batch,
    )
    return ClusterConfig(
        GB,
        args.prefill,
        args.decode,
        args.admission,
        args.eviction,
        args.alpha,
        clock,
        RouteRule(args.load_tokens, args.max_imbalance, args.route_weighs == "kv"),
        check=args.check,
    )


def targets(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (trace, size, load): the share of the gap `both` recovers and the points
    remote hits add (None where a system was not run or there is no gap)."""
    rate = {(r["trace"], r["gb_per_replica"], r["speedup"], r["system"]): r for r in runs}
    out = []
    for trace, gb, speedup in dict.fromkeys(
        (r["trace"], r["gb_per_replica"], r["speedup"]) for r in runs
    ):
        got = {s: rate.get((trace, gb, speedup, s)) for s in (*GAP, *REMOTE)}
        hit = {s: None if r is None else r["token_hit_rate"] for s, r in got.items()}
        gap = None
        if None not in (hit["prefill_only"], hit["colocated"], hit["both"]):
            span = hit["colocated"] - hit["prefill_only"]
            gap = (hit["both"] - hit["prefill_only"]) / span if span > 0 else None
        remote = None
        if hit["mixed"] is not None and hit["mixed+remote"] is not None:
            remote = 100 * (hit["mixed+remote"] - hit["mixed"])
        out.append(
            {
                "trace": trace,
                "gb_per_replica": gb,
                "speedup": speedup,
                "hit": hit,
                "gap_recovered": gap,
                "gap_met": None if gap is None else gap >= GAP_TARGET,
                "remote_points": remote,
                "remote_met": None
                if remote is None or trace != "mooncake"
                else remote >= REMOTE_TARGET,
            }
        )
    return out


def _ms(s: float) -> str:
    return f"{1e3 * s:,.0f}" if s >= 0.01 else f"{1e3 * s:.1f}"


def _busy(utilisation: dict[str, float]) -> str:
    """`P 22%, D 1%`: each computing role's share of time busy (the shared cache of
    `colocated` computes nothing)."""
    short = {"prefill": "P", "decode": "D", "mixed": "M"}
    return ", ".join(f"{short[k]} {100 * v:.0f}%" for k, v in utilisation.items() if k in short)


def system_table(runs: list[dict[str, Any]], trace: str, speedup: float) -> str:
    """Markdown: one row per (size, system) of `trace` at `speedup`."""
    lines = [
        f"{trace}, arrivals x{speedup:g}:",
        "",
        "| total (per replica) | system | token hit rate | TTFT p50 / p99 (ms) | own hit / "
        "suffix on D / pulled / recompute | pulled MB/req | handoff MB/req | busy |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in runs:
        if r["trace"] != trace or r["speedup"] != speedup:
            continue
        routes = r["routes"]
        total = r["cache_bytes"] / GB
        size = f"{total:,.0f} GB ({r['gb_per_replica']:g})"
        lines.append(
            f"| {size} | {r['system']} | {100 * r['token_hit_rate']:.2f}% | "
            f"{_ms(r['ttft_p50_s'])} / {_ms(r['ttft_p99_s'])} | {routes['local']} / "
            f"{routes['decode_suffix']} / {routes['pull']} / {routes['recompute']} | "
            f"{r['pull_bytes_per_request'] / 1e6:,.1f} | {r['pd_bytes_per_request'] / 1e6:,.0f} | "
            f"{_busy(r['utilisation'])} |"
        )
    return "\n".join(lines)


def target_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: the two targets per (trace, size, load)."""

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{100 * v:.2f}%"

    lines = [
        "| trace | GB per replica | arrivals | prefill_only | both | colocated | gap recovered "
        f"(target >= {GAP_TARGET:.0%}) | mixed | mixed+remote | points (target >= "
        f"{REMOTE_TARGET:g} on Mooncake) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in rows:
        h = t["hit"]
        gap = "-" if t["gap_recovered"] is None else f"{100 * t['gap_recovered']:.0f}%"
        pts = "-" if t["remote_points"] is None else f"{t['remote_points']:+.2f}"
        lines.append(
            f"| {t['trace']} | {t['gb_per_replica']:g} | x{t['speedup']:g} | "
            f"{pct(h['prefill_only'])} | {pct(h['both'])} | {pct(h['colocated'])} | {gap} | "
            f"{pct(h['mixed'])} | {pct(h['mixed+remote'])} | {pts} |"
        )
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], path: Path) -> Path:
    """Per (trace, load) a row: token hit rate and TTFT p50 (bars) / p99 (ticks) per
    system, grouped by size."""
    keys = list(dict.fromkeys((r["trace"], r["speedup"]) for r in runs))
    systems = list(dict.fromkeys(r["system"] for r in runs))
    fig = Figure(figsize=(13.0, 3.2 * len(keys)), layout="constrained")
    FigureCanvasAgg(fig)
    width = 0.8 / len(systems)
    for row, (trace, speedup) in enumerate(keys):
        mine = [r for r in runs if r["trace"] == trace and r["speedup"] == speedup]
        sizes = list(dict.fromkeys(r["gb_per_replica"] for r in mine))
        hit_ax = fig.add_subplot(len(keys), 2, 2 * row + 1)
        ttft_ax = fig.add_subplot(len(keys), 2, 2 * row + 2)
        for k, system in enumerate(systems):
            by_size = {r["gb_per_replica"]: r for r in mine if r["system"] == system}
            xs = [
                i + (k - (len(systems) - 1) / 2) * width
                for i, s in enumerate(sizes)
                if s in by_size
            ]
            got = [by_size[s] for s in sizes if s in by_size]
            color = f"C{k}"
            hit_ax.bar(
                xs, [100 * r["token_hit_rate"] for r in got], width, label=system, color=color
            )
            ttft_ax.bar(xs, [1e3 * r["ttft_p50_s"] for r in got], width, color=color, alpha=0.6)
            ttft_ax.plot(xs, [1e3 * r["ttft_p99_s"] for r in got], "_", color=color, ms=12, mew=2)
        for ax in (hit_ax, ttft_ax):
            ax.set_xticks(range(len(sizes)), [f"{s:g} GB/replica" for s in sizes])
            ax.grid(alpha=0.3, axis="y")
        hit_ax.set_title(f"{trace}, arrivals x{speedup:g}: token hit rate")
        hit_ax.set_ylabel("%")
        ttft_ax.set_title("modelled TTFT: p50 (bars), p99 (ticks)")
        ttft_ax.set_ylabel("ms (log)")
        ttft_ax.set_yscale("log")
        if row == 0:
            hit_ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=110)
    return path


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    try:
        base = base_config(args)
    except ValueError as exc:
        sys.exit(f"bad option: {exc}")
    cost = CostModel.from_spec(get_preset(args.model))
    start = time.perf_counter()
    traces = {}
    for name in tqdm(args.trace_names, desc="loading traces", leave=False):
        trace = load_trace(TRACES[name], data_dir=args.data_dir)
        traces[name] = list(trace.requests if args.requests is None else trace.head(args.requests))
    per_trace = len(args.sizes) * len(args.loads) * len(args.system_names)
    total = per_trace * sum(len(r) for r in traces.values())
    runs: list[dict[str, Any]] = []
    with tqdm(total=total, desc="requests replayed", unit="req", disable=None) as bar:
        for name, reqs in traces.items():
            for speedup in args.loads:
                for gb in args.sizes:
                    cfg = dataclasses.replace(
                        base, total_cache_bytes=int(gb * GB) * base.replicas, speedup=speedup
                    )
                    for system in args.system_names:
                        bar.set_postfix_str(f"{name} x{speedup:g} {gb:g} GB {system}")
                        result = run_cluster(
                            reqs, cost, system, cfg, on_request=lambda: bar.update()
                        )
                        rec = {"trace": name, "gb_per_replica": gb, "speedup": speedup}
                        runs.append(rec | result.to_record())
    rows = targets(runs)
    tables = [system_table(runs, name, speedup) for name in traces for speedup in args.loads]
    text = "\n\n".join([*tables, target_table(rows)])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items()},
        "cluster": dataclasses.asdict(base) | {"total_cache_bytes": None},
        "machine": machine(("numpy",)),
        "traces": {n: {"spec": TRACES[n], "requests": len(r)} for n, r in traces.items()},
        "runs": runs,
        "targets": rows,
        "wall_s": time.perf_counter() - start,
    }
    (out / "disagg_replay.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "disagg_replay.md").write_text(text + "\n")
    plot(runs, out / "disagg_replay.png")
    print(
        f"\n{text}\n\nwall time {report['wall_s']:.0f} s; wrote {out}/disagg_replay.{{json,md,png}}"
    )
    return report


if __name__ == "__main__":
    main()
