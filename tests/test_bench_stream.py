"""`benchmarks/bench_stream.py`'s accounting: which process counts where, CPU-ms per token by
group and by part, chunks per token, and the printed table (the Ray runs themselves are
the benchmark's; the service's streaming path is tested in tests/serve)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_stream.py"
sys.path.insert(0, str(SCRIPT.parent))
import bench_stream as bs  # noqa: E402


def test_processes_fall_into_their_groups_and_parts() -> None:
    assert bs.group_of("ServeReplica:stream:ModelReplica") == "replica"
    assert bs.group_of("ShardActor") == "replica"
    assert bs.group_of("ServeReplica:stream:OpenAIIngress") == "outside"
    assert bs.group_of("ProxyActor") == "outside" and bs.group_of("CacheCoordinator") == "outside"
    assert bs.group_of("raylet") == "ray" and bs.group_of("driver (HTTP clients)") is None
    assert bs.part_of("ServeReplica:stream:OpenAIIngress") == "ingress"
    assert bs.part_of("ProxyActor") == "proxy"
    assert bs.part_of("ServeReplica:stream:ModelReplica") is None
    assert bs.part_of("CacheCoordinator") is None


def test_summary_divides_cpu_by_tokens_and_keeps_parts_inside_outside() -> None:
    run = {
        "tokens": 1000,
        "chunks": 250,
        "wall_s": 2.0,
        "itl_p50_ms": 5.0,
        "itl_p99_ms": 9.0,
        "cpu_s": {
            "ServeReplica:stream:OpenAIIngress": 0.4,
            "ProxyActor": 0.3,
            "CacheCoordinator": 0.1,
            "ServeReplica:stream:ModelReplica": 0.5,
            "raylet": 0.05,
            "driver (HTTP clients)": 9.0,
        },
    }
    got = bs.summarize(run)
    ms = got["cpu_ms_per_token"]
    assert ms["outside"] == pytest.approx(0.8) and ms["replica"] == pytest.approx(0.5)
    assert ms["ingress"] == pytest.approx(0.4) and ms["proxy"] == pytest.approx(0.3)
    assert ms["total"] == pytest.approx(1.35)  # the parts are not counted twice
    assert got["chunks_per_token"] == 0.25 and got["tokens_per_s"] == 500.0
    table = bs.table({"service": {64: got}})
    assert "ingress" in table.splitlines()[1]
    assert "0.400" in table and "0.250" in table and "1.350" in table
