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
