"""What splitting the replicas among K coordinators costs the cache, replayed on real traces
(issue "The coordinator at cluster rates", item 4), side by side in one run.

The real coordinator (`CacheCoordinator`, in process, no Ray) plans and commits every
request of a trace; the worker's part is `bench_serve.FakeWorker` (the `Finished` a worker
would report, the trace's own output tokens). With K coordinators the `--replicas`
replicas are split round-robin into K groups, each coordinator owning one group's trees,
and each request goes to the coordinator its group key picks: a hash of the prompt's
first `--key-tokens` tokens (all of a shorter prompt): requests that share a leading
block of that length meet the same coordinator, and so do a session's turns once its
history is that long (a first turn shorter than the key hashes apart from the next:
the longer the key, the more sessions split).
No routing summary across the groups: a prefix cached behind another coordinator is
missed, so the difference to K = 1 is what such a summary could win back. Requests run
in trace order `--concurrency` at a time (planned together, then committed together;
a window never holds two turns of one session, whose next turn starts after the last
ends), so the routers' load balance sees open requests as a serving fleet's does; the
group key's load-aware spill is not modelled.

Reported per trace and K: the token hit rate (cached prompt tokens / prompt tokens), the
share of requests each coordinator planned (the busiest's is the figure the issue bounds
at 60% for K = 2), and the hit rate's difference to K = 1 in points. Per-replica cache
budgets are `--cache-fraction` of the trace's prompt tokens' KV bytes spread over the
replicas, so the caches evict as a busy fleet's do; eviction's alpha stays at 0 (the
tuner's start value: the tuner actor is not part of an in-process coordinator).

Writes OUT/bench_coordinator_groups.json and .md. Needs the shared data folder
(../shared/data or $MARCONI_DATA_DIR) for ShareGPT, SWE-bench and Mooncake.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from bench_serve import FakeWorker
from cluster_load import KV_BYTES, STATE_BYTES, group_of, replica_ids, settings_for
from tqdm import tqdm

from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.traces.registry import load_trace
from marconi_ray.traces.trace import Trace

ID_OFFSET = 7  # first id past the tiny model's special tokens


def mapped(ids: np.ndarray, vocab: int) -> np.ndarray:
    """Trace ids into the tiny model's vocabulary (deterministic: shared prefixes stay)."""
    return (ids.astype(np.int64) % (vocab - ID_OFFSET - 1) + ID_OFFSET).astype(np.int32)


def windows(trace: Trace, size: int) -> list[list[int]]:
    """The trace's request indices in order, cut into windows of at most `size` that never
    hold two requests of one session."""
    out: list[list[int]] = [[]]
    sessions: set[int] = set()
    for i, r in enumerate(trace.requests):
        if len(out[-1]) == size or r.session_id in sessions:
            out.append([])
            sessions = set()
        out[-1].append(i)
        sessions.add(r.session_id)
    return [w for w in out if w]


def replay(
    trace: Trace, k: int, key: int, args: argparse.Namespace, model_dir: Path, vocab: int
) -> dict[str, Any]:
    """Serve `trace` with the replicas split among `k` coordinators, the group key
    hashing `key` tokens (module docstring)."""
    prompts = [mapped(r.input_tokens, vocab) for r in trace.requests]
    total_tokens = sum(len(p) for p in prompts)
    budget = int(args.cache_fraction * total_tokens * KV_BYTES / args.replicas)
    settings = replace(
        settings_for(model_dir), cache_bytes=max(budget, 4 * STATE_BYTES), alpha=0.0
    )  # alpha fixed at the tuner's start value: no tuner actor in process
    coords = [CacheCoordinator(settings) for _ in range(k)]
    for i, rid in enumerate(replica_ids(args.replicas)):
        coords[i % k].register_replica(rid, KV_BYTES, STATE_BYTES)
    worker = FakeWorker()
    hits = planned = 0
    per_group = [0] * k
    rows = list(zip(trace.requests, prompts, strict=True))
    for window in tqdm(windows(trace, args.concurrency), desc=f"{trace.name} K={k}", leave=False):
        open_ = []
        for i in window:
            req, prompt = rows[i]
            g = group_of(prompt, k, key)
            output = mapped(req.output_tokens, vocab)
            params = SamplingParams(
                max_tokens=max(1, len(output)), temperature=0.0, ignore_eos=True
            )
            open_.append((coords[g], coords[g].plan(prompt, params), output))
            per_group[g] += 1
            planned += len(prompt)
        for coord, d, output in open_:
            coord.commit(d.replica_id, worker.finish(d.order, output), d.needs)
            hits += d.order.hit_len
    n = len(prompts)
    return {
        "coordinators": k,
        "key_tokens": key if k > 1 else None,
        "requests": n,
        "prompt_tokens": planned,
        "token_hit_rate": hits / planned,
        "share_per_coordinator": [c / n for c in per_group],
        "busiest_share": max(per_group) / n,
        "cache_bytes_per_replica": settings.cache_bytes,
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        "| trace | K | group key (tokens) | requests | token hit rate | vs K = 1 (points) "
        "| busiest coordinator |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in report["traces"].items():
        base = runs[0]["token_hit_rate"]
        for r in runs:
            diff = 100 * (r["token_hit_rate"] - base)
            key = "-" if r["key_tokens"] is None else str(r["key_tokens"])
            lines.append(
                f"| {name} | {r['coordinators']} | {key} | {r['requests']:,} | "
                f"{r['token_hit_rate']:.2%} | {diff:+.2f} | {r['busiest_share']:.0%} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default="sharegpt,swebench,mooncake", help="traces to replay")
    p.add_argument("--coordinators", default="1,2", help="group counts K, the first the base")
    p.add_argument("--replicas", type=int, default=8, help="replicas split among the groups")
    p.add_argument("--sessions", type=int, default=None, help="sessions per trace (default: all)")
    p.add_argument(
        "--key-tokens",
        default="64,256,1024",
        help="prompt tokens the group key hashes (comma-separated: each K > 1 runs with each)",
    )
    p.add_argument(
        "--concurrency", type=int, default=32, help="requests open at once (planned together)"
    )
    p.add_argument(
        "--cache-fraction",
        type=float,
        default=0.1,
        help="all replicas' cache, as a fraction of the trace's prompt tokens' KV bytes",
    )
    p.add_argument("--out", default="benchmarks/results/coordinator_groups", help="output folder")
    args = p.parse_args(argv)
    try:
        args.groups = [int(k) for k in args.coordinators.split(",")]
        args.keys = [int(k) for k in args.key_tokens.split(",")]
    except ValueError:
        p.error(f"--coordinators, --key-tokens: comma-separated integers, got "
                f"{args.coordinators!r}, {args.key_tokens!r}")  # fmt: skip
    if not args.keys or min(args.keys) < 1:
        p.error(f"--key-tokens: counts >= 1, got {args.keys}")
    if not args.groups or min(args.groups) < 1 or max(args.groups) > args.replicas:
        p.error(f"--coordinators: counts in [1, --replicas = {args.replicas}], got {args.groups}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from marconi_ray.engine.presets.factory import make_model

    start = time.perf_counter()
    report: dict[str, Any] = {"config": {k: v for k, v in vars(args).items()}, "traces": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model("tiny", "nemotron_h", Path(tmp) / "tiny")  # its config only
        vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
        for name in args.traces.split(","):
            trace = load_trace(name, n_sessions=args.sessions)
            report["traces"][name] = [
                replay(trace, k, key, args, model_dir, vocab)
                for k in args.groups
                for key in (args.keys if k > 1 else args.keys[:1])
            ]
    report["wall_s"] = time.perf_counter() - start
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_coordinator_groups.json").write_text(json.dumps(report, indent=2) + "\n")
    text = table(report)
    (out / "bench_coordinator_groups.md").write_text(text + "\n")
    print(f"\n{text}\nwall time {report['wall_s']:.0f} s")
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
