"""Losing a model node under load: a Ray cluster of three raylets on this
machine (the head, two workers advertising `marconi_model`), a real redis-server journal,
the full HTTP service (ingress, coordinator and tuner pinned to the head; one `tiny`
replica on each worker), four closed-loop clients running eight multi-turn sessions (half
of them streamed), and one worker's raylet SIGKILLed while a streamed request of one of
its sessions is open. The run is `benchmarks/node_loss.py:run_node_loss`, with shorter
phases.

Asserted: the control plane ran on the head and one replica on each worker; every request
either completed with exactly the greedy tokens of an uninterrupted run (the in-process
engine) or got a clean 503 with Retry-After: no broken connection, no error event, no
500; the lost node's sessions moved to the survivor and the coordinator kept only it;
every session that lived on the survivor still got cached tokens right after the loss and
its sessions' hit rate after is at least 90% of before; the tuner searched once per
replica, its grid tasks spread over at least two nodes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from node_loss import run_node_loss
from ray_session import stop_ray

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.parametrize("coordinators", [1, 2], ids=["one-coordinator", "two-coordinators"])
def test_losing_a_model_node_under_load(tmp_path: Path, coordinators: int) -> None:
    """With two coordinators each node's replica belongs to its own coordinator: the
    loss takes one coordinator's replicas, and its sessions spill to the other."""
    stop_ray()  # it starts a cluster of its own and connects to it
    report = run_node_loss(
        tmp_path, warm_turns=2, before_s=3.0, after_s=8.0, coordinators=coordinators, out=None
    )
    summary = {k: v for k, v in report.to_dict().items() if k not in ("config", "machine")}
    # placement: the control plane on the head, one replica per model node
    assert report.placement["coordinator"] == ["head"] * coordinators, summary
    assert report.placement["tuner"] == ["head"] * coordinators, summary
    assert report.placement["ingress"] == ["head"], summary
    assert sorted(report.placement["replicas"]) == ["worker-0", "worker-1"], summary
    # every request: its exact greedy tokens, or a clean 503 with Retry-After
    assert report.total.broken == 0, report.broken_details
    assert report.bad_statuses == [] and report.errors_without_retry_after == 0, summary
    assert report.mismatches == 0 and report.checked == report.total.ok > 0, summary
    assert report.cut_at_kill.requests >= 1, "the kill cut a request of the lost node"
    assert report.cut_at_kill.broken == 0 and report.during_loss.broken == 0
    # traffic moves to the survivor, which keeps its cache
    assert report.lost_sessions >= 1 and report.moved_sessions == report.lost_sessions
    assert report.replicas_after == 1 and report.recover_s is not None, summary
    assert report.survivor_sessions >= 1, summary
    assert report.survivor_sessions_cached == report.survivor_sessions, summary
    before, after = report.survivor_hit_before, report.survivor_hit_after
    assert before is not None and after is not None and after >= 0.9 * before, summary
    # the tuner ran, its grid tasks on CPU workers of several nodes
    assert report.tuner_runs >= 2 and len(report.tuner_nodes) >= 2, summary
    assert report.failures() == [], summary
