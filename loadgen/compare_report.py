"""The pure side of `marconi-loadgen compare`: the simulator's requests and settings for a
system's served records, one table row per system, the Markdown table and the headline
P95 ratios."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from loadgen.config import RequestRecord
from marconi_ray.core.replay import RunConfig, RunResult
from marconi_ray.core.systems import get_system
from marconi_ray.core.trace import Request
from marconi_ray.core.tuner import TunerConfig
from marconi_ray.serve.settings import ServeSettings


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


def sim_config(settings: ServeSettings) -> RunConfig:
    """The replay run matching a deployment: system, capacity, alpha and tuner window."""
    t = settings.tuner
    tuner = TunerConfig(t.multiplier, tuple(t.grid), retune_every=t.retune_every)
    return RunConfig(settings.system, settings.cache_bytes, alpha=settings.alpha, tuner=tuner)


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
