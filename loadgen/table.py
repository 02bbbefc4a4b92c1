"""The end-of-run summary table printed by `marconi-loadgen run`."""

from __future__ import annotations

from typing import Any


def _num(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_summary(summary: dict[str, Any]) -> str:
    """A plain-text table of the key figures of ``summary`` (see `metrics.summarize`)."""
    lines = [
        f"requests: {summary['requests']}  completed: {summary['completed']}  "
        f"failed: {summary['failed']}  (warm-up excluded: {summary.get('warmup_requests', 0)})",
        f"{'metric':<10}{'mean':>10}{'p50':>10}{'p90':>10}{'p95':>10}{'p99':>10}",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        d = summary[key]
        cells = "".join(f"{_num(d[k]):>10}" for k in ("mean", "p50", "p90", "p95", "p99"))
        lines.append(f"{key:<10}{cells}")
    lines.append(
        f"throughput: {_num(summary['request_throughput'], 2)} req/s, "
        f"{_num(summary['output_throughput'])} out tok/s, "
        f"{_num(summary['total_token_throughput'])} total tok/s"
    )
    if summary.get("goodput") is not None:
        lines.append(
            f"goodput: {_num(summary['goodput'], 2)} req/s "
            f"({_num(100 * summary['goodput_fraction'])}% of completed)"
        )
    lines.append(
        f"client token hit rate: {_num(summary['client_token_hit_rate'], 3)} "
        f"({summary['cached_tokens']}/{summary['prompt_tokens']} prompt tokens cached)"
    )
    server = summary.get("server")
    if server:
        lines.append(
            f"server token hit rate: {_num(server['token_hit_rate'], 3)}, "
            f"FLOPs saved: {server['flops_saved']:.3g}, evictions: {server['evictions']:.0f}, "
            f"alpha: {server['alpha']}"
        )
    if summary.get("non_extending_turns"):
        lines.append(f"non-extending trace turns: {summary['non_extending_turns']}")
    if summary["failed"]:
        kinds = ", ".join(f"{k} x{n}" for k, n in summary["errors"].items())
        lines.append(f"{summary['failed']} requests failed: {kinds}")
    return "\n".join(lines)
