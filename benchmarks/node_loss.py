"""Losing a model node under load: a head and two worker raylets on this
machine (`local_cluster.LocalCluster`), a real redis-server journal, the full HTTP
service (ingress, coordinator and tuner on the head; one `tiny` replica on each worker),
closed-loop clients running multi-turn sessions, and one worker's raylet killed while
they run.

Reports requests ok / clean errors (by status) / broken, in total and during the loss;
seconds until the node is declared dead, until a session of the lost node completes on
the survivor (`recover_s`) and until /health reports the survivor alone; the token hit
rate of the survivor's sessions before and after; where every actor and tuner task ran;
and whether every completed request's tokens equal an uninterrupted greedy run (the
in-process engine). Writes `--out` (JSON). Exits 1 when an expectation fails
(`NodeLossReport.failures`). `tests/serve/test_node_loss.py` runs the same function.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: one thread per process
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import argparse
import json
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import node_loss_run as steps  # noqa: E402
from local_cluster import ClusterSpec, LocalCluster  # noqa: E402
from node_loss_client import make_sessions  # noqa: E402
from node_loss_report import NodeLossReport, build_report  # noqa: E402
from redis_process import RedisProcess  # noqa: E402
from run_info import machine  # noqa: E402

DEFAULT_OUT = HERE / "results" / "cluster" / "node_loss.json"
APP = "node-loss"
GROUP_KEY_TOKENS = 16
"""The group key of a run with several coordinators: the sessions' first prompts are 40
tokens, so their own first tokens (not a shared prefix) spread them over the group."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_node_loss(
    workdir: Path,
    *,
    sessions: int = 8,
    clients: int = 4,
    warm_turns: int = 3,
    before_s: float = 4.0,
    after_s: float = 12.0,
    max_tokens: int = 6,
    cache_bytes: int = 6_000_000,
    fast_detection: bool = True,
    seed: int = 0,
    coordinators: int = 1,
    out: Path | None = DEFAULT_OUT,
) -> NodeLossReport:
    """One node-loss run (see the module docstring); the report is also written to `out`
    as JSON unless `out` is None. Everything it starts (Ray raylets, redis-server, the
    Serve application) is stopped before it returns or raises. Takes about 80 s on a
    2-core machine with the defaults; needs `redis-server` and no running Ray.

    Args:
        workdir: scratch folder (the model, Redis files).
        sessions / clients: conversations, and the closed-loop HTTP clients running them
            (odd sessions stream; every turn is greedy, `max_tokens` tokens).
        warm_turns: turns every session completes before the timed load starts.
        before_s / after_s: seconds of load before the kill, and after the GCS declared
            the node dead.
        cache_bytes: each replica's cache budget: room for every session on one replica,
            filled first with long prompts so that it evicts (and the tuner runs).
        fast_detection: GCS health checks of ~1.5 s instead of Ray's ~15 s default.
        seed: the sessions' tokens.
        coordinators: the coordinator group's size; with more than one, replicas are
            given to coordinators by node (`group_replicas_by: node`), so the lost node
            takes one coordinator's replicas and its sessions spill to another.
    """
    from ray import serve

    from marconi_ray.engine.presets.factory import make_model
    from marconi_ray.serve.app import run_app, shutdown_app
    from marconi_ray.serve.settings import NAMESPACE, ServeSettings, TunerSettings

    t_start = time.monotonic()
    config: dict[str, Any] = {
        "sessions": sessions,
        "clients": clients,
        "warm_turns": warm_turns,
        "before_s": before_s,
        "after_s": after_s,
        "max_tokens": max_tokens,
        "cache_bytes": cache_bytes,
        "fast_detection": fast_detection,
        "seed": seed,
        "coordinators": coordinators,
    }
    model_dir = make_model("tiny", "nemotron_h", workdir / "tiny")
    spec = ClusterSpec(fast_detection=fast_detection)
    redis = RedisProcess(workdir / "redis", persist=True, fsync="always").start()
    try:
        with LocalCluster(spec, NAMESPACE) as cluster:
            settings = ServeSettings(
                model_dir=str(model_dir),
                model_name="tiny",
                replicas=spec.workers,
                cache_bytes=cache_bytes,
                port=_free_port(),
                app_name=APP,
                redis_url=redis.url,
                heartbeat_s=0.2,
                lease_s=4.0,
                tuner=TunerSettings(multiplier=1, grid=(0.0, 0.5), workers=2),
                model_resource=spec.model_resource,
                coordinators=coordinators,
                group_key_tokens=GROUP_KEY_TOKENS,
                group_replicas_by="node",
            )
            try:
                run_app(settings)
                report = _measure(cluster, settings, config, model_dir, t_start)
            finally:
                shutdown_app(settings)
                serve.shutdown()
    finally:
        redis.stop()
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report


def _measure(
    cluster: LocalCluster,
    settings: Any,
    config: dict[str, Any],
    model_dir: Path,
    t_start: float,
) -> NodeLossReport:
    import ray

    from marconi_ray.serve.settings import NAMESPACE

    url = f"http://{settings.host}:{settings.port}"
    group = settings.group()
    control = steps.Control(
        [ray.get_actor(m.coordinator_name, namespace=NAMESPACE) for m in group],
        [ray.get_actor(m.tuner_name, namespace=NAMESPACE) for m in group],
        settings.group_key_tokens,
    )
    steps.wait_for(lambda: control.registered() == settings.replicas, 180, "replicas registered")
    steps.wait_for(lambda: steps.health(url) is not None, 60, "/health")
    labels, replicas, where = steps.placement(cluster)
    owner = next(c for c in control.coordinators if ray.get(c.replicas.remote()))
    cost = ray.get(owner.cost.remote(ray.get(owner.replicas.remote())[0]))
    steps.fill_caches(url, config["cache_bytes"], cost.kv_bytes_per_token, config["seed"])
    pool = make_sessions(config["sessions"], 40, config["seed"])
    outcomes, timeline = steps.load_and_kill(cluster, url, control, pool, replicas, config)
    return build_report(
        config,
        outcomes,
        timeline,
        labels,
        where,
        control.tuner_history(),
        steps.mismatches(model_dir, outcomes, config["max_tokens"]),
        time.monotonic() - t_start,
        machine(("ray", "torch", "redis")),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Lose a model node under load: a head and two worker raylets on this "
        "machine, the full HTTP service with a Redis journal, closed-loop clients, one "
        "worker's raylet killed. Writes a JSON report; exits 1 if an expectation fails."
    )
    parser.add_argument("--sessions", type=int, default=8, help="conversations (default 8)")
    parser.add_argument(
        "--clients", type=int, default=4, help="closed-loop HTTP clients running them (default 4)"
    )
    parser.add_argument(
        "--warm-turns", type=int, default=3, help="turns per session before the timed load (3)"
    )
    parser.add_argument(
        "--before", type=float, default=4.0, help="seconds of load before the kill (4)"
    )
    parser.add_argument(
        "--after",
        type=float,
        default=12.0,
        help="seconds of load after the GCS declared the killed node dead (12)",
    )
    parser.add_argument("--max-tokens", type=int, default=6, help="greedy tokens per turn (6)")
    parser.add_argument(
        "--cache-bytes", type=int, default=6_000_000, help="cache budget per replica (6e6)"
    )
    parser.add_argument(
        "--ray-default-detection",
        action="store_true",
        help="keep Ray's default GCS health checks (~15 s to declare a node dead) instead "
        "of ~1.5 s",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sessions' tokens (0)")
    parser.add_argument(
        "--coordinators",
        type=int,
        default=1,
        help="coordinator group size; above 1 each node's replicas share one coordinator (1)",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"JSON report (default {DEFAULT_OUT})"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="node-loss-") as tmp:
        report = run_node_loss(
            Path(tmp),
            sessions=args.sessions,
            clients=args.clients,
            warm_turns=args.warm_turns,
            before_s=args.before,
            after_s=args.after,
            max_tokens=args.max_tokens,
            cache_bytes=args.cache_bytes,
            fast_detection=not args.ray_default_detection,
            seed=args.seed,
            coordinators=args.coordinators,
            out=args.out,
        )
    summary = {k: v for k, v in report.to_dict().items() if k not in ("config", "machine")}
    print(json.dumps(summary, indent=2))
    failures = report.failures()
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
