"""What splitting the replicas among K coordinators costs the cache, replayed on real traces
(issue "The coordinator at cluster rates", item 4), side by side in one run.

The real coordinator (`CacheCoordinator`, in process, no Ray) plans and commits every
request of a trace; the worker's part is `bench_serve.FakeWorker` (the `Finished` a worker
would report, the trace's own output tokens). With K coordinators the `--replicas`
replicas are split round-robin into K groups, each coordinator owning one group's trees,
and each request goes to the coordinator its group key picks: a hash of the prompt's
first `--key-tokens` tokens (a session's turns share them, so a session stays with one
coordinator, and requests that share a leading block of that length meet the same one).
No routing summary across the groups: a prefix cached behind another coordinator is
missed, so the difference to K = 1 is what such a summary could win back. Requests run
one at a time in trace order, so the group key's load-aware spill never triggers and is
not modelled.

Reported per trace and K: the token hit rate (cached prompt tokens / prompt tokens), the
share of requests each coordinator planned (the busiest's is the figure the issue bounds
at 60% for K = 2), and the hit rate's difference to K = 1 in points. Per-replica cache
budgets are `--cache-fraction` of the trace's prompt tokens' KV bytes spread over the
replicas, so the caches evict as a busy fleet's do.

Writes OUT/bench_coordinator_groups.json and .md. Needs the shared data folder
(../shared/data or $MARCONI_DATA_DIR) for ShareGPT, SWE-bench and Mooncake.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from bench_serve import FakeWorker
from cluster_load import KV_BYTES, STATE_BYTES, replica_ids, settings_for
from tqdm import tqdm

from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.coordinator.actor import CacheCoordinator
from marconi_ray.traces.registry import load_trace
from marconi_ray.traces.trace import Trace

ID_OFFSET = 7  # first id past the tiny model's special tokens


def group_of(prompt: np.ndarray, groups: int, key_tokens: int) -> int:
    """The coordinator group of a prompt: a stable hash of its first `key_tokens` tokens
    (all of a shorter prompt) modulo `groups`."""
    head = np.ascontiguousarray(prompt[:key_tokens], dtype=np.int32).tobytes()
    return int.from_bytes(hashlib.blake2b(head, digest_size=8).digest(), "little") % groups


def mapped(ids: np.ndarray, vocab: int) -> np.ndarray:
    """Trace ids into the tiny model's vocabulary (deterministic: shared prefixes stay)."""
    return (ids.astype(np.int64) % (vocab - ID_OFFSET - 1) + ID_OFFSET).astype(np.int32)


def replay(
    trace: Trace, k: int, args: argparse.Namespace, model_dir: Path, vocab: int
) -> dict[str, Any]:
    """Serve `trace` with the replicas split among `k` coordinators (module docstring)."""
    prompts = [mapped(r.input_tokens, vocab) for r in trace.requests]
    total_tokens = sum(len(p) for p in prompts)
    budget = int(args.cache_fraction * total_tokens * KV_BYTES / args.replicas)
    settings = replace(settings_for(model_dir), cache_bytes=max(budget, 4 * STATE_BYTES))
    coords = [CacheCoordinator(settings) for _ in range(k)]
    for i, rid in enumerate(replica_ids(args.replicas)):
        coords[i % k].register_replica(rid, KV_BYTES, STATE_BYTES)
    worker = FakeWorker()
    hits = planned = 0
    per_group = [0] * k
    for req, prompt in tqdm(
        list(zip(trace.requests, prompts, strict=True)), desc=f"{trace.name} K={k}", leave=False
    ):
        g = group_of(prompt, k, args.key_tokens)
        coord = coords[g]
        output = mapped(req.output_tokens, vocab)
        params = SamplingParams(max_tokens=max(1, len(output)), temperature=0.0, ignore_eos=True)
        d = coord.plan(prompt, params)
        coord.commit(d.replica_id, worker.finish(d.order, output), d.needs)
        hits += d.order.hit_len
        planned += len(prompt)
        per_group[g] += 1
    n = len(prompts)
    return {
        "coordinators": k,
        "requests": n,
        "prompt_tokens": planned,
        "token_hit_rate": hits / planned,
        "share_per_coordinator": [c / n for c in per_group],
        "busiest_share": max(per_group) / n,
        "cache_bytes_per_replica": settings.cache_bytes,
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        "| trace | K | requests | token hit rate | vs K = 1 (points) | busiest coordinator |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for name, runs in report["traces"].items():
        base = runs[0]["token_hit_rate"]
        for r in runs:
            diff = 100 * (r["token_hit_rate"] - base)
            lines.append(
                f"| {name} | {r['coordinators']} | {r['requests']:,} | "
                f"{r['token_hit_rate']:.2%} | {diff:+.2f} | {r['busiest_share']:.0%} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default="sharegpt,swebench,mooncake", help="traces to replay")
    p.add_argument("--coordinators", default="1,2", help="group counts K, the first the base")
    p.add_argument("--replicas", type=int, default=8, help="replicas split among the groups")
    p.add_argument("--sessions", type=int, default=None, help="sessions per trace (default: all)")
    p.add_argument("--key-tokens", type=int, default=64, help="prompt tokens the group key hashes")
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
    except ValueError:
        p.error(f"--coordinators: comma-separated integers, got {args.coordinators!r}")
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
            report["traces"][name] = [replay(trace, k, args, model_dir, vocab) for k in args.groups]
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
