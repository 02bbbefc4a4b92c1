"""The load generator's side of the comparison (`loadgen.compare_report`: simulator
requests from records, the table and relative-P95 math, the report files) and
`marconi-loadgen compare` forwarding to `benchmarks/compare_systems.py` (whose own
arguments and deployment settings are tested in test_compare_systems.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loadgen import cli, compare, compare_report
from loadgen.config import RequestRecord
from loadgen.runner import LoadResult
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.sim.replay import RunConfig, run_replay


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


# ---------------------------------------------------------------- the report
def test_simulate_is_the_replay_of_the_served_requests():
    cost = CostModel(1e6, 1.0, 16, 1000)
    recs = [_rec(0, 0, 0.0, 1.0, [1, 2], [3]), _rec(0, 1, 1.0, 1.0, [1, 2, 3, 4], [5])]
    run = RunConfig("sglang+", 10**9)
    sim = compare_report.simulate(recs, cost, run)
    direct = run_replay(compare_report.sim_requests(recs), cost, run)
    assert sim.token_hit_rate == direct.token_hit_rate
    assert sim.token_hit_rate == pytest.approx(3 / 6)


def test_write_report_from_plain_values(tmp_path):
    """The report needs no service: load results, a cost model and a `RunConfig` each."""
    cost = CostModel(1e6, 1.0, 16, 1000)
    recs = [_rec(0, 0, 0.0, 1.0, [1, 2], [3]), _rec(0, 1, 1.0, 1.0, [1, 2, 3, 4], [5])]
    summary = {**_summary(), "ttft_by_turn_ms": {"0": {"mean": 10.0}, "1": {"mean": 8.0}}}
    before = {"hit_tokens": 0.0, "input_tokens": 0.0, "alpha": {}}
    after = {"hit_tokens": 3.0, "input_tokens": 6.0, "evictions": 0.0, "alpha": {"r": 0.0}}
    runs = {
        "vanilla": compare_report.SystemRun(
            LoadResult(recs, summary, None, None, 1.5), cost, RunConfig("vanilla", 10**9)
        ),
        "marconi": compare_report.SystemRun(
            LoadResult(recs, summary, before, after, 2.0), cost, RunConfig("sglang+", 10**9)
        ),
    }
    doc = compare_report.write_report(runs, tmp_path / "o", {"model": "m", "port": 1})
    for name in ("compare.json", "compare.md", "ttft_cdf.png", "ttft_by_turn.png"):
        assert (tmp_path / "o" / name).stat().st_size > 0
    on_disk = json.loads((tmp_path / "o" / "compare.json").read_text())
    assert on_disk["systems"] == json.loads(json.dumps(doc["systems"]))
    config = on_disk["config"]
    assert config["model"] == "m" and config["cost_model"]["state_bytes"] == 1000
    row = on_disk["systems"]["marconi"]
    assert row["server_hit_rate"] == row["sim_hit_rate"] == pytest.approx(0.5)
    assert on_disk["systems"]["vanilla"]["server_hit_rate"] is None
    assert on_disk["systems"]["vanilla"]["wall_s"] == 1.5
    assert "| marconi |" in (tmp_path / "o" / "compare.md").read_text()


# ---------------------------------------------------------------- `marconi-loadgen compare`
def test_compare_forwards_to_the_benchmark_script():
    assert compare.SCRIPT.is_file() and compare.SCRIPT.parent.name == "benchmarks"
    assert compare.command(["--out", "x", "--help"]) == [
        sys.executable,
        str(compare.SCRIPT),
        "--out",
        "x",
        "--help",
    ]
    args = cli.build_parser().parse_args(["compare", "--out", "o", "-h", "--", "--tp", "2"])
    assert args.func is compare.run and args.args == ["--out", "o", "-h", "--", "--tp", "2"]


def test_compare_help_is_the_scripts(capfd):
    assert cli.main(["compare", "--help"]) == 0
    out = capfd.readouterr().out
    assert out.startswith("usage: marconi-loadgen compare")
    for opt in ("--out", "--model", "--systems", "--cache-bytes", "--tp", "--port", "--max-batch",
                "--session-rate", "--trace", "--sessions", "--no-progress"):  # fmt: skip
        assert opt in out, opt


def test_compare_bad_arguments_exit_2_through_the_cli(tmp_path, capfd):
    argv = ["compare", "--out", str(tmp_path), "--systems", "vanilla,lmcache"]
    assert cli.main(argv) == 2
    err = capfd.readouterr().err
    assert err.startswith("marconi-loadgen compare: error:") and "'lmcache'" in err
    assert not any(tmp_path.iterdir())


def test_compare_without_the_script_says_where_it_is(tmp_path, capsys):
    assert compare.forward(["--help"], script=tmp_path / "compare_systems.py") == 2
    err = capsys.readouterr().err
    assert err.startswith("marconi-loadgen compare: error:")
    assert "benchmarks/compare_systems.py" in err and len(err.strip().splitlines()) == 1


def test_loadgen_loads_no_server_module():
    """At run time too: every loadgen module and the CLI's parser, in a fresh interpreter,
    bring in none of the modules the "loadgen speaks HTTP only" contract forbids."""
    bad = ("marconi_ray.serve", "marconi_ray.cli", "marconi_ray.engine", "ray", "torch")
    code = (
        "import importlib, pkgutil, sys, loadgen\n"
        "for m in pkgutil.iter_modules(loadgen.__path__):\n"
        "    importlib.import_module('loadgen.' + m.name)\n"
        "from loadgen import cli\n"
        "cli.build_parser()\n"
        f"bad = {(*bad, 'marconi_kernels')!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith(tuple(b + '.' for b in bad))"
        " or m in bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parent,
    )
    assert out.stdout.strip() == "[]", out.stdout
