"""Token hit rate vs cache size, one line per system (PNG through matplotlib's Agg canvas).

Uses `Figure` + `FigureCanvasAgg` directly, so it neither needs a display nor touches
pyplot's global state.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter


def _by_system(records: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """system -> [(cache GB, token hit %)] sorted by size (oracle rows skipped)."""
    lines: dict[str, list[tuple[float, float]]] = {}
    for rec in records:
        if rec["system"] == "oracle" or rec.get("cache_bytes") is None:
            continue
        point = (rec["cache_bytes"] / 1e9, 100.0 * rec["token_hit_rate"])
        lines.setdefault(str(rec["system"]), []).append(point)
    return {name: sorted(points) for name, points in lines.items()}


def plot_hit_rate_vs_cache(
    records: Sequence[Mapping[str, Any]],
    path: str | os.PathLike[str],
    title: str,
    oracle_hit_rate: float | None = None,
) -> Path:
    """Write the plot of `records` (results.json rows) to `path`; return the path.

    Args:
        records: rows with `system`, `cache_bytes` and `token_hit_rate` (a fraction);
            rows of system `oracle` are skipped (pass its rate as `oracle_hit_rate`).
        path: the PNG to write.
        title: the plot title (name the trace and model).
        oracle_hit_rate: drawn as a dashed horizontal line when given (a fraction).
    """
    fig = Figure(figsize=(7.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    sizes: set[float] = set()
    for name, points in _by_system(records).items():
        xs, ys = zip(*points, strict=True)
        ax.plot(xs, ys, marker="o", label=name)
        sizes.update(xs)
    if oracle_hit_rate is not None:
        ax.axhline(100.0 * oracle_hit_rate, linestyle="--", color="black", label="oracle")
    ax.set_xscale("log")
    ticks = sorted(sizes)
    ax.set_xticks(ticks, [f"{x:g}" for x in ticks])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("cache size (GB)")
    ax.set_ylabel("token hit rate (%)")
    ax.set_ylim(bottom=-2.0, top=102.0)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="best")
    out = Path(path)
    fig.savefig(out, format="png", dpi=120)
    return out


def plot_eviction_decisions(
    decisions: Sequence[Any], path: str | os.PathLike[str], title: str
) -> Path:
    """Write two panels to `path`: each victim's normalised recency vs efficiency (leaves
    and inner nodes apart; LRU would have taken those at recency 0), and per window of
    requests the share of decisions where the efficiency term changed LRU's choice.

    Args:
        decisions: `core.cache.explain.Decision`s, in order.
    """
    fig = Figure(figsize=(11.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    for leaf, colour, label in ((True, "tab:blue", "leaf"), (False, "tab:orange", "inner")):
        pts = [(d.recency, d.efficiency) for d in decisions if d.leaf == leaf]
        if pts:
            xs, ys = zip(*pts, strict=True)
            left.scatter(xs, ys, s=6, alpha=0.5, color=colour, label=f"{label} ({len(pts)})")
    left.set_xlabel("victim's normalised recency (0 = least recent candidate)")
    left.set_ylabel("victim's normalised FLOP efficiency")
    left.set_title("what each eviction took")
    if decisions:
        left.legend(loc="upper right")
    if decisions:
        last = max(d.request for d in decisions) + 1
        width = max(1, last // 40)
        bins: dict[int, list[bool]] = {}
        for d in decisions:
            bins.setdefault(d.request // width, []).append(d.lru_rank > 0)
        xs2 = [k * width for k in sorted(bins)]
        ys2 = [100.0 * sum(bins[k]) / len(bins[k]) for k in sorted(bins)]
        right.plot(xs2, ys2, marker="o", markersize=3)
    right.set_xlabel("request")
    right.set_ylabel("decisions not LRU's choice (%)")
    right.set_ylim(-2, 102)
    right.set_title("where the FLOP term changed the choice")
    fig.suptitle(title)
    out = Path(path)
    fig.savefig(out, dpi=110)
    return out
