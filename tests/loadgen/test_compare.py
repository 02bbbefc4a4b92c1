"""Pure parts of `marconi-loadgen compare`: simulator requests from records, the table
and relative-P95 math, and argument validation."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from loadgen import compare, compare_report
from loadgen.config import RequestRecord
from marconi_ray.core.cost_model import CostModel
from marconi_ray.core.replay import RunConfig, run_replay
from marconi_ray.serve.settings import ServeSettings, TunerSettings


def _rec(sid, turn, start, e2el, inp, out, error=None, warmup=False):
    return RequestRecord(
        session_id=sid,
        turn=turn,
        start_s=start,
        prompt_tokens=len(inp),
        output_tokens=len(out),
        ttft_ms=None if error else 10.0,
        e2el_ms=None if error else e2el,
        error=error,
        warmup=warmup,
        input_ids=list(inp),
        output_ids=list(out),
    )


def _parser():
    top = argparse.ArgumentParser()
    compare.add_parser(top.add_subparsers(dest="command"))
    return top


# ---------------------------------------------------------------- simulator requests
def test_sim_requests_in_completion_order_skipping_failures():
    recs = [
        _rec(0, 0, start=0.0, e2el=5000.0, inp=[1, 2, 3], out=[4]),  # ends at 5.0
        _rec(1, 0, start=1.0, e2el=1000.0, inp=[7, 8], out=[9, 10]),  # ends at 2.0
        _rec(2, 0, start=1.5, e2el=0.0, inp=[5], out=[], error="http_5xx"),
        _rec(1, 1, start=2.5, e2el=500.0, inp=[7, 8, 9, 10, 11], out=[12], warmup=True),
    ]
    reqs = compare_report.sim_requests(recs)
    assert [(r.session_id, r.turn_id) for r in reqs] == [(1, 0), (1, 1), (0, 0)]
    assert [r.ts for r in reqs] == [2.0, 3.0, 5.0]
    assert reqs[1].input_tokens.tolist() == [7, 8, 9, 10, 11]
    assert reqs[1].output_tokens.tolist() == [12]
    assert reqs[0].input_tokens.dtype == np.int32


def test_sim_requests_replay_like_the_cache():
    """The requests of a two-turn session replay to the hit the second turn sees."""
    cost = CostModel(1e6, 1.0, kv_bytes_per_token=16, state_bytes=1000)
    first = list(range(10, 30))
    recs = [
        _rec(0, 0, 0.0, 10.0, first, [40, 41]),
        _rec(0, 1, 1.0, 10.0, [*first, 40, 41, 50, 51], [60]),
    ]
    res = run_replay(compare_report.sim_requests(recs), cost, RunConfig("sglang+", 10**9))
    assert res.token_hit_rate == pytest.approx(22 / (20 + 24))


def test_sim_config_matches_the_deployment():
    tuner = TunerSettings(multiplier=3, grid=(0.0, 1.0), retune_every=50)
    s = ServeSettings(model_dir="m", model_name="m", cache_bytes=123, system="marconi", tuner=tuner)
    cfg = compare_report.sim_config(s)
    assert (cfg.system, cfg.cache_bytes, cfg.alpha) == ("marconi", 123, None)
    assert (cfg.tuner.multiplier, cfg.tuner.grid, cfg.tuner.retune_every) == (3, (0.0, 1.0), 50)
    fixed = compare_report.sim_config(ServeSettings("m", "m", system="vllm+", alpha=0.5))
    assert (fixed.system, fixed.alpha) == ("vllm+", 0.5)


# ---------------------------------------------------------------- table and ratios
def test_relative_p95_lower_higher_and_missing():
    rows = {"marconi": {"ttft_p95_ms": 100.0}, "vllm+": {"ttft_p95_ms": 263.0}}
    assert compare_report.relative_p95(rows, "marconi", "vllm+") == (
        "marconi P95 TTFT is 62% lower than vllm+"
    )
    assert compare_report.relative_p95(rows, "vllm+", "marconi") == (
        "vllm+ P95 TTFT is 163% higher than marconi"
    )
    assert compare_report.relative_p95(rows, "marconi", "vanilla") is None
    zero = {"a": {"ttft_p95_ms": 1.0}, "b": {"ttft_p95_ms": 0}}
    assert compare_report.relative_p95(zero, "a", "b") is None
    assert compare_report.relative_lines(rows) == ["marconi P95 TTFT is 62% lower than vllm+"]


def _summary(p95=200.0):
    q = {"mean": 120.0, "p50": 100.0, "p90": 180.0, "p95": p95, "p99": 300.0}
    return {
        "requests": 10,
        "completed": 10,
        "failed": 0,
        "errors": {},
        "ttft_ms": q,
        "request_throughput": 0.5,
        "output_throughput": 16.0,
        "client_token_hit_rate": 0.61,
    }


def test_system_row_difference_and_missing_parts():
    cost = CostModel(1e6, 1.0, 16, 1000)
    recs = [_rec(0, 0, 0.0, 1.0, [1, 2], [3]), _rec(0, 1, 1.0, 1.0, [1, 2, 3, 4], [5])]
    sim = run_replay(compare_report.sim_requests(recs), cost, RunConfig("sglang+", 10**9))
    server = {"token_hit_rate": 0.5, "evictions": 3.0, "alpha": {"r1": 0.0}}
    row = compare_report.system_row(_summary(), server, sim)
    assert row["ttft_p95_ms"] == 200.0 and row["ttft_p50_ms"] == 100.0
    assert row["sim_hit_rate"] == pytest.approx(3 / 6)
    assert row["sim_minus_server"] == pytest.approx(0.0)
    assert (row["evictions"], row["final_alpha"], row["client_hit_rate"]) == (3, 0.0, 0.61)
    bare = compare_report.system_row(_summary(), None, None)
    assert bare["server_hit_rate"] is None and bare["sim_minus_server"] is None


def test_markdown_table_one_line_per_system():
    rows = {
        "vanilla": compare_report.system_row(_summary(400.0), None, None),
        "marconi": compare_report.system_row(
            _summary(), {"token_hit_rate": 0.6, "evictions": 2}, None
        ),
    }
    lines = compare_report.markdown_table(rows).splitlines()
    assert len(lines) == 4
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|")
    assert lines[2].startswith("| vanilla | 100 | 400 | 300 |")
    assert "| 0.6000 |" in lines[3] and "| - |" in lines[2]


# ---------------------------------------------------------------- arguments
def test_help_covers_every_option():
    sub = _parser()._subparsers._group_actions[0].choices["compare"]
    for action in sub._actions:
        assert action.help, action.option_strings


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--systems", "vanilla,lmcache"], "'lmcache'"),
        (["--systems", "marconi,marconi"], "marconi"),
        (["--systems", " , "], "--systems"),
        (["--cache-bytes", "0"], "--cache-bytes must be >= 1, got 0"),
        (["--tp", "0"], "--tp must be >= 1, got 0"),
        (["--port", "70000"], "--port must be <= 65535, got 70000"),
        (["--session-rate", "0"], "session_rate must be finite and > 0, got 0.0"),
        (["--session-rate", "none"], "concurrency"),
        (["--sessions", "0"], "sessions must be >= 1, got 0"),
        (["--max-output", "0"], "max_output must be >= 1, got 0"),
        (["--think", "sometimes"], "sometimes"),
        (["--burstiness", "-1"], "burstiness must be finite and > 0, got -1.0"),
        (["--model", "no-such-model"], "'no-such-model'"),
    ],
)
def test_bad_arguments_exit_2_naming_the_value(argv, needle, tmp_path, capsys):
    args = _parser().parse_args(["compare", "--out", str(tmp_path), *argv])
    assert args.func is compare.run
    with pytest.raises(ValueError, match=r"."):
        compare.validate(args)
    assert compare.run(args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.startswith("marconi-loadgen compare: error:")
    assert not any(tmp_path.iterdir())


def test_validate_builds_one_load_config(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"vocab_size": 512}))
    argv = ["compare", "--out", str(tmp_path / "o"), "--model", str(model), "--port", "8123"]
    argv += ["--systems", "vanilla,marconi", "--cache-bytes", "3e8", "--session-rate", "0.25"]
    argv += ["--think", "exp:2", "--slo-ttft-ms", "500", "--max-output", "16"]
    cfg = compare.validate(_parser().parse_args(argv))
    assert cfg.systems == ("vanilla", "marconi") and cfg.cache_bytes == 300_000_000
    load = cfg.load
    assert (load.url, load.prompt_mode, load.vocab_size, load.history) == (
        "http://127.0.0.1:8123",
        "tokens",
        512,
        "live",
    )
    assert (load.session_rate, load.think, load.slo_ttft_ms, load.max_output) == (
        0.25,
        "exp:2",
        500.0,
        16,
    )
    s = compare.settings_for(cfg, "vllm+")
    assert (s.system, s.app_name, s.port, s.cache_bytes) == ("vllm+", "cmp-vllm+", 8123, 3 * 10**8)
