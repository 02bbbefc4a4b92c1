"""Routing at cluster scale: the coordinator's cost per request
as the replicas grow, the indexed coordinator next to the reference, in one run.

Variants (both are the real `CacheCoordinator`, the same state code, the same journal):
- `indexed`: as built: `route` walks the routing index once and the trees of the
  replicas it names only; expired leases and silent replicas come off deadline heaps.
- `reference` (`--reference-routing`, on by default; `cluster_load.ReferenceCoordinator`):
  `route` is the former `choose_replica_reference` (a view of every replica: one tree
  walk each) and every plan and heartbeat also scans every lease and every replica as
  `_expire` used to. It keeps the routing index up to date like `indexed` does (one
  state class), so its figures are the former cost plus that upkeep.

Sections (`--sections`, default all three):
- `scaling`: a coordinator in process (no Ray, the in-memory journal) with R in
  `--replicas` registered replicas served by one fake worker (`bench_serve.FakeWorker`:
  state ids and KV slots as a worker reports them, no model). Warm-up
  (`cluster_load.Sessions`): `--sessions` x max(`--replicas`) sessions of `--turns`
  turns at every R (12 per replica at 128, more per replica below: the state, and the
  timed cuts each session chain takes, are then alike at every R and only the replica
  count varies; with 12 sessions in all, one replica's chains would each be cut ~250
  times by the timed prompts and its walks would grow for that reason alone), each turn
  of R sessions planned together before they commit (so first turns spread one per
  replica and later turns stay with the replica holding their state). Timed: `--pairs`
  plan + commit pairs, one at a time, each prompt a random session's history cut at a
  uniform random depth plus `--fresh-tokens` new tokens; the fake worker's time is not
  counted. The variants run the same prompts in alternating rounds. Reports pairs/s,
  p50/p99 per pair, the mean hit and the cost at R over the cost at 1 replica.
- `ray`: the same through a coordinator Ray actor (`ray.init(num_cpus=4)`, local) with
  `--ray-replicas` replicas: `--callers` concurrent callers, plans through the ingress's
  `PlanBatcher` (`plan_many` batches), commits coalesced per replica into `commit_many`
  as a replica's step sends them. Reports pairs/s, p50/p99 per pair and the CPU ms per
  pair of the coordinator actor's process and of the driver (the callers). With
  `--coordinators 1,2` it also runs the indexed coordinator as K actors, each owning
  every K-th replica, each prompt sent to the one `cluster_load.group_of` picks (a hash
  of its first `--group-key-tokens` tokens): one record per K in `ray.runs` (pairs/s,
  p50/p99, the CPU per pair of all coordinator processes and of the driver, the share
  of the plans the busiest coordinator took). `--commits replica,relay` runs each K with
  the commits sent both ways: `replica`, a `commit_many` per replica as its step loop
  sends them (coalesced per replica); `relay` (the service's default,
  `settings.commit_relay`), each commit through the caller's `PlanBatcher` with the
  plans, as an ingress relays it (`step_many`), carrying the fake replica's log
  acknowledgement (the last entry its dispatches brought).
- `node_loss`: `node_loss.run_node_loss` with its defaults (about 80 s; a head and two
  worker raylets on this machine, the full HTTP service on a Redis journal, closed-loop
  clients, one worker's raylet killed): requests ok / clean errors / broken during the
  loss, seconds until a lost session is served again and until /health shows the
  survivor, the survivor's sessions' hit rate before and after. Runs after `ray` has
  shut its local Ray down (it starts its own cluster). Also in OUT/node_loss.json.

Targets: p50 per pair at 128 replicas <= 1.5x the p50 at 1 (indexed; the median, as the
2-core machine's load from other work inflates the mean and p99 unevenly), >= 3,000
pairs/s in process at 128, >= 1,000 pairs/s through Ray. Writes OUT/bench_cluster.json and
OUT/cluster.png; prints the figures side by side with the ratios and verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import run_info
from bench_serve import FakeWorker, pct
from cluster_load import (
    KV_BYTES,
    STATE_BYTES,
    VARIANTS,
    Sessions,
    group_of,
    replica_ids,
    settings_for,
)
from cluster_report import plot, table, verdicts
from tqdm import tqdm

from marconi_ray.serve.messages import Dispatch

HERE = Path(__file__).resolve().parent
SECTIONS = ("scaling", "ray", "node_loss")


# ---------------------------------------------------------------------- sections
class Run:
    """One (replica count, variant): its warmed coordinator, sessions, worker, timings."""

    def __init__(self, args: argparse.Namespace, model_dir: Path, r: int, name: str) -> None:
        self.coord = VARIANTS[name](settings_for(model_dir))
        self.work = Sessions(args, r, args.sessions * max(args.replicas))
        self.worker, self.times, self.hits = FakeWorker(), list[float](), list[int]()
        for rid in replica_ids(r):
            self.coord.register_replica(rid, KV_BYTES, STATE_BYTES)
        c, w = self.coord, self.work
        plans = lambda ps: [c.plan(p, w.params) for p in ps]  # noqa: E731
        commit = lambda d, done: c.commit(d.replica_id, done, d.needs)  # noqa: E731
        w.warm(plans, commit, self.worker, f"warm {r} {name}")
        c.snapshot()  # every run's timed pairs meet the journal's snapshots at the same seqs

    def pairs(self, prompts: list[np.ndarray]) -> None:
        """Plan and commit each prompt; the worker's part is not timed."""
        coord, work, worker = self.coord, self.work, self.worker
        for p in prompts:
            t0 = time.perf_counter()
            d = coord.plan(p, work.params)
            t1 = time.perf_counter()
            done = worker.finish(d.order, work.output(p))
            t2 = time.perf_counter()
            coord.commit(d.replica_id, done, d.needs)  # it applied what the dispatch brought
            self.times.append(t1 - t0 + time.perf_counter() - t2)
            self.hits.append(d.order.hit_len)

    def figures(self) -> dict[str, Any]:
        return {
            "pairs_s": len(self.times) / sum(self.times),
            "pair": pct(self.times),
            "mean_hit_tokens": float(np.mean(self.hits)),
            "nodes": self.coord.state.node_count(),
        }


def scaling(args: argparse.Namespace, model_dir: Path, names: list[str]) -> dict[str, Any]:
    """The `scaling` section (module docstring): {R: {variant: figures}}. Every (R,
    variant) is warmed first; then the timed pairs run in `--rounds` rounds, each round
    a chunk of every run in turn (orders alternating), so that a change of the machine's
    load during the run falls on all of them alike."""
    runs = {(r, n): Run(args, model_dir, r, n) for r in args.replicas for n in names}
    prompts = {r: runs[r, names[0]].work.timed(args.pairs) for r in args.replicas}
    # what exists now (torch and transformers, imported to build the model; the warmed
    # trees) is never collected: full collections would walk it every ~0.5 s, 200-250 ms
    # each, and land on whichever run is timing then (a coordinator process has no torch)
    gc.collect()
    gc.freeze()
    keys = list(runs)
    bar = tqdm(total=args.pairs * len(keys), desc="plan+commit pairs", disable=None)
    for k, chunk in enumerate(np.array_split(np.arange(args.pairs), args.rounds)):
        for r, name in keys if k % 2 == 0 else keys[::-1]:
            runs[r, name].pairs([prompts[r][j] for j in chunk])
            bar.update(len(chunk))
    bar.close()
    return {str(r): {n: runs[r, n].figures() for n in names} for r in args.replicas}


def ray_variant(
    args: argparse.Namespace, model_dir: Path, name: str, k: int = 1, relay: bool = False
) -> dict[str, Any]:
    """One run of the `ray` section: `k` coordinator actors of `name`, each owning every
    k-th replica (a coordinator group's partition; each prompt goes to the coordinator
    `group_of` picks), warm-up, timed callers; commits relayed with the plans (`relay`)
    or one `commit_many` per replica."""
    import ray

    from marconi_ray.serve.ingress.coalescer import Coalescer
    from marconi_ray.serve.ingress.plan_batcher import PlanBatcher
    from marconi_ray.serve.messages import RelayedCommit

    r = args.ray_replicas
    worker, work = FakeWorker(), Sessions(args, r, args.sessions * r)
    actor = ray.remote(VARIANTS[name]).options(num_cpus=0)
    coords = [actor.remote(settings_for(model_dir)) for _ in range(k)]
    rids = replica_ids(work.replicas)
    owner = {rid: coords[i % k] for i, rid in enumerate(rids)}
    ray.get([owner[rid].register_replica.remote(rid, KV_BYTES, STATE_BYTES) for rid in rids])

    def group(prompt: np.ndarray) -> int:
        return group_of(prompt, k, args.group_key_tokens)

    def plans(ps: list[np.ndarray]) -> list[Dispatch]:
        """Each prompt planned by its group's coordinator (one `plan_many` per group)."""
        by: dict[int, list[int]] = {}
        for i, p in enumerate(ps):
            by.setdefault(group(p), []).append(i)
        calls = {
            g: coords[g].plan_many.remote([(ps[i], work.params, 0.0) for i in idx])
            for g, idx in by.items()
        }
        out: list[Any] = [None] * len(ps)
        for g, idx in by.items():
            for i, d in zip(idx, ray.get(calls[g]), strict=True):
                out[i] = d
        assert all(isinstance(d, Dispatch) for d in out), out
        return out

    def commit(d: Dispatch, done: Any) -> Any:
        return ray.get(owner[d.replica_id].commit.remote(d.replica_id, done, d.needs))

    work.warm(plans, commit, worker, f"warm ray {name} x{k}")
    prompts, pairs = work.timed(args.ray_pairs), []
    batchers = [PlanBatcher(c) for c in coords]
    outputs = {id(p): work.output(p) for p in prompts}  # made now: the driver has less to do
    commits: dict[str, Coalescer[Any, None]] = {}

    applied: dict[str, int] = {}  # each fake replica acknowledges what it was sent

    async def commit_many(rid: str, done: list[Any]) -> list[None]:
        answer = await owner[rid].commit_many.remote(rid, done, applied.get(rid, 0))
        applied[rid] = max(applied.get(rid, 0), answer.last)
        return [None] * len(done)

    async def caller(todo: Any) -> None:
        for p in todo:
            t0 = time.perf_counter()
            batcher = batchers[group(p)]
            d = await batcher.plan(p, work.params, time.time())
            t1 = time.perf_counter()
            done = worker.finish(d.order, outputs[id(p)])
            t2 = time.perf_counter()
            rid = d.replica_id
            applied[rid] = max(applied.get(rid, 0), d.releases.last)  # what it brought
            if relay:  # the ingress sends it with its next call, answers once applied
                await batcher.commit(RelayedCommit(rid, d.generation, done, applied[rid]))
                pairs.append(t1 - t0 + time.perf_counter() - t2)
                continue
            if d.replica_id not in commits:  # one per replica, as each one's step loop
                commits[d.replica_id] = Coalescer(functools.partial(commit_many, d.replica_id))
            await commits[d.replica_id].submit(done)
            pairs.append(t1 - t0 + time.perf_counter() - t2)

    async def run() -> float:
        todo, t0 = iter(prompts), time.perf_counter()
        await asyncio.gather(*(caller(todo) for _ in range(args.callers)))
        return time.perf_counter() - t0

    pids = ray.get([c.__ray_call__.remote(lambda _: os.getpid()) for c in coords])
    before = ([process_cpu(pid) for pid in pids], time.process_time())
    wall = asyncio.run(run())
    per_coord = [process_cpu(pid) - b for pid, b in zip(pids, before[0], strict=True)]
    used = (sum(per_coord), time.process_time() - before[1])
    for c in coords:
        ray.kill(c)
    n = len(pairs)
    out = {"pairs_s": n / wall, "wall_s": wall, "pair": pct(pairs)}
    out["cpu_ms_per_pair"] = {k_: 1e3 * v / n for k_, v in zip(CPU, used, strict=True)}
    planned = [b.planned for b in batchers]
    calls = sum(b.calls for b in batchers) + sum(c.calls for c in commits.values())
    return out | {
        "coordinators": k,
        "commits": "relay" if relay else "replica",
        "calls_per_pair": calls / n,
        "plans_per_call": sum(planned) / max(1, sum(b.calls for b in batchers)),
        "busiest_share": max(planned) / max(1, sum(planned)),
        "coordinator_cpu_ms": [1e3 * v / n for v in per_coord],
    }


CPU = ("coordinator", "driver")


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process `pid` has used, from /proc (0.0 without it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ray_section(args: argparse.Namespace, model_dir: Path, names: list[str]) -> dict[str, Any]:
    """The `ray` section (module docstring): {variant: figures}, on a local Ray."""
    import ray

    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    env = {"env_vars": {"PYTHONPATH": path}}  # the actor imports cluster_load
    ray.init(
        address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, runtime_env=env
    )
    try:
        out: dict[str, Any] = {name: ray_variant(args, model_dir, name) for name in names}
        groups = [
            out["indexed"] if (k, mode) == (1, "replica")
            else ray_variant(args, model_dir, "indexed", k, mode == "relay")
            for mode in args.commits for k in args.coordinators
        ]  # fmt: skip
    finally:
        ray.shutdown()
    out["runs"] = [
        {
            "coordinators": g["coordinators"],
            "commits": g["commits"],
            "calls_per_pair": g["calls_per_pair"],
            "pairs_s": g["pairs_s"],
            "p50_ms": g["pair"]["p50_ms"],
            "p99_ms": g["pair"]["p99_ms"],
            "coordinator_cpu_ms_per_pair": g["cpu_ms_per_pair"]["coordinator"],
            "driver_cpu_ms_per_pair": g["cpu_ms_per_pair"]["driver"],
            "busiest_share": g["busiest_share"],
            "plans_per_call": g["plans_per_call"],
        }
        for g in groups
    ]
    return out | {"replicas": args.ray_replicas, "callers": args.callers}


# ---------------------------------------------------------------------- driver
OPTIONS = (  # name, type, default, help
    ("sessions", int, 12, "warm-up sessions per replica at the largest replica count"),
    ("turns", int, 4, "turns per warm-up session"),
    ("first_tokens", int, 200, "tokens of a session's first prompt"),
    ("turn_tokens", int, 100, "new user tokens of each later turn"),
    ("out_tokens", int, 16, "tokens each request generates (fake)"),
    ("fresh_tokens", int, 16, "new tokens after a timed prompt's cut"),
    ("pairs", int, 3000, "scaling: timed plan+commit pairs per replica count and variant"),
    ("rounds", int, 12, "scaling: alternating rounds the pairs are split over"),
    ("ray_replicas", int, 128, "ray: registered replicas"),
    ("ray_pairs", int, 4000, "ray: timed pairs per variant"),
    ("group_key_tokens", int, 256, "ray: prompt tokens the coordinator group key hashes"),
    ("callers", int, 8, "ray: concurrent callers"),
)


def node_loss_section(workdir: Path, out: Path) -> dict[str, Any]:
    """One `run_node_loss` with its defaults: its report (also OUT/node_loss.json) and
    the expectations it failed (none when the run met every one)."""
    from node_loss import run_node_loss

    report = run_node_loss(workdir, out=out / "node_loss.json")
    summary = {k: v for k, v in report.to_dict().items() if k not in ("config", "machine")}
    summary["failures"] = report.failures()
    for name in ("total", "during_loss"):
        window = summary[name]
        print(
            f"node loss, {name}: {window['requests']} requests, {window['ok']} ok, "
            f"errors {window['errors']}, {window['broken']} broken"
        )
    print(
        f"node loss: lost sessions served again {summary['recover_s']:.2f} s after the "
        f"kill; survivor's hit rate {summary['survivor_hit_before']} -> "
        f"{summary['survivor_hit_after']}; failed expectations: {summary['failures']}"
    )
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    p.add_argument(
        "--out", default=str(HERE / "results" / "cluster"), help="output folder [%(default)s]"
    )
    sections = ", ".join(SECTIONS)
    p.add_argument(
        "--sections",
        default="scaling,ray,node_loss",
        help=f"comma-separated sections to run: {sections} [%(default)s]",
    )
    p.add_argument(
        "--replicas",
        default="1,8,32,128",
        help="scaling: comma-separated replica counts [%(default)s]",
    )
    p.add_argument(
        "--coordinators",
        default="1,2",
        help="ray: comma-separated coordinator counts K, each run with the replicas split "
        "among K coordinator actors by the group key [%(default)s]",
    )
    p.add_argument(
        "--commits",
        default="replica,relay",
        help="ray: comma-separated ways the commits travel, each run for every K: replica "
        "(a commit_many per replica step), relay (with the plans, as the ingress relays "
        "them: the service's default) [%(default)s]",
    )
    p.add_argument(
        "--reference-routing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the reference coordinator (former O(replicas) routing and expiry "
        "scans) side by side with the indexed one (--no-reference-routing: indexed only)",
    )
    for name, typ, default, text in OPTIONS:
        p.add_argument(
            f"--{name.replace('_', '-')}", type=typ, default=default, help=f"{text} [%(default)s]"
        )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 4 sessions per replica, 400 pairs in 4 rounds, 1,000 Ray pairs",
    )
    args = p.parse_args(argv)
    args.sections = [x.strip() for x in args.sections.split(",") if x.strip()]
    if bad := set(args.sections) - set(SECTIONS):
        p.error(f"unknown section(s) {sorted(bad)}; choose from {list(SECTIONS)}")
    try:
        args.replicas = [int(x) for x in args.replicas.split(",") if x.strip()]
    except ValueError:
        p.error(f"--replicas: comma-separated integers, got {args.replicas!r}")
    try:
        args.coordinators = [int(x) for x in args.coordinators.split(",") if x.strip()]
    except ValueError:
        p.error(f"--coordinators: comma-separated integers, got {args.coordinators!r}")
    args.commits = [x.strip() for x in args.commits.split(",") if x.strip()]
    if not args.commits or set(args.commits) - {"replica", "relay"}:
        p.error(f"--commits: replica and/or relay, got {args.commits}")
    if not args.coordinators or min(args.coordinators) < 1:
        p.error(f"--coordinators: counts >= 1, got {args.coordinators}")
    if not args.replicas or min(args.replicas) < 1:
        p.error(f"--replicas: counts >= 1, got {args.replicas}")
    if args.quick:
        vars(args).update(pairs=400, rounds=4, sessions=4, ray_pairs=1000)
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from marconi_ray.engine.presets.factory import make_model

    names = ["indexed", "reference"] if args.reference_routing else ["indexed"]
    config = {k: v for k, v in vars(args).items()}
    report: dict[str, Any] = {
        "config": config,
        "machine": run_info.machine(("ray", "numpy", "marconi-ray")),
    }
    start = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model("tiny", "nemotron_h", Path(tmp) / "tiny")  # its config only
        if "scaling" in args.sections:
            report["scaling"] = scaling(args, model_dir, names)
        if "ray" in args.sections:
            report["ray"] = ray_section(args, model_dir, names)
        if "node_loss" in args.sections:
            report["node_loss"] = node_loss_section(Path(tmp) / "node_loss", out)
    report["wall_s"] = time.perf_counter() - start
    report["targets"] = verdicts(report)
    (out / "bench_cluster.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "cluster.png")
    print(f"\n{table(report)}\nwall time {report['wall_s']:.0f} s")
    print(f"wrote {out / 'bench_cluster.json'}, {out / 'cluster.png'}")
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
