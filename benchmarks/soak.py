"""Soak of the served system (issue: "at least 32 concurrent sessions for a bounded time
on loopback, zero errors, capacity never exceeded, all locks released at the end").

A local Ray runs the real service (coordinator, tuner, `--replicas` model replicas of a
`make_model` preset, the OpenAI ingress) on 127.0.0.1:`--port`. The load generator runs
`--sessions` users at once, each working through multi-turn ShareGPT sessions (tokens
mode, greedy, `ignore_eos`, zero think time; every turn's prompt extends the previous
turn's with the model's actual reply) until `--duration` seconds have passed; requests in
flight then finish. Meanwhile a watcher polls the coordinator every `--poll-ms` and checks
`bytes_used + reserved <= capacity` on every replica. After the load: nothing may be in
flight, reserved or locked, the coordinator's full tree check must pass, and each
replica's store must hold exactly the bytes its coordinator cache accounts for.

Prints requests, errors, peak bytes against the capacity, evictions, TTFT P50/P95 and
the end-state checks; writes `OUT/soak.json` (everything measured) and `OUT/soak.md`.
Exits 1 when any check fails. The test `tests/serve/test_soak.py` is a short run of the
same code (`tests/serve/serve_helpers.py:run_soak`).

The sessions come from the shared ShareGPT data (../shared/data or $MARCONI_DATA_DIR);
without it, from the packaged 20-session sample replicated with shifted token ids.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: one thread per process
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "serve"))  # the soak's code, shared with its test

from serve_helpers import SoakConfig, SoakReport, local_ray, run_soak  # noqa: E402

from marconi_ray.engine.presets.factory import make_model  # noqa: E402
from marconi_ray.engine.presets.model_presets import FAMILIES, PRESETS  # noqa: E402


def checks(report: SoakReport, cfg: SoakConfig) -> dict[str, bool]:
    """The soak's pass/fail checks, by name."""
    reps = report.replicas
    return {
        "zero errors": report.errors == {} and report.completed == report.requests,
        "every request complete": report.incomplete == 0,
        f">= {cfg.sessions} requests open at once": report.max_concurrent_requests >= cfg.sessions,
        "watcher polled throughout": report.watcher_error is None and report.polls > 0,
        "capacity never exceeded (polled)": not report.violations,
        "cache peak <= capacity": all(r.peak_bytes <= r.capacity for r in reps),
        "all replicas registered": len(reps) == cfg.replicas,
        "nothing in flight at the end": all(r.in_flight == 0 for r in reps),
        "nothing reserved at the end": all(r.reserved == 0 for r in reps),
        "no lock held at the end": all(r.locked_nodes == 0 for r in reps),
        "tree invariants hold": report.invariant_nodes > 0,
        "store bytes == coordinator bytes": all(r.store_bytes == r.bytes_used for r in reps),
    }


def _ms(d: dict[str, float | None], key: str) -> str:
    v = d.get(key)
    return "-" if v is None else f"{v:.1f}"


def _kinds(errors: dict[str, int]) -> str:
    return f" {errors}" if errors else ""


def markdown(report: SoakReport, results: dict[str, bool], preset: str) -> str:
    """`soak.md`: the figures, the per-replica table and the checks."""
    cfg = report.config
    lines = [
        "# Soak",
        "",
        f"{cfg['sessions']} concurrent sessions for {cfg['duration_s']:.0f} s on loopback, "
        f"{cfg['replicas']} replica(s) x tp {cfg['tp']} of the `{preset}` preset "
        f"({cfg['system']}), cache {cfg['cache_bytes']:,} B per replica, max_tokens "
        f"{cfg['max_tokens']}, max_prompt {cfg['max_prompt']}, trace `{Path(report.trace).name}`.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| requests | {report.requests} |",
        f"| errors | {report.requests - report.completed}{_kinds(report.errors)} |",
        f"| incomplete | {report.incomplete} |",
        f"| sessions started | {report.sessions_started} |",
        f"| most requests open at once (client) | {report.max_concurrent_requests} |",
        f"| most requests in flight (coordinator) | {report.peak_in_flight} |",
        f"| load wall time | {report.load_wall_s:.1f} s |",
        f"| request throughput | {report.request_throughput:.2f} req/s |",
        f"| TTFT P50 / P95 | {_ms(report.ttft_ms, 'p50')} / {_ms(report.ttft_ms, 'p95')} ms |",
        f"| E2E P50 / P95 | {_ms(report.e2el_ms, 'p50')} / {_ms(report.e2el_ms, 'p95')} ms |",
        f"| token hit rate (client) | {report.client_token_hit_rate or 0:.3f} |",
        f"| peak bytes+reserved (polled) | {report.peak_seen:,} / {report.capacity:,} B "
        f"({report.peak_seen / report.capacity:.4f}) |",
        f"| cache peak_bytes | {report.peak_bytes:,} B "
        f"({report.peak_bytes / report.capacity:.4f}) |",
        f"| evictions | {report.evictions} |",
        f"| watcher polls / violations | {report.polls} / {len(report.violations)} |",
        f"| tree nodes checked at the end | {report.invariant_nodes} |",
        f"| settle time after the load | {report.settle_s:.2f} s |",
        "",
        "| replica | requests | evictions | peak polled | peak_bytes | bytes at end | store "
        "bytes | in flight | reserved | locked |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.replicas:
        lines.append(
            f"| {r.replica_id} | {r.requests} | {r.evictions} | {r.peak_seen:,} | "
            f"{r.peak_bytes:,} | {r.bytes_used:,} | "
            f"{'-' if r.store_bytes is None else f'{r.store_bytes:,}'} | {r.in_flight} | "
            f"{r.reserved} | {r.locked_nodes} |"
        )
    if report.peak_in_flight < cfg["sessions"]:
        lines += [
            "",
            f"At most {report.peak_in_flight} requests were in flight at the coordinator at "
            f"once (polled every {cfg['poll_s'] * 1e3:.0f} ms) while {cfg['sessions']} were "
            "open at the client: the others waited in front of the OpenAI ingress (Serve "
            "caps a deployment replica's concurrent requests at its `max_ongoing_requests`, "
            "5 by default), which is most of the TTFT above.",
        ]
    lines += ["", "| check | result |", "|---|---|"]
    lines += [f"| {name} | {'pass' if ok else '**FAIL**'} |" for name, ok in results.items()]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("load")
    g.add_argument(
        "--sessions",
        type=int,
        default=32,
        help="concurrent users; each runs multi-turn sessions back to back",
    )
    g.add_argument(
        "--duration",
        type=float,
        default=120.0,
        help="seconds during which requests start (requests in flight then finish)",
    )
    g.add_argument(
        "--pool",
        type=int,
        default=None,
        help="sessions the users draw from (None: 8 x --sessions)",
    )
    g.add_argument(
        "--max-tokens", type=int, default=4, help="most tokens decoded per turn (greedy)"
    )
    g.add_argument(
        "--max-prompt",
        type=int,
        default=1024,
        help="a session ends at its first turn with a longer prompt (tokens)",
    )
    g.add_argument(
        "--trace",
        default=None,
        help="trace spec for the load generator (sharegpt, sample, a JSONL file); default: "
        "sharegpt when the shared data has it, else the replicated packaged sample",
    )
    g.add_argument(
        "--request-timeout", type=float, default=120.0, help="per-request client timeout (s)"
    )
    g = p.add_argument_group("service")
    g.add_argument("--replicas", type=int, default=2, help="model replicas")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel shards per replica")
    g.add_argument(
        "--cache-bytes",
        type=int,
        default=2_000_000,
        help="prefix-cache budget per replica (KV + SSM bytes); with the tiny preset "
        "(512 B of KV per token) this holds a few of the 32 sessions: it evicts all the time",
    )
    g.add_argument(
        "--system",
        default="marconi",
        choices=("marconi", "sglang+", "vllm+", "vanilla"),
        help="caching system",
    )
    g.add_argument("--max-batch", type=int, default=8, help="most requests a replica decodes")
    g.add_argument(
        "--preset",
        default="tiny",
        choices=sorted(k for k, v in PRESETS.items() if not v.large),
        help="make_model preset",
    )
    g.add_argument("--family", default="nemotron_h", choices=list(FAMILIES), help="model family")
    g.add_argument(
        "--model-dir",
        default=None,
        help="an existing model folder instead of building --preset/--family (its name is "
        "then the folder's)",
    )
    g.add_argument("--port", type=int, default=8150, help="HTTP port on 127.0.0.1")
    g.add_argument(
        "--app-name", default="soak", help="Serve application name (names the actors too)"
    )
    g.add_argument("--ray-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    g = p.add_argument_group("watch and output")
    g.add_argument("--poll-ms", type=float, default=50.0, help="capacity watcher interval (ms)")
    g.add_argument(
        "--out", default=str(ROOT / "benchmarks" / "results" / "soak"), help="output folder"
    )
    g.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    args = p.parse_args(argv)
    for name in ("sessions", "replicas", "tp", "cache_bytes", "max_tokens", "max_prompt"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.duration <= 0 or args.poll_ms <= 0:
        p.error("--duration and --poll-ms must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        if args.model_dir is not None:
            model_dir, name = Path(args.model_dir), Path(args.model_dir).name
        else:
            model_dir = make_model(args.preset, args.family, Path(tmp) / args.preset)
            name = args.preset
        cfg = SoakConfig(
            model_dir=str(model_dir),
            model_name=name,
            sessions=args.sessions,
            duration_s=args.duration,
            pool=args.pool if args.pool is not None else 8 * args.sessions,
            replicas=args.replicas,
            tp=args.tp,
            cache_bytes=args.cache_bytes,
            system=args.system,
            max_batch=args.max_batch,
            max_tokens=args.max_tokens,
            max_prompt=args.max_prompt,
            port=args.port,
            app_name=args.app_name,
            poll_s=args.poll_ms / 1e3,
            trace=args.trace,
            request_timeout_s=args.request_timeout,
        )
        t0 = time.monotonic()
        with local_ray(num_cpus=args.ray_cpus):
            report = run_soak(cfg, Path(tmp), progress=not args.no_progress)
        total_s = time.monotonic() - t0
    results = checks(report, cfg)
    doc: dict[str, Any] = report.to_dict()
    doc.update(
        preset=args.preset if args.model_dir is None else None,
        family=args.family if args.model_dir is None else None,
        total_s=total_s,
        checks=results,
        passed=all(results.values()),
    )
    (out / "soak.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    (out / "soak.md").write_text(markdown(report, results, name))
    ratio = report.peak_seen / report.capacity
    print(
        f"requests {report.requests}, errors {report.requests - report.completed}"
        f"{_kinds(report.errors)}, incomplete {report.incomplete}\n"
        f"sessions started {report.sessions_started}, most requests open at once "
        f"{report.max_concurrent_requests} (client) / {report.peak_in_flight} (coordinator)\n"
        f"peak bytes+reserved {report.peak_seen:,} / capacity {report.capacity:,} B "
        f"(ratio {ratio:.4f}); cache peak_bytes {report.peak_bytes:,} B; "
        f"{len(report.violations)} violations in {report.polls} polls\n"
        f"evictions {report.evictions}, token hit rate "
        f"{report.client_token_hit_rate or 0:.3f}\n"
        f"TTFT P50 {_ms(report.ttft_ms, 'p50')} ms, P95 {_ms(report.ttft_ms, 'p95')} ms; "
        f"{report.request_throughput:.2f} req/s over {report.load_wall_s:.1f} s\n"
        f"end: in flight {[r.in_flight for r in report.replicas]}, reserved "
        f"{[r.reserved for r in report.replicas]}, locked "
        f"{[r.locked_nodes for r in report.replicas]}, tree nodes checked "
        f"{report.invariant_nodes}, store == coordinator bytes "
        f"{all(r.store_bytes == r.bytes_used for r in report.replicas)}"
    )
    failed = [name for name, ok in results.items() if not ok]
    print("PASS" if not failed else f"FAIL: {', '.join(failed)}")
    print(f"wrote {out / 'soak.json'} and {out / 'soak.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
