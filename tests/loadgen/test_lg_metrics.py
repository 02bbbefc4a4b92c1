"""Summary math on hand-made records (vLLM definitions) and server-metric parsing."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.config import LoadConfig, RequestRecord
from loadgen.metrics import distribution, summarize
from loadgen.server_metrics import delta, parse, scrape

CFG = LoadConfig(url="http://127.0.0.1:1")


def _rec(turn: int, ttft: float, e2el: float, n_out: int, itl: list[float], **kw) -> RequestRecord:
    return RequestRecord(
        session_id=kw.pop("session_id", 0),
        turn=turn,
        start_s=0.0,
        prompt_tokens=kw.pop("prompt_tokens", 100),
        output_tokens=n_out,
        cached_tokens=kw.pop("cached_tokens", 0),
        ttft_ms=ttft,
        e2el_ms=e2el,
        itl_ms=itl,
        **kw,
    )


RECORDS = [
    _rec(0, 10.0, 110.0, 11, [10.0] * 10, cached_tokens=0),
    _rec(1, 20.0, 60.0, 5, [5.0, 15.0, 10.0, 10.0], cached_tokens=50),
    _rec(0, 30.0, 30.0, 1, [], session_id=1, cached_tokens=25),
    RequestRecord(1, 1, 0.0, 100, error="http_5xx", error_detail="HTTP 500: boom"),
    RequestRecord(2, 0, 0.0, 100, error="connect"),
    _rec(0, 999.0, 999.0, 2, [1.0], warmup=True),
]


def test_tpot_definition():
    assert RECORDS[0].tpot_ms == pytest.approx(10.0)  # (110 - 10) / (11 - 1)
    assert RECORDS[1].tpot_ms == pytest.approx(10.0)  # (60 - 20) / 4
    assert RECORDS[2].tpot_ms is None


def test_distribution_uses_linear_percentiles():
    vals = [1.0, 2.0, 3.0, 4.0, 10.0]
    d = distribution(vals)
    assert d["mean"] == pytest.approx(4.0)
    assert d["p50"] == 3.0 and d["p90"] == pytest.approx(np.percentile(vals, 90))
    assert d["p99"] == pytest.approx(4.0 + 0.96 * 6.0)
    assert distribution([]) == {"mean": None, "p50": None, "p90": None, "p95": None, "p99": None}


def test_summary_counts_latencies_and_hit_rate():
    s = summarize(RECORDS, wall_s=2.0, config=CFG)
    assert (s["requests"], s["completed"], s["failed"], s["warmup_requests"]) == (5, 3, 2, 1)
    assert s["errors"] == {"connect": 1, "http_5xx": 1}
    assert s["ttft_ms"]["mean"] == pytest.approx(20.0) and s["ttft_ms"]["p50"] == 20.0
    assert s["tpot_ms"]["mean"] == pytest.approx(10.0)
    itl = [10.0] * 10 + [5.0, 15.0, 10.0, 10.0]
    assert s["itl_ms"]["p99"] == pytest.approx(np.percentile(itl, 99))
    assert s["e2el_ms"]["mean"] == pytest.approx((110 + 60 + 30) / 3)
    assert s["request_throughput"] == pytest.approx(1.5)
    assert s["output_throughput"] == pytest.approx(17 / 2)
    assert s["total_token_throughput"] == pytest.approx((17 + 300) / 2)
    assert s["cached_tokens"] == 75 and s["prompt_tokens"] == 300
    assert s["client_token_hit_rate"] == pytest.approx(0.25)
    assert s["goodput"] is None and s["goodput_fraction"] is None
    assert s["ttft_by_turn_ms"][0] == {"mean": 20.0, "p50": 20.0, "p95": 29.0, "n": 2.0}
    assert s["ttft_by_turn_ms"][1]["n"] == 1.0


def test_goodput_needs_all_slos():
    cfg = LoadConfig(url="http://127.0.0.1:1", slo_ttft_ms=25.0, slo_e2el_ms=100.0)
    s = summarize(RECORDS, wall_s=2.0, config=cfg)
    # record 0: e2el 110 > 100; record 1: ok; record 2: ttft 30 > 25
    assert s["goodput"] == pytest.approx(0.5) and s["goodput_fraction"] == pytest.approx(1 / 3)
    tpot_only = LoadConfig(url="http://127.0.0.1:1", slo_tpot_ms=9.0)
    s = summarize(RECORDS, wall_s=1.0, config=tpot_only)
    assert s["goodput"] == pytest.approx(1.0)  # only the 1-token request (TPOT 0) passes


def test_empty_summary_has_none_values():
    s = summarize([], wall_s=0.0, config=CFG)
    assert s["completed"] == 0 and s["ttft_ms"]["p50"] is None
    assert s["client_token_hit_rate"] is None and s["request_throughput"] == 0.0


PROM = """# TYPE marconi_cache_hit_tokens counter
marconi_cache_hit_tokens_total{replica="a"} 30.0
marconi_cache_hit_tokens_total{replica="b"} 10.0
# TYPE marconi_cache_input_tokens counter
marconi_cache_input_tokens_total{replica="a"} 100.0
marconi_cache_input_tokens_total{replica="b"} 100.0
# TYPE marconi_cache_flops_saved counter
marconi_cache_flops_saved_total{replica="a"} 5e9
# TYPE marconi_cache_evictions counter
marconi_cache_evictions_total{replica="a"} 3.0
# TYPE marconi_cache_alpha gauge
marconi_cache_alpha{replica="a"} 0.0
marconi_cache_alpha{replica="b"} 1.5
# TYPE marconi_ttft_seconds histogram
marconi_ttft_seconds_bucket{le="+Inf"} 4.0
marconi_ttft_seconds_count 4.0
marconi_ttft_seconds_sum 1.0
"""


def test_parse_sums_counters_and_keeps_alpha_per_replica():
    m = parse(PROM)
    assert m["hit_tokens"] == 40.0 and m["input_tokens"] == 200.0
    assert m["flops_saved"] == 5e9 and m["evictions"] == 3.0
    assert m["alpha"] == {"a": 0.0, "b": 1.5} and m["replicas"] == ["a", "b"]


def test_delta_over_a_run():
    before = parse(PROM)
    after = parse(PROM.replace("30.0", "80.0").replace("} 100.0", "} 150.0").replace("1.5", "2.0"))
    d = delta(before, after)
    assert d is not None
    assert d["hit_tokens"] == 50.0 and d["input_tokens"] == 100.0
    assert d["token_hit_rate"] == pytest.approx(0.5) and d["alpha"] == {"a": 0.0, "b": 2.0}
    assert delta(None, after) is None
    same = delta(before, before)
    assert same is not None and same["token_hit_rate"] is None


def test_scrape_unreachable_is_none():
    assert scrape("http://127.0.0.1:1", timeout_s=2.0) is None


def test_scrape_the_fake(fake):
    url, _ = fake
    m = scrape(url)
    assert m is not None and m["alpha"] == {"r0": 0.5}
