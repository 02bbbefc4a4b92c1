"""The cluster replay (`core.sim.cluster_*`, issue 50 item 7(b)): P/D and mixed clusters of
real prefix caches at equal total bytes.

On synthetic conversations (each session its own tokens, so nothing is shared across
sessions) with room for everything, what each system reuses is known exactly: every turn
after the first reuses the previous turn's prompt and output, except under
`prefill_only`, which lost the output's state and reuses the prompt only. Under byte
pressure every cache ends exact and within capacity; a pull is chosen only when the clock
says it finishes sooner, and a slow link makes none."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.presets import get_preset
from marconi_ray.core.sim.cluster_config import ClusterConfig
from marconi_ray.core.sim.cluster_cost import ClusterCost
from marconi_ray.core.sim.cluster_pd import Both
from marconi_ray.core.sim.cluster_replay import (
    CLUSTER_SYSTEMS,
    get_cluster_system,
    make_system,
    run_cluster,
)
from marconi_ray.core.sim.cluster_result import ClusterResult, Served, gap_recovered, verify
from marconi_ray.core.sim.cluster_route import RouteRule, View, pick
from marconi_ray.traces.trace import Request

COST = CostModel.from_spec(get_preset("paper-7b"))
AMPLE = 10**13  # bytes: nothing is ever evicted on these traces
EQUAL_BYTES = ("colocated", "prefill_only", "both", "mixed", "mixed+remote")


def conversations(
    sessions: int = 6,
    turns: int = 4,
    message: int = 60,
    output: int = 20,
    stagger: float = 0.7,
    gap: float = 5.0,
    jitter: float = 0.0,
    seed: int = 0,
) -> list[Request]:
    """Multi-turn sessions: turn t's input is turn t-1's input and output plus a new
    message; session s uses token ids of its own range, so sessions share nothing. Turn t
    of session s arrives at `s * stagger + t * gap`, plus up to `jitter` (< `gap`) seconds
    drawn at random, its output then 1 to 2x `output` tokens long."""
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    for s in range(sessions):
        lo = 1000 * (s + 1)
        history = np.zeros(0, np.int32)
        for t in range(turns):
            inp = np.concatenate([history, rng.integers(lo, lo + 999, message, dtype=np.int32)])
            n_out = output if not jitter else int(rng.integers(output, 2 * output + 1))
            reply = rng.integers(lo, lo + 999, n_out, dtype=np.int32)
            ts = s * stagger + t * gap + (rng.uniform(0, jitter) if jitter else 0.0)
            out.append(Request(s, t, ts, inp, reply))
            history = np.concatenate([inp, reply])
    return sorted(out, key=lambda r: (r.ts, r.session_id, r.turn_id))


def expected_hits(requests: list[Request], keeps_output: bool) -> list[int]:
    """Each request's reuse on a cache that keeps everything: the previous turn's input
    and output (or its input only, when the output's state is lost)."""
    last: dict[int, Request] = {}
    hits = []
    for r in requests:
        prev = last.get(r.session_id)
        hits.append(0 if prev is None else prev.n_input + (prev.n_output if keeps_output else 0))
        last[r.session_id] = r
    return hits


def replay(
    requests: list[Request], system: str, cfg: ClusterConfig
) -> tuple[ClusterResult, list[Served]]:
    served: list[Served] = []
    return run_cluster(requests, COST, system, cfg, served=served), served


# ---------------------------------------------------------------------- config
@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"total_cache_bytes": 0}, "total_cache_bytes"),
        ({"prefill_replicas": 0}, "prefill_replicas"),
        ({"decode_replicas": 1.5}, "decode_replicas"),
        ({"speedup": math.nan}, "speedup"),
        ({"admission": "bogus"}, "bogus"),
        ({"eviction": "fifo"}, "fifo"),
        ({"alpha": -1.0}, "alpha"),
    ],
)
def test_bad_config_values_raise_naming_them(kwargs: dict[str, object], named: str) -> None:
    args: dict[str, object] = {"total_cache_bytes": AMPLE, **kwargs}
    with pytest.raises(ValueError, match=named):
        ClusterConfig(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda: ClusterCost(prefill_tflops=0), "prefill_tflops"),
        (lambda: ClusterCost(transfer_gbps=math.inf), "transfer_gbps"),
        (lambda: ClusterCost(transfer_latency_s=-1), "transfer_latency_s"),
        (lambda: ClusterCost(decode_batch=0), "decode_batch"),
        (lambda: RouteRule(load_tokens=-1), "load_tokens"),
        (lambda: RouteRule(max_imbalance=-2), "max_imbalance"),
        (lambda: get_cluster_system("disagg"), "disagg"),
        (lambda: make_system("mixed", COST, ClusterConfig(10)), "too small"),
    ],
)
def test_bad_parts_raise_naming_them(build: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        build()  # type: ignore[operator]


def test_requests_out_of_arrival_order_are_refused() -> None:
    reqs = conversations(sessions=2, turns=1)
    with pytest.raises(ValueError, match="before the one before it"):
        run_cluster(reqs[::-1], COST, "mixed", ClusterConfig(AMPLE))


@pytest.mark.parametrize("system", list(CLUSTER_SYSTEMS))
def test_the_total_is_split_evenly_over_the_caches(system: str) -> None:
    cfg = ClusterConfig(10**9 + 7, prefill_replicas=3, decode_replicas=5)
    shares = get_cluster_system(system).shares(cfg)
    caching = [(n, each) for n, each in shares.values() if each]
    held = sum(n * each for n, each in caching)
    parts = sum(n for n, _ in caching)
    assert len({each for _, each in caching}) == 1
    if system == "prefill_only_own":  # its own share: the decode replicas' goes unused
        assert parts == 3 and held == 3 * ((10**9 + 7) // 8)
    else:
        assert 10**9 + 7 - parts < held <= 10**9 + 7
    assert parts == {"colocated": 1, "prefill_only": 3, "prefill_only_own": 3}.get(system, 8)
    computing = sum(n for role, (n, _) in shares.items() if role != "cache")
    assert computing == 8


# ------------------------------------------------------------ exact, ample bytes
@pytest.mark.parametrize("system", list(CLUSTER_SYSTEMS))
def test_ample_bytes_reuse_exactly_what_each_system_keeps(system: str) -> None:
    reqs = conversations()
    result, served = replay(reqs, system, ClusterConfig(AMPLE))
    keeps_output = system not in ("prefill_only", "prefill_only_own")
    assert [s.hit for s in served] == expected_hits(reqs, keeps_output)
    assert result.evictions == 0 and result.routes["pull"] == 0
    if system == "both":  # every later turn is the suffix, on the decode replica
        assert result.routes["decode_suffix"] == sum(r.turn_id > 0 for r in reqs)


def test_ample_bytes_order_the_systems_as_the_targets_expect() -> None:
    reqs = conversations()
    rate = {s: replay(reqs, s, ClusterConfig(AMPLE))[0].token_hit_rate for s in EQUAL_BYTES}
    assert all(rate["colocated"] >= rate[s] for s in EQUAL_BYTES)
    assert rate["both"] > rate["prefill_only"]
    assert rate["both"] == rate["colocated"] == rate["mixed"]


def test_the_handoff_sends_what_the_decode_replica_lacks_after_the_first_token() -> None:
    reqs = conversations(sessions=1, turns=3)
    _, only = replay(reqs, "prefill_only", ClusterConfig(AMPLE))
    # nothing cached on the decode side: the whole prompt's KV and one state, every turn
    assert [s.pd_bytes for s in only] == [COST.kv_bytes(r.n_input) + COST.state_bytes for r in reqs]
    slow = ClusterConfig(AMPLE, clock=ClusterCost(transfer_gbps=1e-3))
    _, late = replay(reqs, "prefill_only", slow)
    assert [s.ttft_s for s in late] == [s.ttft_s for s in only]  # not part of TTFT
    assert all(a.pd_s > 1000 * b.pd_s for a, b in zip(late, only, strict=True))
    _, both = replay(reqs, "both", ClusterConfig(AMPLE))
    assert both[0].pd_bytes == only[0].pd_bytes and both[1].pd_bytes == 0  # suffix on D


# ------------------------------------------------------------ pressure, pulls
def busy(max_imbalance: int = 4) -> ClusterConfig:
    """1 P + 1 D (or 2 mixed) replicas; with `dense` arrivals and `max_imbalance` 0 the
    router must take the least loaded replica, so sessions are often sent away from their
    hit."""
    route = RouteRule(max_imbalance=max_imbalance)
    return ClusterConfig(AMPLE, prefill_replicas=1, decode_replicas=1, route=route)


def dense() -> list[Request]:
    return conversations(
        sessions=8, turns=5, message=200, output=50, stagger=0.05, gap=0.5, jitter=0.4
    )


def test_remote_hits_win_back_what_routing_away_loses() -> None:
    reqs = dense()
    cfg = busy(max_imbalance=0)
    mixed, _ = replay(reqs, "mixed", cfg)
    remote, served = replay(reqs, "mixed+remote", cfg)
    assert [s.hit for s in served] == expected_hits(reqs, keeps_output=True)
    assert mixed.token_hit_rate < remote.token_hit_rate
    assert remote.routes["pull"] > 0 and remote.pull_bytes_per_request > 0


@pytest.mark.parametrize("system", ["mixed+remote", "both"])
def test_a_pull_is_chosen_only_when_the_clock_says_it_finishes_sooner(system: str) -> None:
    reqs = dense()
    fast, served = replay(reqs, system, busy(max_imbalance=0))
    assert fast.routes["pull"] > 0
    for s in served:
        if s.route == "pull":
            assert s.planned_s < s.best_local_s and s.pull_bytes > 0 and s.pull_s > 0
        else:
            assert s.planned_s == s.best_local_s and s.pull_bytes == 0 and s.pull_s == 0
        assert s.ttft_s == pytest.approx(s.planned_s)  # ample bytes: every import fits
    slow_link = dataclasses.replace(busy(max_imbalance=0), clock=ClusterCost(transfer_gbps=1e-3))
    slow, _ = replay(reqs, system, slow_link)
    assert slow.routes["pull"] == 0 and slow.pull_bytes_per_request == 0


@pytest.mark.parametrize("system", list(CLUSTER_SYSTEMS))
def test_under_pressure_every_cache_stays_exact_and_within_capacity(system: str) -> None:
    reqs = dense()
    turn = COST.kv_bytes(max(r.n_input + r.n_output for r in reqs)) + 2 * COST.state_bytes
    cfg = dataclasses.replace(busy(max_imbalance=1), total_cache_bytes=3 * turn, check=True)
    result, served = replay(reqs, system, cfg)
    assert result.evictions > 0
    assert 0 < result.peak_fraction <= 1
    assert sum(result.routes.values()) == len(reqs) == result.requests
    assert result.hit_tokens == sum(s.hit for s in served)
    assert all(s.hit <= r.n_input for s, r in zip(served, reqs, strict=True))
    assert all(s.ttft_s >= 0 for s in served)


def test_verify_names_a_cache_left_with_an_open_plan() -> None:
    cluster = make_system("mixed", COST, busy())
    _, cache = cluster.caches()[1]
    cache.plan(np.arange(1, 50, dtype=np.int32))
    with pytest.raises(AssertionError, match=r"mixed 1.*open"):
        verify(cluster.caches())


# ------------------------------------------------------------ router, summary
def test_pick_mirrors_the_live_cache_aware_router() -> None:
    routers = pytest.importorskip("marconi_ray.serve.coordinator.routing.routers")
    rng = np.random.default_rng(3)
    q = 1e12
    for imbalance in (0, 1, 4):
        live = routers.CacheAwareRouter(load_tokens=256, max_imbalance=imbalance)
        for _ in range(300):
            n = int(rng.integers(1, 7))
            hits = rng.integers(0, 4, n) * 100
            opens = rng.integers(0, 4, n)
            leaf = rng.random(n) < 0.3
            flops = [float(COST.prefill_flops(int(h))) for h in hits]
            ours = [
                View(int(h), bool(b), int(o), f)
                for h, b, o, f in zip(hits, leaf, opens, flops, strict=True)
            ]
            theirs = [
                routers.ReplicaView(str(i), int(h), f, int(o), q, bool(b))
                for i, (h, b, o, f) in enumerate(zip(hits, leaf, opens, flops, strict=True))
            ]
            assert str(pick(ours, q, imbalance)) == live.choose(np.zeros(1, np.int32), theirs)


def test_gap_recovered() -> None:
    base, _ = replay(conversations(sessions=2, turns=2), "prefill_only", ClusterConfig(AMPLE))

    def at(rate: float) -> ClusterResult:
        return dataclasses.replace(base, token_hit_rate=rate)

    assert gap_recovered(at(0.2), at(0.6), at(0.5)) == pytest.approx(0.75)
    assert gap_recovered(at(0.2), at(0.6), at(0.1)) == pytest.approx(-0.25)
    assert gap_recovered(at(0.6), at(0.6), at(0.9)) is None


@pytest.mark.data("mooncake")
def test_mooncake_head_replays_through_every_system() -> None:
    from marconi_ray.traces.registry import load_trace

    reqs = list(load_trace("mooncake-chained").head(300))
    for system in CLUSTER_SYSTEMS:
        result = run_cluster(reqs, COST, system, ClusterConfig(24 * 10**10))
        assert result.requests == 300 and 0 <= result.token_hit_rate <= 1
        assert result.peak_fraction <= 1 and result.ttft_p50_s <= result.ttft_p99_s


def test_a_replica_checkpoints_only_inside_prompts_it_prefilled() -> None:
    shared = np.arange(1, 301, dtype=np.int32)  # a prefix two sessions share
    reqs = [
        Request(s, 0, 10.0 * s, np.concatenate([shared, np.full(40, 500 + s, np.int32)]), out)
        for s, out in enumerate([np.full(10, 900, np.int32), np.full(10, 901, np.int32)])
    ]
    cluster = Both(COST, busy())
    for r in reqs:
        cluster.serve(r.input_tokens, r.output_tokens, r.ts)
    prefill, decode = cluster.prefill[0].cache, cluster.decode[0].cache
    assert prefill is not None and decode is not None
    # both prompts went through the one prefill replica, which found the branch point
    assert prefill.lookup(shared) == len(shared)
    # the decode replica received both prompts and decoded them: their ends, no branch
    assert decode.lookup(shared) == 0
    assert decode.lookup(np.concatenate([reqs[1].input_tokens, reqs[1].output_tokens])) > 0


# ------------------------------------------------------------ the benchmark
def _bench() -> Any:
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_disagg_replay.py"
    sys.path.insert(0, str(script.parent))
    import bench_disagg_replay

    return bench_disagg_replay


def test_bench_defaults_and_bad_options() -> None:
    bench = _bench()
    args = bench.parse_args([])
    assert args.trace_names == ["mooncake", "swebench"] and args.sizes == [4.0, 10.0, 40.0]
    assert args.system_names == list(CLUSTER_SYSTEMS) and args.loads == [1.0, 4.0]
    cfg = bench.base_config(args)
    assert (cfg.prefill_replicas, cfg.decode_replicas, cfg.clock) == (8, 16, ClusterCost())
    for bad in (["--traces", "sharegpt"], ["--gb-per-replica", "0"], ["--systems", "x"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    with pytest.raises(ValueError, match="transfer_gbps"):
        bench.base_config(bench.parse_args(["--transfer-gbps", "0"]))


@pytest.mark.data("mooncake")
def test_bench_writes_its_report_tables_and_plot(tmp_path: Path) -> None:
    bench = _bench()
    out = tmp_path / "out"
    argv = ["--traces", "mooncake", "--requests", "60", "--gb-per-replica", "2,40"]
    report = bench.main([*argv, "--speedups", "1", "--out", str(out)])
    assert {p.name for p in out.iterdir()} == {
        "disagg_replay.json",
        "disagg_replay.md",
        "disagg_replay.png",
    }
    assert len(report["runs"]) == 2 * len(CLUSTER_SYSTEMS) and len(report["targets"]) == 2
    saved = json.loads((out / "disagg_replay.json").read_text())
    assert saved["runs"] == report["runs"]
    assert "gap recovered" in (out / "disagg_replay.md").read_text()


def test_routing_on_held_kv_gathers_a_shared_prefix_before_it_has_a_state() -> None:
    shared = np.arange(1, 301, dtype=np.int32)
    reqs = [
        Request(s, 0, ts, np.concatenate([shared, np.full(40, 500 + s, np.int32)]), out)
        for s, (ts, out) in enumerate(
            [
                (0.0, np.full(200, 7, np.int32)),
                (0.1, np.full(5, 8, np.int32)),
                (10.0, np.ones(5, np.int32)),
            ]
        )
    ]
    hits = {}
    for weigh_kv in (False, True):
        cfg = dataclasses.replace(busy(), route=RouteRule(weigh_kv=weigh_kv))
        hits[weigh_kv] = [s.hit for s in replay(reqs, "mixed", cfg)[1]]
    # the second request leaves the busy replica holding the first's KV: no branch state
    assert hits[False] == [0, 0, 0]
    # held KV counts: the second meets the first, its branch state serves the third
    assert hits[True] == [0, 0, len(shared)]
