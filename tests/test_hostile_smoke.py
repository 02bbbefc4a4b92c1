"""`benchmarks/hostile.py` without Ray: options, the figures of every section against
their targets (each one can fail), the table and the plot; the small helpers."""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "hostile.py"
sys.path.insert(0, str(SCRIPT.parent))
import hostile as h  # noqa: E402


def test_quick_and_skip_options() -> None:
    args = h.parse_args(["--quick", "--skip", "journal, health"])
    assert (args.drops, args.bodies, args.outage_s, args.goodput_s) == (20, 12, 10.0, 12.0)
    assert args.skip == {"journal", "health"}
    assert args.out.endswith("benchmarks/results/hostile")
    full = h.parse_args([])
    assert (full.drops, full.bodies, full.outage_s, full.journal_bound) == (200, 45, 60.0, 2e6)
    assert full.replicas * (full.max_batch + full.max_queued) == 16  # C
    assert len(" " * full.blank_chars) < full.body_chars + 100 < 1 << 20  # under 1 MiB
    with pytest.raises(SystemExit):
        h.parse_args(["--skip", "nope"])
    with pytest.raises(SystemExit):
        h.parse_args(["--max-queued", "-1"])


def fake_report() -> dict[str, Any]:
    """A report where every target is met."""
    timeline = [[-0.5, 3, 4096], [-0.1, 1, 1024], [0.05, 0, 0], [1.02, 0, 0]]
    health = {
        "body_bytes": 1_000_050,
        "health": h.dist([0.004] * 50 + [0.02]),
        "expected": 45,
        "statuses": {"400 context_length_exceeded": 45},
        "sent": 45,
    }
    journal_tl = [
        {"t": 0.5, "phase": "warm", "state": "ok", "backlog_bytes": 0, "rss": 100e6},
        {"t": 1.5, "phase": "outage", "state": "degraded", "backlog_bytes": 1e6, "rss": 102e6},
        {"t": 2.5, "phase": "outage", "state": "lost", "backlog_bytes": 0, "rss": 102e6},
        {"t": 3.5, "phase": "after", "state": "ok", "backlog_bytes": 0, "rss": 101e6},
    ]
    run = {"goodput_rps": 5.0, "throughput_rps": 5.5, "shed_429": 300, "errors": 0}
    run |= {"latency": h.dist([1.0, 1.2, 1.4]), "peak_in_flight": 16}
    run["per_second"] = [[0, 5, 5, 10], [1, 6, 5, 9], [2, 5, 5, 11]]
    free = run | {"goodput_rps": 0.5, "throughput_rps": 5.4, "shed_429": 0, "peak_in_flight": 32}
    free["per_second"] = [[0, 5, 1, 0], [1, 6, 0, 0], [2, 5, 0, 0]]
    return {
        "quick": True,
        "machine": {"cpu_count": 2},
        "drops": {
            "drops": 200,
            "in_flight_at_1s": 0,
            "reserved_at_1s": 0,
            "released_s": 0.05,
            "timeline": timeline,
            "after_requests": [{"status": 200, "cached_tokens": c} for c in (0, 256, 256, 256)],
            "after_ok": 4,
            "statuses_seen": {"200": 150, "not read": 50},
            "drop_failure_count": 0,
            "mean_cached_tokens": 192.0,
        },
        "health": {
            "bodies": 45,
            "idle": h.dist([0.003] * 30),
            "refused_by_bound": health,
            "tokenized": health | {"body_bytes": 900_050},
        },
        "journal": {
            "bound_bytes": 2_000_000,
            "outage_s": 60.0,
            "peak_backlog_bytes": 1_999_000,
            "peak_lost_records": 1234,
            "unbounded_backlog_bytes": 12_000_000,
            "rss_before": 100_000_000,
            "rss_peak_outage": 102_000_000,
            "catch_up_s": 1.1,
            "client_errors": 0,
            "requests": 900,
            "timeline": journal_tl,
            "marks": {"stop": 1.0, "restart": 3.0},
        },
        "goodput": {
            "capacity": 16,
            "clients": 32,
            "slo_s": 2.0,
            "shed": run,
            "no_shed": free,
        },
    }


def broken_report() -> dict[str, Any]:
    """The same report with every figure off its target."""
    r = copy.deepcopy(fake_report())
    r["drops"] |= {"in_flight_at_1s": 2, "reserved_at_1s": 99, "released_s": None}
    r["drops"] |= {"after_ok": 3, "mean_cached_tokens": 0.0, "drop_failure_count": 1}
    for kind in ("refused_by_bound", "tokenized"):
        r["health"][kind] = r["health"][kind] | {"health": h.dist([0.9] * 10), "expected": 40}
    r["health"]["tokenized"]["health"] = h.dist([0.01] * 10)  # fast, but one /health failed
    r["health"]["tokenized"]["health_non_200"] = 1
    r["journal"] |= {"peak_backlog_bytes": 2_000_001, "rss_peak_outage": 200_000_000}
    r["journal"] |= {"catch_up_s": None, "client_errors": 3}
    r["goodput"]["shed"] = r["goodput"]["shed"] | {"goodput_rps": 0.4, "errors": 1}
    r["goodput"]["no_shed"] = r["goodput"]["no_shed"] | {"shed_429": 5}
    r["goodput"]["shed"]["peak_in_flight"] = 17
    return r


def test_every_figure_is_met_on_a_good_report(tmp_path: Path) -> None:
    rows = h.figures(fake_report())
    assert [r["section"] for r in rows] == list("aaaaaabbbbccccdddd")
    assert all(r["met"] for r in rows), [r["figure"] for r in rows if not r["met"]]
    text = h.table(rows)
    assert "MISSED" not in text and "192" in text and "1.10" in text
    assert "[0, 256, 256, 256]" in text and "unbounded backlog 12.0 MB" in text
    h.plot(fake_report(), rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 20_000


def test_every_figure_can_fail(tmp_path: Path) -> None:
    good = h.figures(fake_report())
    rows = h.figures(broken_report())
    assert [r["figure"][:20] for r in rows] == [r["figure"][:20] for r in good]
    assert not any(r["met"] for r in rows), [r["figure"] for r in rows if r["met"]]
    text = h.table(rows)
    assert text.count("MISSED") == len(rows) and " - " in text  # released: never
    h.plot(broken_report(), rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 20_000


def test_skipped_sections_leave_rows_and_panels_out(tmp_path: Path) -> None:
    report = fake_report()
    del report["journal"], report["goodput"]
    rows = h.figures(report)
    assert {r["section"] for r in rows} == {"a", "b"}
    h.plot(report, rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").exists()


def test_helpers() -> None:
    d = h.dist([0.001, 0.002, 0.003])
    assert d["n"] == 3 and d["max_ms"] == pytest.approx(3.0) and d["p50_ms"] == pytest.approx(2.0)
    assert h.dist([])["n"] == 0
    assert (h.fmt(None), h.fmt(3), h.fmt(2.5), h.fmt(12345.6)) == ("-", "3", "2.50", "12,346")
    rss = h.rss_bytes(__import__("os").getpid())
    assert rss is not None and rss > 1e6
    assert h.rss_bytes(-1) is None
    raw = h.request_bytes("/v1/completions", {"prompt": "hi"}, 8000)
    assert raw.startswith(b"POST /v1/completions HTTP/1.1\r\n") and raw.endswith(b'"hi"}')
    assert b"Content-Length: 16\r\n" in raw
    calls = []
    with h.Poller(lambda: calls.append(1) or len(calls), 0.01) as p:
        time.sleep(0.1)
    assert len(p.samples) >= 3 and p.errors == []


def test_goodput_counts_only_answers_within_the_slo_and_the_window() -> None:
    records = [
        {"start": 0.0, "end": 1.0, "status": 200, "retry_after": None},
        {"start": 0.0, "end": 3.0, "status": 200, "retry_after": None},  # over the SLO
        {"start": 9.5, "end": 10.5, "status": 200, "retry_after": None},  # after the window
        {"start": 1.0, "end": 1.01, "status": 429, "retry_after": "1"},
        {"start": 2.0, "end": 2.5, "status": 500, "retry_after": None},
    ]
    s = h.summarize(records, duration=10.0, slo_s=2.0)
    assert (s["served"], s["within_slo"], s["shed_429"], s["errors"]) == (3, 1, 1, 1)
    assert s["goodput_rps"] == pytest.approx(0.1) and s["throughput_rps"] == pytest.approx(0.2)
    assert s["retry_after"] == ["1"] and s["latency"]["n"] == 3
