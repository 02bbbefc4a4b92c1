"""Writing a run to a folder: ``requests.jsonl``, ``summary.json`` and two PNGs."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from loadgen.config import RequestRecord
from loadgen.plots import plot_ttft_by_turn, plot_ttft_cdf
from loadgen.runner import LoadResult

LABEL = "run"


def record_dict(record: RequestRecord) -> dict[str, Any]:
    """All fields of ``record`` plus its ``tpot_ms`` (one line of ``requests.jsonl``)."""
    out = asdict(record)
    out["tpot_ms"] = record.tpot_ms
    return out


def write_run(result: LoadResult, out_dir: Path) -> None:
    """Write ``requests.jsonl`` (one record per line, launch order), ``summary.json``
    (the summary plus ``wall_s`` and the raw ``server_before``/``server_after`` scrapes),
    ``ttft_cdf.png`` and ``ttft_by_turn.png`` into ``out_dir`` (created if missing)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "requests.jsonl", "w", encoding="utf-8") as f:
        for rec in result.records:
            f.write(json.dumps(record_dict(rec)) + "\n")
    summary = dict(result.summary)
    summary.update(
        wall_s=result.wall_s, server_before=result.server_before, server_after=result.server_after
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    ttfts = [
        r.ttft_ms
        for r in result.records
        if not r.warmup and r.error is None and r.ttft_ms is not None
    ]
    plot_ttft_cdf({LABEL: ttfts}, out / "ttft_cdf.png")
    by_turn = result.summary.get("ttft_by_turn_ms", {})
    plot_ttft_by_turn(
        {LABEL: {int(k): v["mean"] for k, v in by_turn.items()}}, out / "ttft_by_turn.png"
    )
