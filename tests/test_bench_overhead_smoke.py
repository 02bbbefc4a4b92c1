"""`benchmarks/bench_overhead.py`: options, verdicts against the targets, the table and
plot of every section, and the bare-Ray-Serve floor app answering over HTTP."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_overhead.py"
sys.path.insert(0, str(SCRIPT.parent))
import bench_overhead as bo  # noqa: E402


def test_quick_and_skip_options() -> None:
    args = bo.parse_args(["--quick", "--skip", "ttft, engine"])
    assert (args.requests, args.rounds, args.pairs, args.min_nodes) == (24, 1, 200, 300)
    assert args.skip == {"ttft", "engine"}
    assert args.workload.requests == 200 and args.workload.prompt_tokens == 2000
    full = bo.parse_args([])
    assert (
        full.min_nodes == 10_000 and full.workload.documents * full.workload.continuations > 10_000
    )
    with pytest.raises(SystemExit):
        bo.parse_args(["--skip", "nope"])


def fake_report() -> dict[str, Any]:
    one = {"floor": bo.dist([0.010] * 9 + [0.012]), "service": bo.dist([0.012] * 10)}
    return {
        "quick": True,
        "config": {"gen_tokens": 64},
        "engine": {
            "one_token": bo.dist([0.005]),
            "decode_c1_tok_s": 1000.0,
            "decode_c16_tok_s": 5000.0,
        },
        "http": {
            "one_token": one,
            "req_s": {"floor": 100.0, "service": 70.0},
            "decode_c1_tok_s": 900.0,
            "decode_c16_tok_s": 1000.0,
        },
        "ttft": {
            "long_tokens": 16000,
            "idle": bo.dist([0.02]),
            "during_long_prefill": bo.dist([0.03]),
        },
        "coordinator": {
            "callers": 8,
            "pairs_s": 1500.0,
            "pair": bo.dist(list(np.full(100, 0.004))),
        },
    }


def test_verdicts_cover_every_section(tmp_path: Path) -> None:
    rows = bo.verdicts(fake_report())
    assert [r["workload"] for r in rows] == ["a", "a", "a", "b", "b", "c", "d", "d"]
    met = {r["metric"]: r["met"] for r in rows}
    assert met["1-token latency p50 ms, c=1"]  # 12 / 10 <= 1.25
    assert not met["1-token req/s, c=16"]  # 70 / 100 < 0.8
    assert [r["met"] for r in rows if r["workload"] == "b"] == [True, False]
    assert all(r["met"] for r in rows if r["workload"] in "cd")
    text = bo.table(rows)
    assert text.count("MISSED") == 2 and "1.20x" in text
    bo.plot(fake_report(), rows, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 10_000


def test_a_second_ttft_run_at_a_finer_step_budget_gets_its_own_verdict() -> None:
    report = fake_report()
    report["ttft"]["max_batch_tokens"] = 2048
    slow = {"idle": bo.dist([0.02]), "during_long_prefill": bo.dist([0.05])}
    report["ttft_fine"] = slow | {"max_batch_tokens": 256}
    rows = [r for r in bo.verdicts(report) if r["workload"] == "c"]
    assert [r["metric"].split(", ")[-1] for r in rows] == ["2048-token steps", "256-token steps"]
    assert [r["met"] for r in rows] == [True, False]  # 1.5x; 2.5x > 2
    assert bo.parse_args([]).ttft_batch_tokens == 256


def test_cpu_accounting_sees_this_process_and_tabulates_per_request() -> None:
    before = bo.cpu_seconds()
    sum(i * i for i in range(2_000_000))  # burn some CPU in the driver
    used = bo.cpu_delta(before, bo.cpu_seconds())
    assert used.get("driver (HTTP clients)", 0.0) > 0.0
    report = fake_report()
    report["http"]["cpu_ms_per_request_c16"] = {
        "floor": {"ProxyActor": 2.0, "FloorIngress": 1.0},
        "service": {"ModelReplica": 5.0, "OpenAIIngress": 1.5},
    }
    text = bo.cpu_table(report)
    assert "floor: total 3.00 = ProxyActor 2.00, FloorIngress 1.00" in text
    assert "service: total 6.50" in text and bo.cpu_table(fake_report()) == ""


@pytest.mark.ray
def test_floor_app_answers() -> None:
    import ray
    from ray import serve
    from ray_session import SERVE_PORT, local_ray

    with local_ray():  # Serve on SERVE_PORT
        actor = bo.start_floor()
        serve.run(bo.floor_app(), name=bo.FLOOR_APP, route_prefix="/floor")
        args = bo.parse_args(["--concurrency", "4"])
        load = bo.Load(args, np.random.default_rng(0))
        url = f"http://127.0.0.1:{SERVE_PORT}/floor/v1/completions"

        async def go() -> tuple[list[float], float]:
            return await load.seq(url, 3, 1, "seq"), await load.conc(url, 8, 1, "conc")

        times, wall = load.run(go)
        assert len(times) == 3 and all(0 < t < 30 for t in times) and wall > 0
        assert ray.get(actor.plan.remote("abc")) == 3
