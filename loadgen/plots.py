"""TTFT plots for one or several systems (PNG, matplotlib's Agg backend)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np


def plot_ttft_cdf(series: Mapping[str, Sequence[float]], path: str | os.PathLike[str]) -> None:
    """One empirical CDF of TTFT (ms, log x axis) per system name in ``series``.

    Systems with no values are listed in the legend as ``(no data)``.
    """
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    try:
        for name, values in series.items():
            arr = np.sort(np.asarray(list(values), dtype=np.float64))
            if arr.size == 0:
                ax.plot([], [], label=f"{name} (no data)")
                continue
            ax.step(arr, np.arange(1, arr.size + 1) / arr.size, where="post", label=name)
        if any(len(v) for v in series.values()):
            ax.set_xscale("log")
        ax.set_xlabel("TTFT (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="lower right")
        ax.set_title("Time to first token")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def plot_ttft_by_turn(
    series: Mapping[str, Mapping[int, float] | Mapping[str, float]], path: str | os.PathLike[str]
) -> None:
    """Mean (or any statistic) TTFT in ms by turn index, one line per system name.

    Turn keys may be ints or their strings (as read back from JSON).
    """
    plot_by_turn(series, path, "TTFT (ms)", "TTFT by conversation turn")


def plot_by_turn(
    series: Mapping[str, Mapping[int, float] | Mapping[str, float]],
    path: str | os.PathLike[str],
    ylabel: str,
    title: str,
) -> None:
    """A value by turn index (int or string keys), one line per name in `series`."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    try:
        for name, by_turn in series.items():
            points = sorted((int(k), float(v)) for k, v in by_turn.items())
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
        ax.set_xlabel("turn index")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left")
        ax.set_title(title)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
