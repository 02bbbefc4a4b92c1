"""The plain-text results table `replay` prints: one row per (system, cache size) + oracle.

When a run had a host tier, three columns follow: its size, the share of input tokens hit
on the host, and the clock's TTFT saved (`core.sim.replay`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = (
    "system",
    "cache GB",
    "token hit %",
    "request hit %",
    "FLOPs saved %",
    "peak/capacity",
    "states admitted",
    "evictions",
    "alpha",
    "wall s",
)
TIER_COLUMNS = ("host GB", "host hit %", "TTFT saved %")
_NA = "-"


def _tier_cells(rec: Mapping[str, Any]) -> list[str]:
    if rec["system"] == "oracle" or rec.get("cache_bytes") is None:
        return [_NA] * len(TIER_COLUMNS)
    n_input = rec["input_tokens"]
    return [
        f"{rec['host_bytes'] / 1e9:g}",
        f"{100 * rec['host_hit_tokens'] / n_input:.2f}" if n_input else _NA,
        f"{100 * rec['ttft_saved_fraction']:.2f}",
    ]


def _row(rec: Mapping[str, Any]) -> list[str]:
    cache = rec.get("cache_bytes")
    if rec["system"] == "oracle" or cache is None:
        return [
            str(rec["system"]),
            "inf",
            f"{100 * rec['token_hit_rate']:.2f}",
            f"{100 * rec['request_hit_rate']:.2f}",
            *([_NA] * (len(COLUMNS) - 4)),
        ]
    return [
        str(rec["system"]),
        f"{cache / 1e9:g}",
        f"{100 * rec['token_hit_rate']:.2f}",
        f"{100 * rec['request_hit_rate']:.2f}",
        f"{100 * rec['flops_saved_fraction']:.2f}",
        f"{rec['peak_bytes'] / cache:.3f}",
        str(rec["states_admitted"]),
        str(rec["evictions"]),
        f"{rec['alpha']:g}",
        f"{rec['wall_s']:.2f}",
    ]


def format_table(records: Sequence[Mapping[str, Any]]) -> str:
    """Aligned columns: text left, numbers right, a rule under the header."""
    rows = [_row(r) for r in records]
    header: tuple[str, ...] = COLUMNS
    if any(r.get("host_bytes") for r in records):
        header = (*COLUMNS, *TIER_COLUMNS)
        rows = [[*row, *_tier_cells(r)] for row, r in zip(rows, records, strict=True)]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])
