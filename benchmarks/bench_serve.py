"""Benchmark of the Ray Serve layer on CPU (issue "Serving on Ray"), all measured in one run.

1. `overhead`: the coordinator's per-request work next to the engine's prefill. A prefix
   cache (`engine.Planner`, what `CacheCoordinator` holds per replica) with the `small`
   NemotronH preset's cost model is filled with >= 10,000 tree nodes (a few hundred
   documents with many distinct continuations each, plus a few long multi-turn chains),
   then 20,000-token prompts that share a long prefix of a chain (cut at a random depth,
   so most of them split an edge) are planned and committed (`Planner.order` +
   `Planner.commit` with a worker-shaped `Finished`): p50/p99 in-process, with the cache
   big enough for everything (`fit`) and sized to the fill plus 4 states (`full`: the
   fill just fits, every timed request evicts).
   The same through a real `CacheCoordinator` Ray actor (`plan.remote` + `commit.remote`
   round trips, routing included). Next to it: `HybridModel.prefill` of one 20,000-token
   prompt on the same model, one thread (a copy of the model folder whose config allows
   32k positions; same weights, NemotronH attention has no RoPE).
2. `tuner`: one bootstrap `TuneJob` (21 alphas, 1,000-request window of the ShareGPT
   trace after the first eviction at 2e9 bytes, paper-7b cost, marconi) through the real
   tuner actor with 1 and 2 Ray workers, and serially in-process (`run_grid`), reps
   interleaved; wall times, speed-up and the chosen alpha of each.
3. `throughput`: generated tokens/s of one Serve model replica (tp=1, marconi,
   max_batch=16, the `small` preset) at 1, 4 and 16 concurrent requests (64-token random
   prompts, 64 tokens each, greedy, ignore_eos), streamed as the runtime tests do
   (`coordinator.plan.remote` + `handle.options(stream=True).generate.remote`); next to
   it the in-process `Engine.generate_many` on the same model and thread count.

Writes `OUT/bench_serve.json` and `OUT/throughput_vs_concurrency.png`; prints a summary.
The tuner part needs the shared data folder (../shared/data or $MARCONI_DATA_DIR); without
it, it falls back to the packaged ShareGPT sample, replicated with shifted token ids.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_core import tuner_job  # the same window construction as the core benchmark
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from marconi_ray.core.cache.tuner import run_grid
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.presets import get_preset
from marconi_ray.engine.engine import Engine, build_planner
from marconi_ray.engine.model.loader import load_model, read_config
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.worker import Worker
from marconi_ray.protocol.orders import Finished, PrefillOrder
from marconi_ray.protocol.planner import Planner
from marconi_ray.protocol.results import Timings
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.traces.registry import load_trace
from marconi_ray.traces.trace import Request

PARTS = ("overhead", "tuner", "throughput")
ID_LO, ID_HI = 7, 500  # token ids inside the byte tokenizer's real range (vocab 512)
LONG_POSITIONS = 32768
REPLICA = "bench-replica"


# ---------------------------------------------------------------------- helpers
def pct(values: list[float]) -> dict[str, float]:
    """n, mean, p50, p99 and max of durations in seconds, reported in ms."""
    arr = 1e3 * np.asarray(values)
    return {
        "n": len(arr),
        "mean_ms": float(arr.mean()),
        "p50_ms": float(np.percentile(arr, 50)),
        "p99_ms": float(np.percentile(arr, 99)),
        "max_ms": float(arr.max()),
    }


def ensure_small(model_dir: Path) -> Path:
    """The `small` NemotronH checkpoint in `model_dir`, built (seed 0) if absent."""
    if not (model_dir / "config.json").is_file():
        make_model("small", "nemotron_h", model_dir)
    return model_dir


def long_context_copy(src: Path, dst: Path, positions: int = LONG_POSITIONS) -> Path:
    """`src` with `max_position_embeddings` raised in config.json; other files symlinked."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name == "config.json":
            cfg = json.loads(f.read_text())
            cfg["max_position_embeddings"] = positions
            (dst / f.name).write_text(json.dumps(cfg, indent=2))
        elif not (dst / f.name).exists():
            os.symlink(f.resolve(), dst / f.name)
    return dst


def rand_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(ID_LO, ID_HI, n).astype(np.int32)


# ---------------------------------------------------------------------- 1. overhead
class FakeWorker:
    """Builds the `Finished` a worker would report for an order: a state id for every
    prefill checkpoint and (with `keep_final`) the final depth, and KV slots for
    positions [hit_len, deepest state) (fresh ids, never reused)."""

    def __init__(self) -> None:
        self.next_state = 0
        self.next_slot = 0

    def finish(self, order: PrefillOrder, output: np.ndarray) -> Finished:
        n, h = len(order.prompt), order.hit_len
        total = n + len(output)
        depths = [d for d in order.checkpoints if h < d <= n]
        depths += [d for d in order.capture if n < d <= total]
        if order.keep_final:
            depths.append(total)
        state_ids = {}
        for d in depths:
            state_ids[d] = self.next_state
            self.next_state += 1
        deepest = max(state_ids, default=h)
        count = max(0, deepest - h)
        slots = np.arange(self.next_slot, self.next_slot + count, dtype=np.int64)
        self.next_slot += count
        return Finished(
            order.request_id,
            tuple(int(t) for t in output),
            "length",
            state_ids,
            slots,
            Timings(0.0, 0.0, 0.0, 0.0),
        )


class Workload:
    """Synthetic sequences: documents x continuations, multi-turn chains, and timed
    prompts that share a random-length prefix of a chain (deterministic from `seed`)."""

    def __init__(self, args: argparse.Namespace, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.out_len = args.out_tokens
        self.fill: list[np.ndarray] = []  # prompts served to fill the tree, in order
        for _ in range(args.documents):
            doc = rand_ids(rng, args.doc_tokens)
            for _ in range(args.continuations):
                self.fill.append(np.concatenate([doc, rand_ids(rng, args.cont_tokens)]))
        self.chains: list[int] = []  # chain index of each chain turn in `fill`
        self.chain_turns = args.chain_turns
        self.turn_tokens = args.turn_tokens
        self.chain_seeds = [int(rng.integers(1 << 30)) for _ in range(args.chains)]
        self.timed_rng = np.random.default_rng(seed + 1)
        self.prompt_tokens = args.prompt_tokens
        self.timed = args.requests

    def output(self, prompt: np.ndarray) -> np.ndarray:
        """The (fake, deterministic) generated tokens of a prompt."""
        rng = np.random.default_rng(int(prompt[-8:].astype(np.int64).sum()) + len(prompt))
        return rand_ids(rng, self.out_len)


def fill_cache(
    plan: Callable[[np.ndarray, SamplingParams], PrefillOrder],
    commit: Callable[[Finished], Any],
    work: Workload,
    worker: FakeWorker,
    desc: str,
) -> list[np.ndarray]:
    """Serve the fill workload; returns each chain's full history (prompt + output of its
    last turn), the prefixes timed prompts cut from."""
    params = SamplingParams(max_tokens=work.out_len, temperature=0.0, ignore_eos=True)
    total = len(work.fill) + len(work.chain_seeds) * work.chain_turns
    bar = tqdm(total=total, desc=desc, disable=None)
    for prompt in work.fill:
        order = plan(prompt, params)
        commit(worker.finish(order, work.output(prompt)))
        bar.update()
    histories = []
    for seed in work.chain_seeds:
        rng = np.random.default_rng(seed)
        history = np.zeros(0, np.int32)
        for _ in range(work.chain_turns):
            prompt = np.concatenate([history, rand_ids(rng, work.turn_tokens)])
            out = work.output(prompt)
            order = plan(prompt, params)
            commit(worker.finish(order, out))
            history = np.concatenate([prompt, out])
            bar.update()
        histories.append(history)
    bar.close()
    return histories


def timed_prompts(work: Workload, histories: list[np.ndarray]) -> list[np.ndarray]:
    """`work.timed` prompts of `work.prompt_tokens` tokens: a chain's history cut at a
    uniform random depth in [50%, 100%] of it, then fresh tokens."""
    rng = work.timed_rng
    out = []
    for _ in range(work.timed):
        h = histories[int(rng.integers(len(histories)))]
        cut = int(rng.integers(len(h) // 2, len(h) + 1))
        cut = min(cut, work.prompt_tokens - 1)
        out.append(np.concatenate([h[:cut], rand_ids(rng, work.prompt_tokens - cut)]))
    return out


def time_requests(
    plan: Callable[[np.ndarray, SamplingParams], PrefillOrder],
    commit: Callable[[Finished], Any],
    prompts: list[np.ndarray],
    work: Workload,
    worker: FakeWorker,
    desc: str,
) -> dict[str, Any]:
    """Plan + commit each prompt, timing both; p50/p99 and hit lengths. A commit raises
    when the state ids do not cover every depth the cache asks for."""
    params = SamplingParams(max_tokens=work.out_len, temperature=0.0, ignore_eos=True)
    t_plan, t_commit, t_total, hits, ckpts = [], [], [], [], []
    for prompt in tqdm(prompts, desc=desc, disable=None):
        out = work.output(prompt)
        t0 = time.perf_counter()
        order = plan(prompt, params)
        t1 = time.perf_counter()
        done = worker.finish(order, out)
        t2 = time.perf_counter()
        commit(done)
        t3 = time.perf_counter()
        t_plan.append(t1 - t0)
        t_commit.append(t3 - t2)
        t_total.append((t1 - t0) + (t3 - t2))
        hits.append(order.hit_len)
        ckpts.append(len(order.checkpoints))
    return {
        "plan": pct(t_plan),
        "commit": pct(t_commit),
        "plan_plus_commit": pct(t_total),
        "mean_hit_tokens": float(np.mean(hits)),
        "min_hit_tokens": int(np.min(hits)),
        "requests_with_branch_checkpoint": int(sum(c > 0 for c in ckpts)),
    }


def local_planner(raw: dict[str, Any], worker: Worker, capacity: int) -> Planner:
    """The planner `Engine` builds (marconi, bootstrap tuner armed), at `capacity`."""
    return build_planner(raw, worker, "marconi", capacity)


def run_local(
    planner: Planner, work: Workload, prompts: list[np.ndarray] | None, desc: str
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Fill `planner`, then time the prompts (built from the fill when None)."""
    rid = iter(range(1 << 62))
    worker = FakeWorker()

    def plan(prompt: np.ndarray, params: SamplingParams) -> PrefillOrder:
        return planner.order(next(rid), prompt, params)[0]

    t0 = time.perf_counter()
    histories = fill_cache(plan, planner.commit, work, worker, f"fill ({desc})")
    fill_s = time.perf_counter() - t0
    cache = planner.cache
    info: dict[str, Any] = {
        "fill_requests": len(work.fill) + len(work.chain_seeds) * work.chain_turns,
        "fill_s": fill_s,
        "nodes_after_fill": len(cache.tree.iter_nodes()),
        "bytes_after_fill": cache.bytes_used,
        "evictions_during_fill": cache.stats.evictions,
    }
    if prompts is None:
        prompts = timed_prompts(work, histories)
    res = time_requests(plan, planner.commit, prompts, work, worker, f"time ({desc})")
    info.update(res)
    info["nodes_after_timed"] = len(cache.tree.iter_nodes())
    info["evictions_total"] = cache.stats.evictions
    info["tuner_snapshot_taken"] = planner.tuner is not None and planner.tuner.snapshot is not None
    return info, prompts


def run_actor(
    model_dir: Path,
    kv_bytes: int,
    state_bytes: int,
    capacity: int,
    work: Workload,
    prompts: list[np.ndarray],
    desc: str,
) -> dict[str, Any]:
    """The same fill + timed prompts through a real `CacheCoordinator` actor."""
    import ray

    from marconi_ray.serve.app import start_coordinator
    from marconi_ray.serve.settings import ServeSettings

    settings = ServeSettings(
        model_dir=str(model_dir),
        model_name="small",
        cache_bytes=capacity,
        app_name=f"bench-overhead-{desc}",
    )
    coord = start_coordinator(settings)
    try:
        ray.get(coord.register_replica.remote(REPLICA, kv_bytes, state_bytes))
        worker = FakeWorker()

        def plan(prompt: np.ndarray, params: SamplingParams) -> PrefillOrder:
            dispatch = ray.get(coord.plan.remote(prompt, params, time.time()))
            return dispatch.order

        def commit(done: Finished) -> Any:
            return ray.get(coord.commit.remote(REPLICA, done))

        # warm the actor's code paths and the driver's connections (an empty cache is
        # not touched: these are aborted, not committed)
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        for _ in range(20):
            d = ray.get(coord.plan.remote(np.arange(ID_LO, ID_LO + 16, dtype=np.int32), params))
            ray.get(coord.abort.remote(REPLICA, d.order.request_id))
        t0 = time.perf_counter()
        fill_cache(plan, commit, work, worker, f"fill actor ({desc})")
        fill_s = time.perf_counter() - t0
        (st,) = ray.get(coord.stats.remote())
        info: dict[str, Any] = {
            "fill_s": fill_s,
            "bytes_after_fill": st.bytes_used,
            "evictions_during_fill": st.stats["evictions"],
        }
        info.update(time_requests(plan, commit, prompts, work, worker, f"time actor ({desc})"))
        (st,) = ray.get(coord.stats.remote())
        info["evictions_total"] = st.stats["evictions"]
        info["in_flight_after"] = st.in_flight
        info["locked_nodes_after"] = ray.get(coord.locked_nodes.remote(REPLICA))
        return info
    finally:
        ray.kill(coord)


def prefill_time(model_dir: Path, n: int, reps: int) -> dict[str, Any]:
    """`HybridModel.prefill` of `n` random tokens into a fresh state, one thread."""
    model = load_model(model_dir)
    rng = np.random.default_rng(3)
    with torch.inference_mode():
        model.prefill(torch.as_tensor(rand_ids(rng, 64), dtype=torch.long), model.new_state(), [])
        times = []
        for _ in tqdm(range(reps), desc=f"prefill {n}", disable=None):
            ids = torch.as_tensor(rand_ids(rng, n), dtype=torch.long)
            t0 = time.perf_counter()
            model.prefill(ids, model.new_state(), [])
            times.append(time.perf_counter() - t0)
    return {"tokens": n, "reps": reps, "best_s": min(times), "median_s": float(np.median(times))}


def overhead_bench(args: argparse.Namespace, small_dir: Path, tmp: Path) -> dict[str, Any]:
    long_dir = long_context_copy(small_dir, tmp / "small-long")
    _, raw = read_config(long_dir)
    worker = Worker(load_model(long_dir), 1)
    kv_bytes, state_bytes = worker.store.kv_bytes_per_token, worker.store.state_bytes
    work = Workload(args)
    fit_cap = int(1e15)
    report: dict[str, Any] = {
        "model": "small nemotron_h (config max_position_embeddings raised to 32768)",
        "cost": {"kv_bytes_per_token": kv_bytes, "state_bytes": state_bytes},
        "workload": {
            k: getattr(args, k)
            for k in (
                "documents",
                "continuations",
                "doc_tokens",
                "cont_tokens",
                "chains",
                "chain_turns",
                "turn_tokens",
                "out_tokens",
                "prompt_tokens",
                "requests",
            )
        },
    }
    fit, prompts = run_local(local_planner(raw, worker, fit_cap), work, None, "fit")
    if fit["nodes_after_fill"] < args.min_nodes:
        raise RuntimeError(f"tree has {fit['nodes_after_fill']} nodes < {args.min_nodes}")
    # full: the fill fits exactly (no eviction), every timed request must evict
    full_cap = int(fit["bytes_after_fill"]) + 4 * state_bytes
    full, _ = run_local(local_planner(raw, worker, full_cap), Workload(args), prompts, "full")
    report["in_process"] = {
        "fit": {"capacity": fit_cap, **fit},
        "full": {"capacity": full_cap, **full},
    }
    del worker
    report["prefill"] = prefill_time(long_dir, args.prompt_tokens, args.prefill_reps)
    if not args.no_actor:
        ensure_ray(args)
        actor = {}
        for mode, cap in (("fit", fit_cap), ("full", full_cap)):
            actor[mode] = {"capacity": cap}
            actor[mode].update(
                run_actor(long_dir, kv_bytes, state_bytes, cap, Workload(args), prompts, mode)
            )
            if actor[mode]["bytes_after_fill"] != report["in_process"][mode]["bytes_after_fill"]:
                raise RuntimeError(f"actor and in-process caches differ after the fill ({mode})")
        report["actor"] = actor
    prefill_ms = 1e3 * report["prefill"]["median_s"]
    ratios = {}
    for where in ("in_process", "actor"):
        for mode, res in report.get(where, {}).items():
            for q in ("p50_ms", "p99_ms"):
                ratios[f"{where}/{mode}/{q}"] = res["plan_plus_commit"][q] / prefill_ms
    report["overhead_over_prefill"] = ratios
    return report


# ---------------------------------------------------------------------- 2. tuner
def shift_ids(a: np.ndarray, by: int) -> np.ndarray:
    """Token ids moved by `by` (mod the Llama-2 vocab): a distinct copy of a session."""
    return ((a.astype(np.int64) + by) % 32000).astype(np.int32)


def sharegpt_requests(args: argparse.Namespace) -> tuple[list[Request], str]:
    """The artifact ShareGPT trace, or the packaged sample replicated when it is absent."""
    try:
        trace = load_trace("sharegpt", n_sessions=args.sessions, sessions_per_second=1.0)
        return list(trace.requests), f"sharegpt (artifact mode), {args.sessions} sessions"
    except (FileNotFoundError, OSError) as exc:
        sample = load_trace("sample", sessions_per_second=1.0)
        n = len(sample.session_ids())
        copies = -(-args.sessions // n)
        reqs = []
        for c in range(copies):
            for r in sample.requests:
                shift = functools.partial(shift_ids, by=7919 * c)
                reqs.append(
                    Request(
                        r.session_id + c * 10**6,
                        r.turn_id,
                        r.ts + c * n,
                        shift(r.input_tokens),
                        shift(r.output_tokens),
                    )
                )
        reqs.sort(key=lambda r: (r.ts, r.session_id, r.turn_id))
        return reqs, f"FALLBACK: packaged sample x{copies} with shifted ids ({exc})"


def tuner_bench(args: argparse.Namespace) -> dict[str, Any]:
    import pickle

    import ray

    from marconi_ray.serve.coordinator.tuner_actor import start_tuner
    from marconi_ray.serve.settings import TunerSettings

    requests, source = sharegpt_requests(args)
    cost = CostModel.from_spec(get_preset("paper-7b"))
    job = tuner_job(requests, cost, int(args.tune_capacity), args.window)
    warm = replace(job, window=job.window[:4])
    ensure_ray(args)
    tuners = {}
    for w in (1, 2):
        tuners[w] = start_tuner(
            TunerSettings(workers=w),
            "bench-no-coordinator",
            name=f"bench-tuner-w{w}",
            detached=False,
        )
        ray.get(tuners[w].tune.remote("warm", warm))  # workers and the remote fn up
    runs: dict[str, list[dict[str, Any]]] = {"serial": [], "ray_w1": [], "ray_w2": []}
    for _ in tqdm(range(args.tune_reps), desc="tuner reps", disable=None):
        t0 = time.perf_counter()
        res = run_grid(job)
        runs["serial"].append(
            {"wall_s": time.perf_counter() - t0, "grid_s": res.wall_s, "alpha": res.best_alpha}
        )
        for w in (1, 2):
            t0 = time.perf_counter()
            res = ray.get(tuners[w].tune.remote("bench", job))
            runs[f"ray_w{w}"].append(
                {"wall_s": time.perf_counter() - t0, "grid_s": res.wall_s, "alpha": res.best_alpha}
            )
    for t in tuners.values():
        ray.kill(t)
    summary = {
        k: {
            "median_wall_s": float(np.median([r["wall_s"] for r in v])),
            "min_wall_s": float(np.min([r["wall_s"] for r in v])),
            "median_grid_s": float(np.median([r["grid_s"] for r in v])),
            "alphas": sorted({r["alpha"] for r in v}),
        }
        for k, v in runs.items()
    }
    alphas = {a for v in summary.values() for a in v["alphas"]}
    return {
        "trace": source,
        "trace_requests": len(requests),
        "cost": "paper-7b",
        "capacity": int(args.tune_capacity),
        "window": len(job.window),
        "window_start_request": job.start_request,
        "grid": list(job.grid),
        "job_pickle_mb": len(pickle.dumps(job)) / 1e6,
        "ray_num_cpus": args.ray_cpus,
        "runs": runs,
        "summary": summary,
        "speedup_w1_over_w2": summary["ray_w1"]["median_wall_s"]
        / summary["ray_w2"]["median_wall_s"],
        "speedup_serial_over_w2": summary["serial"]["median_wall_s"]
        / summary["ray_w2"]["median_wall_s"],
        "same_alpha": len(alphas) == 1,
        "best_alpha": sorted(alphas),
    }


# ---------------------------------------------------------------------- 3. throughput
def throughput_bench(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    import ray
    from ray import serve

    from marconi_ray.serve.app import shutdown_app, start_actors
    from marconi_ray.serve.messages import Completed
    from marconi_ray.serve.replica.deployment import replica_deployment
    from marconi_ray.serve.settings import NAMESPACE, ServeSettings

    levels = [int(x) for x in args.levels.split(",")]
    params = SamplingParams(max_tokens=args.gen_tokens, temperature=0.0, ignore_eos=True)
    rng = np.random.default_rng(11)

    def prompts(k: int) -> list[list[int]]:
        return [rand_ids(rng, args.gen_prompt_tokens).tolist() for _ in range(k)]

    settings = ServeSettings(
        model_dir=str(model_dir),
        model_name="small",
        tp=1,
        replicas=1,
        system="marconi",
        max_batch=args.max_batch,
        cache_bytes=1 << 32,
        app_name="bench-throughput",
    )
    ensure_ray(args)
    start_actors(settings)
    serve_rows: dict[int, list[dict[str, float]]] = {k: [] for k in levels}
    try:
        handle = serve.run(
            replica_deployment(settings).bind(settings),
            name=settings.app_name,
            route_prefix=None,
        )
        coordinator = ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
        deadline = time.monotonic() + 120
        while not ray.get(coordinator.replicas.remote()):
            if time.monotonic() > deadline:
                raise RuntimeError("the model replica did not register")
            time.sleep(0.2)

        async def one(prompt: list[int]) -> tuple[int, float]:
            dispatch = await coordinator.plan.remote(
                np.asarray(prompt, np.int32), params, time.time()
            )
            n = 0
            done = None
            async for event in handle.options(stream=True).generate.remote(dispatch):
                if isinstance(event, Completed):
                    done = event
                else:  # a batch of this request's tokens
                    n += len(event)
            assert done is not None and n == args.gen_tokens, (n, done)
            return n, done.timings.ttft

        async def level(k: int) -> dict[str, float]:
            batch = prompts(k)
            t0 = time.perf_counter()
            res = await asyncio.gather(*(one(p) for p in batch))
            wall = time.perf_counter() - t0
            tokens = sum(n for n, _ in res)
            return {
                "wall_s": wall,
                "tokens": tokens,
                "tok_s": tokens / wall,
                "mean_ttft_s": float(np.mean([t for _, t in res])),
            }

        asyncio.run(level(2))  # warm-up (prefill, decode, commit paths)
        for _ in tqdm(range(args.gen_reps), desc="serve reps", disable=None):
            for k in levels:
                serve_rows[k].append(asyncio.run(level(k)))
    finally:
        shutdown_app(settings)
        with contextlib.suppress(Exception):
            serve.shutdown()
    engine_rows: dict[int, list[dict[str, float]]] = {k: [] for k in levels}
    if not args.no_engine:
        torch.set_num_threads(1)  # as the serve shard actor
        engine = Engine(model_dir, system="marconi", cache_bytes=1 << 32, max_batch=args.max_batch)
        engine.generate_many(prompts(2), [params] * 2)
        for _ in tqdm(range(args.gen_reps), desc="engine reps", disable=None):
            for k in levels:
                batch = prompts(k)
                t0 = time.perf_counter()
                res = engine.generate_many(batch, [params] * k)
                wall = time.perf_counter() - t0
                tokens = sum(len(r.tokens) for r in res)
                engine_rows[k].append({"wall_s": wall, "tokens": tokens, "tok_s": tokens / wall})
    out: dict[str, Any] = {
        "model": "small nemotron_h (48M params), float32, CPU, 1 torch thread per shard",
        "replica": {"tp": 1, "system": "marconi", "max_batch": args.max_batch},
        "prompt_tokens": args.gen_prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "reps": args.gen_reps,
        "levels": levels,
    }
    for name, rows in (("serve", serve_rows), ("engine", engine_rows)):
        if not any(rows.values()):
            continue
        table = []
        base = float(np.median([r["tok_s"] for r in rows[levels[0]]]))
        for k in levels:
            med = float(np.median([r["tok_s"] for r in rows[k]]))
            table.append(
                {"concurrency": k, "median_tok_s": med, "over_first": med / base, "runs": rows[k]}
            )
        out[name] = table
    return out


def plot_throughput(report: dict[str, Any], path: Path) -> None:
    levels = report["levels"]
    fig = Figure(figsize=(6.5, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    x = np.arange(len(levels))
    names = [n for n in ("serve", "engine") if n in report]
    width = 0.8 / len(names)
    labels = {"serve": "Ray Serve replica (tp=1)", "engine": "in-process Engine.generate_many"}
    for i, name in enumerate(names):
        vals = [r["median_tok_s"] for r in report[name]]
        bars = ax.bar(x + (i - (len(names) - 1) / 2) * width, vals, width, label=labels[name])
        for b, r in zip(bars, report[name], strict=True):
            ax.annotate(
                f"{r['median_tok_s']:.0f}\n({r['over_first']:.1f}x)",
                (b.get_x() + b.get_width() / 2, b.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.set_xticks(x, [str(k) for k in levels])
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("generated tokens/s")
    ax.set_title(
        f"Decode throughput, small NemotronH on CPU, max_batch={report['replica']['max_batch']}, "
        f"{report['gen_tokens']} tokens/request",
        fontsize=9,
    )
    ax.margins(y=0.2)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---------------------------------------------------------------------- driver
_RAY_STARTED = False


def ensure_ray(args: argparse.Namespace) -> None:
    """A local Ray with `args.ray_cpus` logical CPUs (started once)."""
    global _RAY_STARTED
    if _RAY_STARTED:
        return
    import ray

    from marconi_ray.serve.settings import NAMESPACE

    ray.init(
        address="local",
        num_cpus=args.ray_cpus,
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
    )
    _RAY_STARTED = True


def stop_ray() -> None:
    if not _RAY_STARTED:
        return
    import ray
    from ray import serve

    with contextlib.suppress(Exception):
        serve.shutdown()
    ray.shutdown()


def print_summary(report: dict[str, Any]) -> None:
    if "overhead" in report:
        o = report["overhead"]
        pf = o["prefill"]
        print(
            f"\n1. coordinator overhead, {o['workload']['prompt_tokens']}-token prompts, "
            f"{o['workload']['requests']} requests; prefill of one such prompt "
            f"{pf['median_s']:.2f} s (median of {pf['reps']}, 1 thread)"
        )
        print(
            f"{'where':>10} {'mode':>4} {'nodes':>6} | {'plan p50/p99 ms':>16} | "
            f"{'commit p50/p99 ms':>17} | {'total p50/p99 ms':>16} | {'max ms':>7} | "
            f"{'p99/prefill':>11} | {'evict':>5}"
        )
        for where in ("in_process", "actor"):
            for mode, r in o.get(where, {}).items():
                nodes = o["in_process"][mode]["nodes_after_fill"]
                tot = r["plan_plus_commit"]
                print(
                    f"{where:>10} {mode:>4} {nodes:>6} | "
                    f"{r['plan']['p50_ms']:>7.2f} / {r['plan']['p99_ms']:>6.2f} | "
                    f"{r['commit']['p50_ms']:>8.2f} / {r['commit']['p99_ms']:>6.2f} | "
                    f"{tot['p50_ms']:>7.2f} / {tot['p99_ms']:>6.2f} | {tot['max_ms']:>7.1f} | "
                    f"{100 * o['overhead_over_prefill'][f'{where}/{mode}/p99_ms']:>10.4f}% | "
                    f"{r['evictions_total'] - r['evictions_during_fill']:>5}"
                )
        r = o["in_process"]["fit"]
        print(
            f"timed prompts: mean hit {r['mean_hit_tokens']:.0f} tokens (min "
            f"{r['min_hit_tokens']}), {r['requests_with_branch_checkpoint']} with a branch "
            "checkpoint"
        )
    if "tuner" in report:
        t = report["tuner"]
        print(
            f"\n2. tuner: {len(t['grid'])} alphas x {t['window']}-request window "
            f"({t['trace']}; capacity {t['capacity'] / 1e9:.0f} GB, job "
            f"{t['job_pickle_mb']:.1f} MB)"
        )
        for k, s in t["summary"].items():
            print(
                f"{k:>8}: median {s['median_wall_s']:.2f} s (min {s['min_wall_s']:.2f}, grid "
                f"{s['median_grid_s']:.2f}), alpha {s['alphas']}"
            )
        print(
            f"speed-up 1 -> 2 workers {t['speedup_w1_over_w2']:.2f}x; serial / 2 workers "
            f"{t['speedup_serial_over_w2']:.2f}x; same alpha: {t['same_alpha']}"
        )
    if "throughput" in report:
        t = report["throughput"]
        print(
            f"\n3. decode throughput ({t['model']}; {t['prompt_tokens']}-token prompts, "
            f"{t['gen_tokens']} tokens each, median of {t['reps']})"
        )
        for name in ("serve", "engine"):
            if name in t:
                cells = ", ".join(
                    f"{r['concurrency']}: {r['median_tok_s']:.1f} tok/s ({r['over_first']:.2f}x)"
                    for r in t[name]
                )
                print(f"{name:>8}: {cells}")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("parts", nargs="*", help=f"parts to run: {', '.join(PARTS)} (default: all)")
    p.add_argument("--out", default="benchmarks/results/serve", help="output folder")
    p.add_argument(
        "--model-dir",
        default=".cache/bench_engine/small-nemotron_h",
        help="small NemotronH checkpoint (built there, seed 0, if absent)",
    )
    p.add_argument("--ray-cpus", type=int, default=4, help="logical CPUs of the local Ray")
    g = p.add_argument_group("overhead")
    g.add_argument("--documents", type=int, default=250, help="documents in the fill")
    g.add_argument("--continuations", type=int, default=41, help="continuations per document")
    g.add_argument("--doc-tokens", type=int, default=256, help="tokens per document")
    g.add_argument("--cont-tokens", type=int, default=32, help="tokens per continuation")
    g.add_argument("--chains", type=int, default=4, help="multi-turn chains in the fill")
    g.add_argument("--chain-turns", type=int, default=100, help="turns per chain")
    g.add_argument("--turn-tokens", type=int, default=150, help="new user tokens per turn")
    g.add_argument("--out-tokens", type=int, default=16, help="generated tokens per request")
    g.add_argument("--prompt-tokens", type=int, default=20_000, help="timed prompt length")
    g.add_argument("--requests", type=int, default=200, help="timed requests per setting")
    g.add_argument("--min-nodes", type=int, default=10_000, help="required tree nodes")
    g.add_argument("--prefill-reps", type=int, default=1, help="prefill timing reps")
    g.add_argument("--no-actor", action="store_true", help="skip the coordinator-actor timing")
    g = p.add_argument_group("tuner")
    g.add_argument("--sessions", type=int, default=100, help="ShareGPT sessions")
    g.add_argument("--tune-capacity", type=float, default=2e9, help="cache bytes")
    g.add_argument("--window", type=int, default=1000, help="tuning window (requests)")
    g.add_argument("--tune-reps", type=int, default=5, help="interleaved reps")
    g = p.add_argument_group("throughput")
    g.add_argument("--levels", default="1,4,16", help="comma-separated concurrency levels")
    g.add_argument("--max-batch", type=int, default=16, help="replica max_batch")
    g.add_argument("--gen-prompt-tokens", type=int, default=64, help="prompt tokens")
    g.add_argument("--gen-tokens", type=int, default=64, help="generated tokens per request")
    g.add_argument("--gen-reps", type=int, default=2, help="reps per level")
    g.add_argument("--no-engine", action="store_true", help="skip the in-process comparison")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: small fill, 20 timed 2,000-token prompts, 200-request tuner "
        "window x 1 rep, 16 generated tokens x 1 rep",
    )
    args = p.parse_args()
    bad = sorted(set(args.parts) - set(PARTS))
    if bad:
        p.error(f"unknown part(s) {bad}; choose from {list(PARTS)}")
    args.parts = [x for x in PARTS if x in args.parts] or list(PARTS)
    if args.quick:
        args.documents, args.continuations, args.chains, args.chain_turns = 20, 10, 2, 10
        args.prompt_tokens, args.requests, args.min_nodes = 2000, 20, 100
        args.window, args.tune_reps, args.sessions = 200, 1, 40
        args.gen_tokens, args.gen_reps = 16, 1
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    report: dict[str, Any] = {"quick": args.quick, "parts": args.parts}
    small_dir = ensure_small(Path(args.model_dir))
    try:
        with tempfile.TemporaryDirectory(prefix="bench_serve_") as tmp:
            if "overhead" in args.parts:
                report["overhead"] = overhead_bench(args, small_dir, Path(tmp))
            if "tuner" in args.parts:
                report["tuner"] = tuner_bench(args)
            if "throughput" in args.parts:
                report["throughput"] = throughput_bench(args, small_dir)
    finally:
        stop_ray()
    report["wall_s"] = time.perf_counter() - start
    (out / "bench_serve.json").write_text(json.dumps(report, indent=2, default=float))
    written = [out / "bench_serve.json"]
    if "throughput" in report:
        plot_throughput(report["throughput"], out / "throughput_vs_concurrency.png")
        written.append(out / "throughput_vs_concurrency.png")
    print_summary(report)
    print(f"\nwall time {report['wall_s']:.0f} s; wrote {', '.join(map(str, written))}")


if __name__ == "__main__":
    main()
