"""Run statistics from request records, with `vllm bench serve` definitions.

TTFT: request send to first token. ITL: gaps between successive streamed chunks, pooled
over requests. TPOT: (e2el - ttft) / (output_tokens - 1), over requests with >= 2 output
tokens. E2EL: send to the end of the stream. Percentiles use numpy's default linear
interpolation. Throughputs divide by the run's wall time. Warm-up records are excluded
from everything except the ``warmup_requests`` count.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from loadgen.config import LoadConfig, RequestRecord

PERCENTILES = (50, 90, 95, 99)


def distribution(values: Iterable[float]) -> dict[str, float | None]:
    """``{mean, p50, p90, p95, p99}`` of ``values`` (all None when empty)."""
    arr = np.asarray(list(values), dtype=np.float64)
    keys = ["mean", *(f"p{p}" for p in PERCENTILES)]
    if arr.size == 0:
        return dict.fromkeys(keys, None)
    out: dict[str, float | None] = {"mean": float(arr.mean())}
    for p in PERCENTILES:
        out[f"p{p}"] = float(np.percentile(arr, p))
    return out


def _meets_slos(r: RequestRecord, config: LoadConfig) -> bool:
    """All given SLOs met (a request with < 2 tokens has TPOT 0, as in vLLM)."""
    checks = (
        (config.slo_ttft_ms, r.ttft_ms),
        (config.slo_tpot_ms, r.tpot_ms if r.tpot_ms is not None else 0.0),
        (config.slo_e2el_ms, r.e2el_ms),
    )
    return all(slo is None or (v is not None and v <= slo) for slo, v in checks)


def ttft_by_turn(records: Sequence[RequestRecord]) -> dict[int, dict[str, float]]:
    """``{turn: {mean, p50, p95, n}}`` of TTFT (ms) over completed records, by turn index."""
    by_turn: dict[int, list[float]] = {}
    for r in records:
        if r.error is None and r.ttft_ms is not None:
            by_turn.setdefault(r.turn, []).append(r.ttft_ms)
    out: dict[int, dict[str, float]] = {}
    for turn in sorted(by_turn):
        arr = np.asarray(by_turn[turn], dtype=np.float64)
        out[turn] = {
            "mean": float(arr.mean()),
            "p50": float(np.percentile(arr, 50)),
            "p95": float(np.percentile(arr, 95)),
            "n": float(arr.size),
        }
    return out


def summarize(
    records: Sequence[RequestRecord], wall_s: float, config: LoadConfig
) -> dict[str, Any]:
    """The summary of a run (keys listed in the module docstring of `loadgen.runner`).

    ``wall_s`` must be > 0 for throughputs (0 or less gives throughputs of 0.0).
    ``goodput``/``goodput_fraction`` are None when the config sets no SLO.
    """
    measured = [r for r in records if not r.warmup]
    done = [r for r in measured if r.error is None]
    errors: dict[str, int] = {}
    for r in measured:
        if r.error is not None:
            errors[r.error] = errors.get(r.error, 0) + 1
    per_s = 1.0 / wall_s if wall_s > 0 else 0.0
    out_tokens = sum(r.output_tokens for r in done)
    prompt_tokens = sum(r.prompt_tokens for r in done)
    cached = sum(r.cached_tokens for r in done)
    has_slo = any(
        s is not None for s in (config.slo_ttft_ms, config.slo_tpot_ms, config.slo_e2el_ms)
    )
    good = sum(1 for r in done if _meets_slos(r, config))
    return {
        "requests": len(measured),
        "completed": len(done),
        "failed": len(measured) - len(done),
        "errors": dict(sorted(errors.items())),
        "warmup_requests": len(records) - len(measured),
        "duration_s": wall_s,
        "ttft_ms": distribution(r.ttft_ms for r in done if r.ttft_ms is not None),
        "tpot_ms": distribution(t for r in done if (t := r.tpot_ms) is not None),
        "itl_ms": distribution(x for r in done for x in r.itl_ms),
        "e2el_ms": distribution(r.e2el_ms for r in done if r.e2el_ms is not None),
        "request_throughput": len(done) * per_s,
        "output_throughput": out_tokens * per_s,
        "total_token_throughput": (out_tokens + prompt_tokens) * per_s,
        "goodput": good * per_s if has_slo else None,
        "goodput_fraction": (good / len(done) if done else 0.0) if has_slo else None,
        "ttft_by_turn_ms": ttft_by_turn(done),
        "cached_tokens": cached,
        "prompt_tokens": prompt_tokens,
        "output_tokens": out_tokens,
        "client_token_hit_rate": cached / prompt_tokens if prompt_tokens else None,
    }
