"""bench_core.py section 7: a host tier next to its floors, measured in one run.

Per trace and device size: `marconi+` with 0, then each host size of memory in a second
tier (FLOP-aware placement), next to (a) the same bytes in one device tier, (b) LRU
placement (same system, every victim demoted, HiCache/LMCache-style) and (c) all-LRU
(`sglang+`: LRU eviction and LRU placement). Each run also reports the clock's TTFT
(`core.sim.replay`: prefill at 400 TFLOP/s, host copies at 50 GB/s).

Alpha is fixed at 0 in every run: the bootstrap tuner picks alphas by window replays
whose outcome differs between a 20 GB and a 520 GB cache for reasons of its own (on
Mooncake it picks 1.8 for one 520 GB tier and loses 7.8 points to alpha 0), which would
hide what the tiers do."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from marconi_ray.core.sim.replay import RunConfig, RunResult

GB = 10**9
SYSTEM = "marconi+"
ALL_LRU = "sglang+"
ALPHA = 0.0
VARIANTS = ("two-tier", "one tier", "LRU placement", "all-LRU")


@dataclass(frozen=True)
class TierCase:
    """One trace's grid: device sizes x host sizes (0 = the device-only run)."""

    trace: str
    devices: tuple[int, ...]
    hosts: tuple[int, ...]


CASES = (
    TierCase("mooncake", (20 * GB, 50 * GB), (0, 200 * GB, 500 * GB, 1000 * GB)),
    TierCase("mooncake-chained", (20 * GB, 50 * GB), (0, 200 * GB, 500 * GB, 1000 * GB)),
    TierCase("swebench", (10 * GB, 20 * GB), (0, 40 * GB, 100 * GB)),
    TierCase("sharegpt", (1 * GB, 2 * GB), (0, 4 * GB, 10 * GB)),
)


def configs(case: TierCase) -> list[tuple[tuple[int, int, str], RunConfig]]:
    """Every run of `case`, keyed (device, host, variant)."""
    out: list[tuple[tuple[int, int, str], RunConfig]] = []
    for device in case.devices:
        for host in case.hosts:
            out.append(
                ((device, host, "two-tier"), RunConfig(SYSTEM, device, ALPHA, host_bytes=host))
            )
            if not host:
                continue
            out.append(((device, host, "one tier"), RunConfig(SYSTEM, device + host, ALPHA)))
            out.append(
                (
                    (device, host, "LRU placement"),
                    RunConfig(SYSTEM, device, ALPHA, host_bytes=host, placement="lru"),
                )
            )
            out.append(
                (
                    (device, host, "all-LRU"),
                    RunConfig(ALL_LRU, device, ALPHA, host_bytes=host, placement="lru"),
                )
            )
    return out


def rows(
    case: TierCase, keyed: Sequence[tuple[int, int, str]], results: Sequence[RunResult]
) -> list[dict[str, Any]]:
    """One row per (device, host): each variant's token hit rate, host hit share,
    modelled TTFT and TTFT saved, and the ratios the targets name."""
    by = dict(zip(keyed, results, strict=True))
    out: list[dict[str, Any]] = []
    for device in case.devices:
        alone = by[(device, 0, "two-tier")]
        for host in case.hosts:
            row: dict[str, Any] = {"device_gb": device / GB, "host_gb": host / GB}
            for variant in VARIANTS:
                r = by.get((device, host, variant))
                if r is None:
                    continue
                row[variant] = {
                    "token_hit_rate": r.token_hit_rate,
                    "host_hit_share": r.host_hit_tokens / max(r.hit_tokens, 1),
                    "ttft_mean_s": r.ttft_mean_s,
                    "ttft_p95_s": r.ttft_p95_s,
                    "ttft_saved_fraction": r.ttft_saved_fraction,
                    "demotions": r.demotions,
                    "promotions": r.promotions,
                    "host_evictions": r.host_evictions,
                    "copied_gb": (r.demoted_bytes + r.promoted_bytes) / GB,
                }
            two = row["two-tier"]["token_hit_rate"]
            row["vs_device_only"] = two - alone.token_hit_rate
            if host:
                row["vs_one_tier"] = two / max(row["one tier"]["token_hit_rate"], 1e-12)
                row["vs_lru_placement"] = two - row["LRU placement"]["token_hit_rate"]
                row["vs_all_lru"] = two - row["all-LRU"]["token_hit_rate"]
            out.append(row)
    return out


def _pct(row: dict[str, Any], variant: str) -> str:
    r = row.get(variant)
    return f"{100 * r['token_hit_rate']:>8.2f}" if r else f"{'-':>8}"


def print_rows(trace: str, table: Sequence[dict[str, Any]]) -> None:
    print(f"\n{trace}: token hit rate % (two-tier = {SYSTEM}, FLOP-aware placement)")
    head = (
        f"{'device':>7} {'host':>6} | {'two-tier':>8} {'one tier':>8} {'LRU pl.':>8} "
        f"{'all-LRU':>8} | {'2t/1t':>6} {'2t-LRU':>7} | {'host hit':>8} {'TTFT mean':>9} "
        f"{'P95':>7} {'saved':>6}"
    )
    print(head)
    for row in table:
        two = row["two-tier"]
        ratio = f"{row['vs_one_tier']:>5.3f}x" if "vs_one_tier" in row else f"{'-':>6}"
        lru = (
            f"{100 * row['vs_lru_placement']:>+7.2f}" if "vs_lru_placement" in row else f"{'-':>7}"
        )
        print(
            f"{row['device_gb']:>5g}GB {row['host_gb']:>4g}GB | {_pct(row, 'two-tier')} "
            f"{_pct(row, 'one tier')} {_pct(row, 'LRU placement')} {_pct(row, 'all-LRU')} | "
            f"{ratio} {lru} | "
            f"{100 * two['host_hit_share']:>7.1f}% {1e3 * two['ttft_mean_s']:>7.1f}ms "
            f"{1e3 * two['ttft_p95_s']:>5.0f}ms {100 * two['ttft_saved_fraction']:>5.1f}%"
        )


def plot(tables: dict[str, list[dict[str, Any]]], path: Path) -> Path:
    """Token hit rate vs host GB, one panel per trace, a line per (device, variant)."""
    fig = Figure(figsize=(12.0, 8.0), layout="constrained")
    FigureCanvasAgg(fig)
    for i, (trace, table) in enumerate(tables.items()):
        ax = fig.add_subplot(2, 2, i + 1)
        for device in sorted({row["device_gb"] for row in table}):
            mine = [row for row in table if row["device_gb"] == device]
            for variant, style in zip(VARIANTS, ("-o", "--s", ":^", "-.v"), strict=True):
                pts = [
                    (r["host_gb"], 100 * r[variant]["token_hit_rate"]) for r in mine if variant in r
                ]
                if variant in ("one tier", "LRU placement"):  # at 0 GB: the same run
                    pts = [(0.0, 100 * mine[0]["two-tier"]["token_hit_rate"]), *pts]
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, style, label=f"{device:g} GB {variant}")
        ax.set_title(trace)
        ax.set_xlabel("host tier (GB; one tier: the same bytes added to the device)")
        ax.set_ylabel("token hit rate (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.savefig(path, dpi=110)
    return path


def run(
    traces: dict[str, Any],
    cost: Any,
    sweep: Callable[[Any, Any, list[RunConfig], str], list[RunResult]],
    out: Path,
) -> dict[str, Any]:
    """Section 7 over `traces` (name -> requests); `sweep(requests, cost, configs, desc)`
    runs configs in parallel. Returns the report's `two_tier` part and writes the plot."""
    report: dict[str, Any] = {}
    tables: dict[str, list[dict[str, Any]]] = {}
    for case in CASES:
        if case.trace not in traces:
            continue
        grid = configs(case)
        results = sweep(traces[case.trace], cost, [cfg for _, cfg in grid], f"tiers {case.trace}")
        table = rows(case, [key for key, _ in grid], results)
        print_rows(case.trace, table)
        tables[case.trace] = table
        report[case.trace] = {"rows": table, "records": [r.to_record() for r in results]}
    if tables:
        plot(tables, out / "two_tier_hit_rates.png")
    return report
