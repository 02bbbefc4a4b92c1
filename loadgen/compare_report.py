"""The analysis side of the end-to-end comparison (`benchmarks/compare_systems.py`, also
reached as `marconi-loadgen compare`): the simulator's requests for a system's served
records, one table row per system, the Markdown table, the headline P95 ratios, and
`write_report` (`compare.json`, `compare.md` and the TTFT plots).

Nothing here deploys or reaches into the service: what the report needs beyond the load
runs (each system's cost model and the replay run matching its deployment: system,
capacity, alpha, tuner) comes in as plain `marconi_ray.core` values from the caller
(`SystemRun`), which the deployer reads from its own coordinator and settings. The live
side comes over HTTP only (`/metrics`, in each run's `server_before`/`server_after`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from loadgen.config import RequestRecord
from marconi_ray.core.cache.systems import get_system
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.sim.replay import RunConfig, RunResult, run_replay
from marconi_ray.traces.trace import Request

if TYPE_CHECKING:
    from loadgen.runner import LoadResult


def parse_systems(text: str) -> tuple[str, ...]:
    """`a,b,c` -> names, each a known system, no repeats; ValueError naming the value."""
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    if not names:
        raise ValueError(f"--systems must name at least one system, got {text!r}")
    for name in names:
        get_system(name)  # ValueError naming it
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"--systems names {dupes} more than once (got {text!r})")
    return names


def served_records(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The successful requests in completion order (when the server committed them)."""
    done = [r for r in records if r.error is None and r.e2el_ms is not None and r.input_ids]
    return sorted(done, key=lambda r: (r.start_s + (r.e2el_ms or 0.0) / 1000.0, r.start_s))


def sim_requests(records: Sequence[RequestRecord]) -> list[Request]:
    """The simulator's `Request`s for what the server served: each successful record's
    exact input/output ids, in completion order, `ts` = its completion time."""
    out = []
    for r in served_records(records):
        end = r.start_s + (r.e2el_ms or 0.0) / 1000.0
        out.append(
            Request(
                r.session_id,
                r.turn,
                max(0.0, end),
                np.asarray(r.input_ids, np.int32),
                np.asarray(r.output_ids, np.int32),
            )
        )
    return out


def simulate(records: Sequence[RequestRecord], cost: CostModel, run: RunConfig) -> RunResult:
    """The replay simulator's prediction over exactly the requests the server served
    (`sim_requests`), with the live cache's cost model and the run matching its
    deployment (both plain values from the caller)."""
    return run_replay(sim_requests(records), cost, run)


def relative_p95(rows: Mapping[str, Mapping[str, Any]], a: str, b: str) -> str | None:
    """`"a P95 TTFT is 62% lower than b"` (or higher), None when either is missing."""
    pa = rows.get(a, {}).get("ttft_p95_ms")
    pb = rows.get(b, {}).get("ttft_p95_ms")
    if pa is None or pb is None or pb <= 0:
        return None
    change = (pb - pa) / pb * 100.0
    word = "lower" if change >= 0 else "higher"
    return f"{a} P95 TTFT is {abs(change):.0f}% {word} than {b}"


def _get(d: Mapping[str, Any] | None, *keys: str) -> Any:
    """The first of `keys` present in `d` (None when none is)."""
    for key in keys:
        if d and d.get(key) is not None:
            return d[key]
    return None


def _one(value: Any) -> Any:
    """A per-replica `{replica: value}` of one replica as its value (else unchanged)."""
    if isinstance(value, Mapping) and len(value) == 1:
        return next(iter(value.values()))
    return value


def system_row(
    summary: Mapping[str, Any],
    server: Mapping[str, Any] | None,
    sim: RunResult | None,
) -> dict[str, Any]:
    """One system's line of `compare.json` from its run summary, its server-side
    `/metrics` delta and the simulator's prediction."""
    ttft = summary.get("ttft_ms") or {}
    measured = _get(server, "token_hit_rate", "hit_rate")
    predicted = None if sim is None else sim.token_hit_rate
    diff = None if measured is None or predicted is None else predicted - measured
    return {
        "requests": summary.get("requests"),
        "completed": summary.get("completed"),
        "failed": summary.get("failed"),
        "errors": summary.get("errors"),
        "ttft_mean_ms": ttft.get("mean"),
        "ttft_p50_ms": ttft.get("p50"),
        "ttft_p95_ms": ttft.get("p95"),
        "ttft_p99_ms": ttft.get("p99"),
        "request_throughput": summary.get("request_throughput"),
        "output_throughput": summary.get("output_throughput"),
        "server_hit_rate": measured,
        "client_hit_rate": summary.get("client_token_hit_rate"),
        "sim_hit_rate": predicted,
        "sim_minus_server": diff,
        "evictions": _get(server, "evictions"),
        "sim_evictions": None if sim is None else sim.evictions,
        "final_alpha": _one(_get(server, "alpha", "final_alpha")),
        "sim_alpha": None if sim is None else sim.alpha,
    }


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """The comparison as a Markdown table, one line per system."""
    head = (
        "| system | P50 TTFT ms | P95 TTFT ms | P99 TTFT ms | mean TTFT ms | req/s | "
        "out tok/s | server hit | client hit | sim hit | sim - server | evictions | alpha "
        "| failed |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for name, r in rows.items():
        cells = [
            name,
            _fmt(r["ttft_p50_ms"], ".0f"),
            _fmt(r["ttft_p95_ms"], ".0f"),
            _fmt(r["ttft_p99_ms"], ".0f"),
            _fmt(r["ttft_mean_ms"], ".0f"),
            _fmt(r["request_throughput"], ".3f"),
            _fmt(r["output_throughput"], ".1f"),
            _fmt(r["server_hit_rate"], ".4f"),
            _fmt(r["client_hit_rate"], ".4f"),
            _fmt(r["sim_hit_rate"], ".4f"),
            _fmt(r["sim_minus_server"], "+.4f"),
            _fmt(r["evictions"], ".0f"),
            _fmt(r["final_alpha"], "g") if not isinstance(r["final_alpha"], dict) else "*",
            _fmt(r["failed"], ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def relative_lines(rows: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """marconi's P95 TTFT against vanilla and vllm+ (the headline ratios)."""
    pairs = [("marconi", "vanilla"), ("marconi", "vllm+"), ("marconi", "sglang+")]
    return [s for a, b in pairs if (s := relative_p95(rows, a, b)) is not None]


# ---------------------------------------------------------------- the report
@dataclass
class SystemRun:
    """What one system's live run leaves behind for the report: the load run, the cost
    model its cache priced with, and the replay run matching its deployment (system,
    capacity, alpha, tuner window). The service publishes neither of the last two over
    HTTP, so the caller that deployed it passes them as plain values."""

    result: LoadResult
    cost: CostModel
    sim: RunConfig


def write_report(
    runs: Mapping[str, SystemRun], out: Path, config: Mapping[str, Any]
) -> dict[str, Any]:
    """Simulate each system's served requests; write `out/compare.json` (`config` plus the
    first system's `cost_model`, one row per system, the headline ratios), `compare.md`,
    `ttft_cdf.png` and `ttft_by_turn.png`; return the JSON document."""
    from loadgen.plots import plot_ttft_by_turn, plot_ttft_cdf
    from loadgen.server_metrics import delta

    rows: dict[str, dict[str, Any]] = {}
    cdf: dict[str, list[float]] = {}
    by_turn: dict[str, dict[int, float]] = {}
    for name, run in runs.items():
        res = run.result
        sim = simulate(res.records, run.cost, run.sim)
        server = None
        if res.server_before is not None and res.server_after is not None:
            server = delta(res.server_before, res.server_after)
        rows[name] = system_row(res.summary, server, sim)
        rows[name]["wall_s"] = res.wall_s
        cdf[name] = [
            r.ttft_ms for r in res.records if r.error is None and not r.warmup and r.ttft_ms
        ]
        turns = res.summary.get("ttft_by_turn_ms") or {}
        by_turn[name] = {int(t): float(v["mean"]) for t, v in turns.items()}
    relative = relative_lines(rows)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": {
            **config,
            "cost_model": asdict(next(iter(runs.values())).cost) if runs else None,
        },
        "systems": rows,
        "relative": relative,
    }
    (out / "compare.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    table = markdown_table(rows)
    (out / "compare.md").write_text(table + "\n\n" + "\n".join(relative) + "\n")
    plot_ttft_cdf(cdf, out / "ttft_cdf.png")
    plot_ttft_by_turn(by_turn, out / "ttft_by_turn.png")
    return doc
