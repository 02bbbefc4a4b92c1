"""`benchmarks/bench_coordinator_groups.py`: its options, the group key (stable, spread,
a shared leading block meets one coordinator), the windows (never two turns of one
session), and a replay of the packaged ShareGPT sample end to end with K = 1 and 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_coordinator_groups.py"
sys.path.insert(0, str(SCRIPT.parent))
import bench_coordinator_groups as bg  # noqa: E402
import cluster_load as cl  # noqa: E402

from marconi_ray.traces.registry import load_trace  # noqa: E402


def test_options() -> None:
    args = bg.parse_args([])
    assert args.groups == [1, 2] and args.keys == [64, 256, 1024] and args.replicas == 8
    for bad in (["--coordinators", "1,x"], ["--coordinators", "9"], ["--key-tokens", "0"]):
        with pytest.raises(SystemExit):
            bg.parse_args(bad)


def test_group_key_is_stable_and_keeps_a_leading_block_together() -> None:
    rng = np.random.default_rng(0)
    prompts = [rng.integers(7, 500, 300).astype(np.int32) for _ in range(400)]
    groups = [cl.group_of(p, 2, 64) for p in prompts]
    assert groups == [cl.group_of(p.copy(), 2, 64) for p in prompts]  # a hash of values
    assert 150 < sum(groups) < 250  # spread over both
    head = prompts[0][:64]
    tails = [np.concatenate([head, rng.integers(7, 500, 50).astype(np.int32)]) for _ in range(20)]
    assert {cl.group_of(t, 2, 64) for t in tails} == {cl.group_of(prompts[0], 2, 64)}
    assert cl.group_of(prompts[0], 1, 64) == 0


def test_windows_never_hold_two_turns_of_a_session() -> None:
    trace = load_trace("sample")
    wins = bg.windows(trace, 8)
    assert sorted(i for w in wins for i in w) == list(range(len(trace.requests)))
    assert all(0 < len(w) <= 8 for w in wins)
    for w in wins:
        sessions = [trace.requests[i].session_id for i in w]
        assert len(sessions) == len(set(sessions))
    flat = [i for w in wins for i in w]
    assert flat == sorted(flat)  # trace order kept


def test_replay_of_the_sample_end_to_end(tmp_path: Path) -> None:
    argv = ["--traces", "sample", "--replicas", "4", "--key-tokens", "64", "--concurrency", "8"]
    report = bg.main([*argv, "--out", str(tmp_path)])
    one, two = report["traces"]["sample"]
    assert (one["coordinators"], two["coordinators"]) == (1, 2)
    assert one["requests"] == two["requests"] == len(load_trace("sample").requests)
    assert one["busiest_share"] == 1.0 and sum(two["share_per_coordinator"]) == pytest.approx(1.0)
    assert 0.0 < one["token_hit_rate"] <= 1.0 and 0.0 < two["token_hit_rate"] <= 1.0
    saved = json.loads((tmp_path / "bench_coordinator_groups.json").read_text())
    assert saved["traces"]["sample"][1]["key_tokens"] == 64
    assert "| sample | 2 | 64 |" in (tmp_path / "bench_coordinator_groups.md").read_text()
