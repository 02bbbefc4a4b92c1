"""The report of `bench_cluster.py`: verdicts against the targets, the table of figures
side by side, and the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster_load import VARIANTS
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure


def verdicts(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: the figure, the target and whether it is met."""
    rows = []
    if sc := report.get("scaling"):
        rs = sorted(sc, key=int)
        lo, hi = sc[rs[0]]["indexed"], sc[rs[-1]]["indexed"]
        ratio = hi["pair"]["p50_ms"] / lo["pair"]["p50_ms"]  # the median: robust to load
        what = f"p50 per pair at {rs[-1]} / at {rs[0]} replicas (indexed)"
        rows.append({"figure": what, "value": ratio, "target": "<= 1.5", "met": ratio <= 1.5})
        n = hi["pairs_s"]
        what = f"pairs/s in process at {rs[-1]} replicas"
        rows.append({"figure": what, "value": n, "target": ">= 3,000", "met": n >= 3000})
    ry = report.get("ray") or {}
    all_runs = ry.get("runs", [])
    mode = "relay" if any(r.get("commits") == "relay" for r in all_runs) else "replica"
    runs = {r["coordinators"]: r for r in all_runs if r.get("commits", "replica") == mode}
    if "indexed" in ry:
        n = runs[1]["pairs_s"] if 1 in runs else ry["indexed"]["pairs_s"]
        what = f"pairs/s through Ray, {ry['replicas']} replicas, {ry['callers']} callers"
        rows.append({"figure": f"{what} ({mode})", "value": n, "target": ">= 1,000",
                     "met": n >= 1000})  # fmt: skip
    if 1 in runs:
        cpu = runs[1]["coordinator_cpu_ms_per_pair"]
        what = f"coordinator CPU ms per pair through Ray, K = 1 ({mode} commits)"
        rows.append({"figure": what, "value": cpu, "target": "<= 0.6", "met": cpu <= 0.6})
    if 1 in runs and 2 in runs:
        ratio = runs[2]["coordinator_cpu_ms_per_pair"] / runs[1]["coordinator_cpu_ms_per_pair"]
        what = f"coordinator CPU per pair, K = 2 summed / K = 1 ({mode})"
        rows.append({"figure": what, "value": ratio, "target": "<= 1.1", "met": ratio <= 1.1})
        share = runs[2]["busiest_share"]
        what = "busiest coordinator's share of the plans, K = 2"
        rows.append({"figure": what, "value": share, "target": "<= 0.6", "met": share <= 0.6})
    return rows


def table(report: dict[str, Any]) -> str:
    lines = []
    if sc := report.get("scaling"):
        one = sc[min(sc, key=int)]
        head = f"{'R':>5} {'variant':>10} {'pairs/s':>9} {'mean ms':>8} {'p50 ms':>8} {'p99 ms':>8}"
        lines += ["in process (plan + commit, one at a time):"]
        lines += [head + "  p50 vs R=1  reference/indexed (p50)"]
        for r in sorted(sc, key=int):
            for name, f in sc[r].items():
                p = f["pair"]
                rel = p["p50_ms"] / one[name]["pair"]["p50_ms"]
                cells = f"{f['pairs_s']:>9,.0f} {p['mean_ms']:>8.3f} {p['p50_ms']:>8.3f}"
                extra = ""
                if name == "reference" and "indexed" in sc[r]:
                    extra = f"{p['p50_ms'] / sc[r]['indexed']['pair']['p50_ms']:>18.2f}x"
                row = f"{r:>5} {name:>10} {cells} {p['p99_ms']:>8.3f} {rel:>10.2f}x{extra}"
                lines.append(row)
    if ry := report.get("ray"):
        lines += [
            "",
            f"through Ray ({ry['replicas']} replicas, {ry['callers']} callers, plan_many):",
        ]
        for name in VARIANTS:
            if f := ry.get(name):
                p = f["pair"]
                lines.append(
                    f"{name:>10} {f['pairs_s']:>9,.0f} pairs/s  p50 {p['p50_ms']:.2f} ms  "
                    f"p99 {p['p99_ms']:.2f} ms  {f['plans_per_call']:.1f} plans/call"
                )
                cpu = ", ".join(f"{k} {v:.2f}" for k, v in f.get("cpu_ms_per_pair", {}).items())
                lines.append(f"{'':>10} CPU ms per pair: {cpu}")
        for run in ry.get("runs", []):
            lines.append(
                f"{'K = ' + str(run['coordinators']):>6} {run.get('commits', 'replica'):>7} "
                f"{run['pairs_s']:>9,.0f} pairs/s  {run.get('calls_per_pair', 0):.2f} calls/pair  "
                f"p50 {run['p50_ms']:.2f} ms  p99 {run['p99_ms']:.2f} ms  coordinator CPU "
                f"{run['coordinator_cpu_ms_per_pair']:.2f} ms/pair (all of them), driver "
                f"{run['driver_cpu_ms_per_pair']:.2f}, busiest {run['busiest_share']:.0%}"
            )
    lines.append("")
    for v in report["targets"]:
        verdict = "met" if v["met"] else "MISSED"
        lines.append(f"{v['figure']:52} {v['value']:>9,.2f}  {v['target']:>8}  {verdict}")
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    """pairs/s and p50 / p99 per pair against the replica count (in process), and the
    Ray figures, each variant its own series."""
    fig = Figure(figsize=(13, 3.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    if sc := report.get("scaling"):
        rs = sorted(sc, key=int)
        for name in VARIANTS:
            if name in sc[rs[0]]:
                xs = [int(r) for r in rs]
                axes[0].plot(xs, [sc[r][name]["pairs_s"] for r in rs], "o-", label=name)
                c = f"C{list(VARIANTS).index(name)}"
                p50 = [sc[r][name]["pair"]["p50_ms"] for r in rs]
                axes[1].plot(xs, p50, "o-", c=c, label=f"{name} p50")
                p99 = [sc[r][name]["pair"]["p99_ms"] for r in rs]
                axes[1].plot(xs, p99, "o--", c=c, alpha=0.6, label=f"{name} p99")
        axes[0].axhline(3000, ls="--", c="gray", lw=1, label="target 3,000/s")
        for ax, what in zip(
            axes[:2], ("pairs/s in process", "ms per pair (p50, p99)"), strict=True
        ):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("registered replicas")
            ax.set_title(what)
            ax.legend()
    if ry := report.get("ray"):
        names = [n for n in VARIANTS if n in ry]
        axes[2].bar(names, [ry[n]["pairs_s"] for n in names], color=["C0", "C1"][: len(names)])
        axes[2].axhline(1000, ls="--", c="gray", lw=1)
        axes[2].set_title(f"pairs/s through Ray, {ry['replicas']} replicas")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
