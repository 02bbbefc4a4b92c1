"""Replay of the SWE-bench agent trace with the cost model of every hybrid of the fleet.

The machinery of `replay_qwen.py` (same options, runs, JSON record and tables) with the
fleet's defaults: every preset (`marconi-ray replay --model` names them), the SWE-bench
trace (50 mini-swe-agent trajectories) at 10, 20, 50 and 100 GB, and vllm+ / sglang+ /
marconi (alpha tuned as the replay tunes it). On top of the hit-rate tables: for each
preset the size of one state in tokens of KV, and marconi's lead over sglang+ at each size.

    .venv/bin/python benchmarks/replay_fleet.py                  # defaults: 1 process
    .venv/bin/python benchmarks/replay_fleet.py --models lfm2-2.6b,falcon-h1-7b --jobs 2
    .venv/bin/python benchmarks/replay_fleet.py --from-json OUT/fleet_replay.json  # redraw

Writes OUT/fleet_replay.json (every run's record, the oracle, the model table),
OUT/fleet_replay.md (the tables as printed), OUT/fleet_hit_rates.png (hit rate against
cache size, one panel per preset) and OUT/fleet_lead.png (marconi's lead over sglang+
against the size of one state). Needs the shared data folder (../shared/data or
$MARCONI_DATA_DIR).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay_qwen as rq

from marconi_ray.core.model.presets import PRESETS

DEFAULT_SYSTEMS = "vllm+,sglang+,marconi"
DEFAULT_SIZES = "10,20,50,100"
LEADER, BASELINE = "marconi", "sglang+"


def parse_args(argv: Sequence[str] | None = None) -> Any:
    """The options of `replay_qwen.py` with the fleet's defaults, plus --from-json (see
    --help)."""
    parser = rq.build_parser(
        __doc__.split("\n\n")[0],
        models=",".join(PRESETS),
        systems=DEFAULT_SYSTEMS,
        traces="swebench",
        swe_sizes=DEFAULT_SIZES,
        jobs=1,
        out="benchmarks/results/fleet_replay",
    )
    parser.add_argument(
        "--from-json",
        metavar="FILE",
        default=None,
        help="redraw the tables and plots from a fleet_replay.json written before, into "
        "--out, without replaying (the run options are then ignored)",
    )
    return rq.parse_args(argv, parser)


def leads(report: dict[str, Any], trace: str) -> list[dict[str, Any]]:
    """Per preset of `report` (in its order): one state in tokens of KV and, per cache size
    of `trace`, marconi's token hit rate minus sglang+'s in points (None where either
    system was not run)."""
    runs = report["traces"][trace]["runs"]
    rate = {(r["model"], r["cache"], r["system"]): 100 * r["token_hit_rate"] for r in runs}
    caches = list(dict.fromkeys(r["cache"] for r in runs))
    rows = []
    for m in report["models"]:
        lead: dict[str, float | None] = {}
        for cache in caches:
            a, b = rate.get((m["model"], cache, LEADER)), rate.get((m["model"], cache, BASELINE))
            lead[cache] = None if a is None or b is None else a - b
        rows.append(
            {"model": m["model"], "state_tokens": m["tokens_of_kv_per_state"], "lead": lead}
        )
    return rows


def lead_table(report: dict[str, Any]) -> str:
    """Markdown: per trace, presets sorted by the size of one state, marconi - sglang+ at
    each cache size and the largest of those."""
    lines: list[str] = []
    for trace in report["traces"]:
        rows = sorted(leads(report, trace), key=lambda r: r["state_tokens"])
        if not rows:
            continue
        caches = list(rows[0]["lead"])
        lines += [
            "",
            f"{trace}: marconi's lead over sglang+ (token hit rate points), presets by the "
            "size of one state",
            "",
            "| model | one state = tokens of KV | " + " | ".join(caches) + " | largest |",
            "| --- | --- | " + " | ".join("---" for _ in caches) + " | --- |",
        ]
        for row in rows:
            values = [v for v in row["lead"].values() if v is not None]
            cells = ["-" if v is None else f"{v:+.2f}" for v in row["lead"].values()]
            cells.append(f"{max(values):+.2f}" if values else "-")
            size = _tokens(row["state_tokens"])
            lines.append(f"| {row['model']} | {size} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_hit_rates(report: dict[str, Any], trace: str, path: Path) -> None:
    """One panel per preset: token hit rate against cache size (in the report's unit, log
    scale), one line per system, the oracle dashed; panels ordered by the size of one
    state."""
    runs = report["traces"][trace]["runs"]
    models = sorted(report["models"], key=lambda m: m["tokens_of_kv_per_state"])
    cols = min(4, len(models))
    rows = math.ceil(len(models) / cols)
    fig = Figure(figsize=(3.3 * cols, 2.9 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    oracle = 100 * float(report["traces"][trace]["oracle"]["token_hit_rate"])
    sizes = sorted({_size(r["cache"]) for r in runs})
    unit = "GB" if report.get("unit", "gb") == "gb" else "states of each preset"
    for k, m in enumerate(models):
        ax = fig.add_subplot(rows, cols, k + 1)
        for system in report["systems"]:
            points = sorted(
                (_size(r["cache"]), 100 * r["token_hit_rate"])
                for r in runs
                if r["model"] == m["model"] and r["system"] == system
            )
            ax.plot(*zip(*points, strict=True), marker="o", markersize=3, label=system)
        ax.axhline(oracle, linestyle="--", color="black", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xticks(sizes, [f"{x:g}" for x in sizes])
        ax.minorticks_off()
        ax.set_ylim(0, 100)
        ax.set_title(
            f"{m['model']}\none state = {_tokens(m['tokens_of_kv_per_state'])} tokens of KV",
            fontsize=8,
        )
        ax.tick_params(labelsize=7)
        if k % cols == 0:
            ax.set_ylabel("token hit rate (%)", fontsize=8)
        if k >= len(models) - cols:
            ax.set_xlabel(f"cache ({unit})", fontsize=8)
        if k == 0:
            ax.legend(fontsize=7)
    fig.suptitle(f"{trace}: token hit rate by cache size (dashed: oracle)", fontsize=10)
    fig.savefig(path, format="png", dpi=110)


def plot_lead(report: dict[str, Any], trace: str, path: Path) -> None:
    """Marconi's lead over sglang+ per preset, presets ordered by the size of one state
    (named under each, in tokens of KV): one marker per cache size, and a line through
    each preset's largest lead."""
    rows = sorted(leads(report, trace), key=lambda r: r["state_tokens"])
    caches = list(rows[0]["lead"]) if rows else []
    fig = Figure(figsize=(10, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.5 / max(1, len(caches))
    for j, cache in enumerate(caches):
        pts = [(i, r["lead"][cache]) for i, r in enumerate(rows) if r["lead"][cache] is not None]
        xs = [i + (j - (len(caches) - 1) / 2) * width for i, _ in pts]
        ax.plot(xs, [v for _, v in pts], "o", alpha=0.85, label=cache)
    largest = [max((v for v in r["lead"].values() if v is not None), default=0.0) for r in rows]
    ax.plot(range(len(rows)), largest, "-", color="black", linewidth=1, label="largest")
    ax.axhline(0, color="gray", linewidth=0.8)
    labels = [f"{r['model']}\n{_tokens(r['state_tokens'])} tok" for r in rows]
    ax.set_xticks(range(len(rows)), labels, rotation=35, ha="right", fontsize=7)
    ax.set_xlabel("preset, by the size of one state (tokens of KV)")
    ax.set_ylabel("marconi - sglang+ (token hit rate points)")
    ax.set_title(f"{trace}: marconi's lead over sglang+ by the size of one state", fontsize=10)
    ax.legend(title="cache", fontsize=8)
    fig.savefig(path, format="png", dpi=110)


def _size(label: str) -> float:
    """The number of a cache label ("10 GB", "75 states")."""
    return float(label.split()[0])


def _tokens(value: float) -> str:
    """A state size in tokens of KV: one decimal below 100; a model with no KV at all
    (a pure SSM, whose ratio is infinite) is said so."""
    if math.isinf(value):
        return "no KV"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.from_json is None:
        report = rq.replay(args)
    else:
        report = json.loads(Path(args.from_json).read_text())
    report["leads"] = {trace: leads(report, trace) for trace in report["traces"]}
    text = rq.tables(report) + lead_table(report)
    (out / "fleet_replay.json").write_text(json.dumps(report, indent=1, default=float))
    (out / "fleet_replay.md").write_text(text)
    trace = next(iter(report["traces"]))
    plot_hit_rates(report, trace, out / "fleet_hit_rates.png")
    plot_lead(report, trace, out / "fleet_lead.png")
    sys.stdout.write(text)
    sys.stdout.write(
        f"wrote {out}/fleet_replay.json, fleet_replay.md, fleet_hit_rates.png and fleet_lead.png\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
