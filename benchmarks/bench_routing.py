"""Checkpoint-aware routing vs round-robin across replicas (issue "checkpoint-aware routing
across replicas"), measured side by side in one run.

One local Ray instance and one Serve HTTP proxy on 127.0.0.1:PORT. For each routing
strategy in turn (default: cache_aware, then round_robin) the real service is deployed
(its own Serve app `route-bench-<strategy>` with coordinator, tuner, ingress and REPLICAS
model replicas of the same model), warmed up (2 short random requests per replica, sent
together), and the SAME multi-turn ShareGPT sessions are replayed against it over HTTP
by the load generator (`loadgen.runner.run_load`: CONCURRENCY fixed users, each running
its sessions one after another, every turn's prompt = previous prompt + the model's
actual reply + the next user message, token prompts mapped into the model's vocabulary,
greedy with ignore_eos so every strategy sees the same prompts and decodes the same
lengths); then it is torn down. With --rounds > 1 the order of the strategies alternates
from round to round and the figures pool every round.

Reported per strategy:
- server-side token hit rate: cached prompt tokens / prompt tokens over the load, from
  the coordinator's cache statistics (delta over the load, warm-up excluded; the
  /metrics scrape delta is kept beside it in the JSON);
- resumed turns: later turns (turn > 0) whose cached prefix covers the session's whole
  previous turn (prompt + reply), i.e. served by the replica that holds its last state;
- requests per replica, mean / P50 / P95 TTFT and mean end-to-end latency (client side);
- ratios of every other strategy over cache_aware (round_robin / cache_aware).

Data: the artifact-mode ShareGPT trace from the shared data folder (../shared/data or
$MARCONI_DATA_DIR). Without it the packaged 20-session ShareGPT sample is used (the
fallback is printed and recorded). Writes OUT/bench_routing.json, OUT/bench_routing.md
and OUT/routing.png (bars: hit rate, mean and P95 TTFT per strategy).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from loadgen.config import LoadConfig, RequestRecord
from loadgen.metrics import distribution
from marconi_ray.serve.coordinator.routing.routers import ROUTERS
from marconi_ray.serve.settings import NAMESPACE, ServeSettings
from marconi_ray.traces.sharegpt import default_path as sharegpt_path

BASELINE = "cache_aware"
WARMUP_PROMPT_TOKENS = 24


# ---------------------------------------------------------------------- setup
def pick_trace(spec: str) -> tuple[str, str | None]:
    """The trace to replay and a note when `auto` fell back to the packaged sample."""
    if spec != "auto":
        return spec, None
    path = sharegpt_path("artifact")
    if path.is_file():
        return "sharegpt", None
    return "sample", f"{path} not found: using the packaged 20-session ShareGPT sample"


def settings_for(args: argparse.Namespace, model_dir: Path, strategy: str) -> ServeSettings:
    """The deployment of one strategy (everything but `routing` and the app name shared)."""
    return ServeSettings(
        model_dir=str(model_dir),
        model_name=model_dir.name,
        replicas=args.replicas,
        cache_bytes=args.cache_bytes,
        system=args.system,
        port=args.port,
        max_batch=args.max_batch,
        routing=strategy,
        route_load_weight=args.route_load_weight,
        route_max_imbalance=args.route_max_imbalance,
        app_name=f"route-bench-{strategy}",
    )


def start_ray(args: argparse.Namespace, first: ServeSettings) -> None:
    import ray
    from ray import serve

    from marconi_ray.cli.serve import cpus_needed

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(
        address="local",
        num_cpus=max(args.ray_cpus, cpus_needed(first)),
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
    )
    serve.start(http_options={"host": first.host, "port": args.port})


def stop_ray() -> None:
    import ray
    from ray import serve

    with contextlib.suppress(Exception):
        serve.shutdown()  # type: ignore[no-untyped-call]
    ray.shutdown()


def deploy(settings: ServeSettings, timeout_s: float = 180.0) -> Any:
    """Deploy one strategy's app; returns its coordinator once every replica registered."""
    import ray
    from ray import serve

    from marconi_ray.serve.app import build_app, start_actors

    start_actors(settings)
    serve.run(build_app(settings), name=settings.app_name, route_prefix="/")
    coordinator = ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
    deadline = time.monotonic() + timeout_s
    while len(ray.get(coordinator.replicas.remote())) < settings.replicas:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{settings.app_name}: replicas did not register")
        time.sleep(0.2)
    return coordinator


async def _warm_up(url: str, model: str, n: int, vocab: int, seed: int) -> list[str | None]:
    import aiohttp

    from loadgen.client import stream_completion

    rng = np.random.default_rng(seed)
    bodies = [
        {
            "model": model,
            "prompt": rng.integers(7, vocab - 1, WARMUP_PROMPT_TOKENS).tolist(),
            "max_tokens": 4,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        for _ in range(n)
    ]
    async with aiohttp.ClientSession() as http:
        outs = await asyncio.gather(*(stream_completion(http, url, b, 300.0) for b in bodies))
    return [o.error for o in outs]


def cache_totals(coordinator: Any) -> dict[str, dict[str, float]]:
    """Per replica: the coordinator's cumulative cache counters."""
    import ray

    keys = (
        "requests",
        "hit_requests",
        "input_tokens",
        "hit_tokens",
        "flops_total",
        "flops_saved",
        "evictions",
    )
    out: dict[str, dict[str, float]] = {}
    for st in ray.get(coordinator.stats.remote()):
        out[st.replica_id] = {k: float(st.stats[k]) for k in keys}
    return out


def totals_delta(
    before: dict[str, dict[str, float]], after: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    return {
        rid: {k: v - before.get(rid, {}).get(k, 0.0) for k, v in figures.items()}
        for rid, figures in after.items()
    }


# ---------------------------------------------------------------------- one run
def run_strategy(
    args: argparse.Namespace, model_dir: Path, strategy: str, load: LoadConfig, vocab: int
) -> dict[str, Any]:
    """Deploy, warm up, replay the load, read the coordinator's figures, tear down."""
    from loadgen.runner import run_load
    from marconi_ray.serve.app import shutdown_app

    settings = settings_for(args, model_dir, strategy)
    t0 = time.perf_counter()
    try:
        coordinator = deploy(settings)
        deploy_s = time.perf_counter() - t0
        errors = asyncio.run(
            _warm_up(load.url, settings.model_name, 2 * settings.replicas, vocab, args.seed)
        )
        if any(errors):
            raise RuntimeError(f"{strategy}: warm-up failed: {errors}")
        before = cache_totals(coordinator)
        result = run_load(replace(load, model=settings.model_name), progress=not args.no_progress)
        replicas = totals_delta(before, cache_totals(coordinator))
    finally:
        shutdown_app(settings)
    return {
        "records": result.records,
        "replicas": replicas,
        "metrics_delta": result.summary.get("server"),
        "wall_s": result.wall_s,
        "deploy_s": deploy_s,
    }


# ---------------------------------------------------------------------- figures
def resumed_turns(records: list[RequestRecord]) -> tuple[int, int]:
    """(later turns resumed from the session's whole previous turn, later turns)."""
    prev: dict[int, RequestRecord] = {}
    resumed = later = 0
    for r in sorted(records, key=lambda r: (r.session_id, r.turn)):
        p = prev.get(r.session_id)
        if r.error is None and r.turn > 0 and p is not None and p.turn == r.turn - 1:
            later += 1
            resumed += r.cached_tokens >= p.prompt_tokens + p.output_tokens
        if r.error is None:
            prev[r.session_id] = r
    return resumed, later


def strategy_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One strategy's figures pooled over its rounds."""
    records = [r for run in runs for r in run["records"] if not r.warmup]
    done = [r for r in records if r.error is None]
    per_replica: dict[str, float] = {}
    sums: dict[str, float] = {}
    for run in runs:
        for i, figures in enumerate(run["replicas"].values()):
            per_replica[f"replica{i}"] = per_replica.get(f"replica{i}", 0) + figures["requests"]
            for k, v in figures.items():
                sums[k] = sums.get(k, 0.0) + v
    resumed, later = resumed_turns(records)
    ttft = distribution(r.ttft_ms for r in done if r.ttft_ms is not None)
    e2el = distribution(r.e2el_ms for r in done if r.e2el_ms is not None)
    metric_hits = [run["metrics_delta"] for run in runs if run["metrics_delta"]]
    return {
        "requests": len(records),
        "failed": len(records) - len(done),
        "token_hit_rate": sums["hit_tokens"] / sums["input_tokens"] if sums else None,
        "request_hit_rate": sums["hit_requests"] / sums["requests"] if sums else None,
        "flops_saved_fraction": sums["flops_saved"] / sums["flops_total"] if sums else None,
        "metrics_token_hit_rate": (
            sum(m["hit_tokens"] for m in metric_hits) / sum(m["input_tokens"] for m in metric_hits)
            if metric_hits and sum(m["input_tokens"] for m in metric_hits) > 0
            else None
        ),
        "client_token_hit_rate": (
            sum(r.cached_tokens for r in done) / sum(r.prompt_tokens for r in done)
            if done
            else None
        ),
        "resumed_turns": resumed,
        "later_turns": later,
        "resumed_fraction": resumed / later if later else None,
        "requests_per_replica": per_replica,
        "evictions": sums.get("evictions", 0.0),
        "ttft_ms": ttft,
        "e2el_ms": e2el,
        "load_wall_s": sum(run["wall_s"] for run in runs),
        "deploy_s": [run["deploy_s"] for run in runs],
    }


RATIO_KEYS = (
    ("token_hit_rate", "token hit rate"),
    ("ttft_mean", "mean TTFT"),
    ("ttft_p95", "P95 TTFT"),
)


def _value(row: dict[str, Any], key: str) -> float | None:
    if key.startswith("ttft_"):
        v = row["ttft_ms"][key.removeprefix("ttft_")]
        return None if v is None else float(v)
    v = row[key]
    return None if v is None else float(v)


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """{strategy: {figure: strategy / cache_aware}} for every strategy but the baseline."""
    out: dict[str, dict[str, float | None]] = {}
    if BASELINE not in rows:
        return out
    base = rows[BASELINE]
    for name, row in rows.items():
        if name == BASELINE:
            continue
        out[name] = {}
        for key, _ in RATIO_KEYS:
            a, b = _value(row, key), _value(base, key)
            out[name][key] = a / b if a is not None and b else None
    return out


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def markdown(rows: dict[str, dict[str, Any]], rel: dict[str, dict[str, float | None]]) -> str:
    head = (
        "| routing | requests | token hit rate | request hit rate | resumed turns | "
        "requests per replica | mean TTFT ms | P50 TTFT ms | P95 TTFT ms | mean E2E ms | "
        "failed |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for name, r in rows.items():
        split = "/".join(str(int(v)) for v in r["requests_per_replica"].values())
        lines.append(
            f"| {name} | {r['requests']} | {_f(r['token_hit_rate'], '.4f')} | "
            f"{_f(r['request_hit_rate'], '.3f')} | {r['resumed_turns']}/{r['later_turns']} | "
            f"{split} | {_f(r['ttft_ms']['mean'], '.0f')} | {_f(r['ttft_ms']['p50'], '.0f')} | "
            f"{_f(r['ttft_ms']['p95'], '.0f')} | {_f(r['e2el_ms']['mean'], '.0f')} | "
            f"{r['failed']} |"
        )
    for name, figures in rel.items():
        cells = ", ".join(f"{label} {_f(figures[key], '.2f')}x" for key, label in RATIO_KEYS)
        lines.append(f"\n{name} / {BASELINE}: {cells}")
    return "\n".join(lines)


def plot(rows: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    fig = Figure(figsize=(9, 3.6))
    FigureCanvasAgg(fig)
    names = list(rows)
    panels = (
        ("token_hit_rate", "token hit rate (server)", ".3f"),
        ("ttft_mean", "mean TTFT (ms)", ".0f"),
        ("ttft_p95", "P95 TTFT (ms)", ".0f"),
    )
    colors = [f"C{i}" for i in range(len(names))]
    for k, (key, label, fmt) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        vals = [_value(rows[n], key) or 0.0 for n in names]
        bars = ax.bar(names, vals, color=colors)
        for b, v in zip(bars, vals, strict=True):
            ax.annotate(
                format(v, fmt),
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_title(label, fontsize=9)
        ax.margins(y=0.15)
        ax.grid(True, axis="y", alpha=0.3)
        ax.tick_params(axis="x", labelsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------- driver
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    a = p.add_argument
    a("--out", default="benchmarks/results/routing", help="output folder [%(default)s]")
    a(
        "--strategies",
        default="cache_aware,round_robin",
        help=f"comma-separated routing strategies, run in this order; one of "
        f"{sorted(ROUTERS)} each [%(default)s]",
    )
    a(
        "--model",
        default="small",
        help="model folder or preset (tiny, small, tiny:bamba), built on first use; the "
        "small preset makes prefill, hence cache hits, dominate TTFT [%(default)s]",
    )
    a("--replicas", type=int, default=2, help="model replicas per deployment [%(default)s]")
    a("--system", default="marconi", help="caching system of the replicas [%(default)s]")
    a(
        "--cache-bytes",
        type=lambda s: round(float(s)),
        default=10**9,
        help="prefix-cache budget per replica in bytes [%(default)s]",
    )
    a("--max-batch", type=int, default=8, help="most requests a replica decodes together [8]")
    a(
        "--route-load-weight",
        type=float,
        default=256.0,
        help="cache_aware: an open request is charged the prefill FLOPs of this many tokens "
        "[%(default)s]",
    )
    a(
        "--route-max-imbalance",
        type=int,
        default=4,
        help="cache_aware: most open requests a replica may have above the least loaded one "
        "[%(default)s]",
    )
    a(
        "--trace",
        default="auto",
        help="sessions to replay: auto (ShareGPT from the shared data folder, else the "
        "packaged sample), sharegpt, sample, swebench or a JSONL file [%(default)s]",
    )
    a("--sessions", type=int, default=12, help="sessions replayed (the trace's first N) [12]")
    a("--concurrency", type=int, default=4, help="fixed concurrent users [%(default)s]")
    a("--max-output", type=int, default=16, help="tokens decoded per turn, at most [16]")
    a(
        "--max-prompt",
        type=int,
        default=1024,
        help="a session ends at its first prompt longer than this many tokens [%(default)s]",
    )
    a("--rounds", type=int, default=1, help="runs per strategy, order alternating [1]")
    a("--port", type=int, default=8141, help="HTTP port of the service (127.0.0.1) [8141]")
    a("--ray-cpus", type=int, default=8, help="logical CPUs of the local Ray [%(default)s]")
    a("--seed", type=int, default=0, help="seed of the warm-up prompts [%(default)s]")
    a("--no-progress", action="store_true", help="no progress bars")
    args = p.parse_args(argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in args.strategies if s not in ROUTERS]
    if bad or not args.strategies:
        p.error(f"unknown routing strategy {bad or args.strategies}; choose from {sorted(ROUTERS)}")
    for name in ("replicas", "sessions", "concurrency", "max_output", "rounds", "max_batch"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not 1 <= args.port <= 65535:
        p.error(f"--port must be in 1..65535, got {args.port}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from marconi_ray.serve.model_source import resolve_model

    start = time.perf_counter()
    model_dir = resolve_model(args.model)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    trace, note = pick_trace(args.trace)
    if note:
        print(f"[bench_routing] {note}", file=sys.stderr)
    load = LoadConfig(
        url=f"http://127.0.0.1:{args.port}",
        trace=trace,
        sessions=args.sessions,
        session_rate=None,
        concurrency=args.concurrency,
        think="fixed:0",
        history="live",
        prompt_mode="tokens",
        vocab_size=vocab,
        max_output=args.max_output,
        max_prompt=args.max_prompt,
        seed=args.seed,
    )
    order = [
        (rnd, s)
        for rnd in range(args.rounds)
        for s in (args.strategies if rnd % 2 == 0 else args.strategies[::-1])
    ]
    runs: dict[str, list[dict[str, Any]]] = {s: [] for s in args.strategies}
    start_ray(args, settings_for(args, model_dir, args.strategies[0]))
    try:
        for rnd, strategy in tqdm(order, desc="deployments", disable=args.no_progress or None):
            t0 = time.perf_counter()
            print(f"\n[bench_routing] round {rnd + 1}: {strategy}", file=sys.stderr)
            runs[strategy].append(run_strategy(args, model_dir, strategy, load, vocab))
            print(f"[bench_routing] {strategy}: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    finally:
        stop_ray()
    rows = {s: strategy_row(r) for s, r in runs.items()}
    rel = ratios(rows)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "no_progress")},
            "model_dir": str(model_dir),
            "trace_used": trace,
            "trace_note": note,
            "load": asdict(load),
        },
        "strategies": rows,
        "ratios_over_cache_aware": rel,
        "per_round": {
            s: [{k: v for k, v in run.items() if k != "records"} for run in r]
            for s, r in runs.items()
        },
        "wall_s": time.perf_counter() - start,
    }
    (out / "bench_routing.json").write_text(json.dumps(doc, indent=2, default=float) + "\n")
    table = markdown(rows, rel)
    shape = (
        f"{args.replicas} replicas of {model_dir.name} (CPU), {trace} x {args.sessions} "
        f"sessions, {args.concurrency} users, <= {args.max_output} tokens/turn, "
        f"{args.rounds} round(s)"
    )
    (out / "bench_routing.md").write_text(f"{shape}\n\n{table}\n")
    plot(rows, out / "routing.png", f"Routing across replicas: {shape}")
    print(f"\n{shape}\n{table}")
    written = ", ".join(str(out / f) for f in ("bench_routing.json", "bench_routing.md"))
    print(f"\nwall time {doc['wall_s']:.0f} s; wrote {written}, {out / 'routing.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
