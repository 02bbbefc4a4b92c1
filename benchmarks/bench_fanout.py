"""Per-step fan-out of a tensor-parallel replica: plain actor calls against a Ray Compiled
Graph (the step loop next to the shards).

One local Ray instance, one TP group of real `ShardActor`s (--tp, default 2) on the
`tiny` preset (NemotronH, float32, CPU, torch one thread), set up once. Both paths drive
the SAME actors, so they see the same model, store and batch:

- plain: `ActorShards.call("advance", step)`: one actor task per shard per step, awaited
  together (the old `advance`);
- compiled: `ActorShards.advance(step)` over its `StepGraph` (the step written once into
  shared-memory channels every shard reads; rank 0's output read back).

Step kinds, measured from the driver's event loop (time from sending the step to having
rank 0's `StepOutput`, every shard done):

(i) empty: no request runs, so the step is the fan-out alone;
(ii) decode: --batch requests (prompts of --prompt-len tokens, greedy, ignore_eos) start
    first, then every measured step is one decode of all of them (each adds one token to
    every sequence, so the context grows alike for both paths).

The two paths alternate step by step (plain, compiled, plain, ...) after --warmup steps of
each (the first compiled step compiles the graph: its time is reported apart). Reported per
kind and path: p50, p99, mean (ms) and the plain / compiled ratio of p50 and p99.

(iii) idle CPU: the CPU time (all threads) each shard process and this driver process use
    over --idle-s seconds with no step sent, before the graph is compiled and while it is
    live (Ray 2.60's channel readers busy-wait: a live graph costs CPU even when idle).

Writes OUT/fanout.json (figures, every option, machine, versions, commit) and prints the
table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import run_info

HERE = Path(__file__).resolve().parent
Step = Callable[[Any], Awaitable[Any]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    p.add_argument(
        "--out", default=str(HERE / "results" / "fanout"), help="output folder (fanout.json)"
    )
    p.add_argument(
        "--model", default="tiny", help="model folder, or preset[:family] (built if needed)"
    )
    p.add_argument("--tp", type=int, default=2, help="shard actors in the TP group (>= 2)")
    p.add_argument(
        "--empty-steps", type=int, default=1000, help="(i) measured empty steps per path"
    )
    p.add_argument(
        "--decode-steps", type=int, default=200, help="(ii) measured decode steps per path"
    )
    p.add_argument("--batch", type=int, default=8, help="(ii) sequences decoded per step")
    p.add_argument("--prompt-len", type=int, default=16, help="(ii) tokens of each prompt")
    p.add_argument(
        "--warmup", type=int, default=20, help="unmeasured steps of each path before each kind"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument(
        "--idle-s", type=float, default=2.0, help="(iii) idle seconds per CPU measurement"
    )
    args = p.parse_args(argv)
    for name in ("empty_steps", "decode_steps", "batch", "prompt_len", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.idle_s <= 0:
        p.error("--idle-s must be > 0")
    if args.tp < 2:
        p.error("--tp must be >= 2 (tp 1 runs the shard in the replica: no fan-out)")
    return args


def machine() -> dict[str, Any]:
    return run_info.machine(("ray", "torch", "numpy", "marconi-ray"))


def summary(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1e3
    return {
        "n": len(ms),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "mean_ms": float(ms.mean()),
    }


async def alternate(
    paths: dict[str, Step], make: Callable[[], Any], n: int, warmup: int
) -> dict[str, dict[str, float]]:
    """`warmup` unmeasured then `n` measured steps of each path, alternating step by step;
    returns {path: summary}."""
    times: dict[str, list[float]] = {name: [] for name in paths}
    for i in range(warmup + n):
        for name, step in paths.items():
            t0 = time.perf_counter()
            await step(make())
            if i >= warmup:
                times[name].append(time.perf_counter() - t0)
    return {name: summary(t) for name, t in times.items()}


def _cpu_time(_: Any) -> float:
    return time.process_time()


async def idle_cpu(actors: list[Any], seconds: float) -> dict[str, Any]:
    """CPU cores used (CPU seconds / wall seconds) by each shard process and by this
    process while nothing is sent for `seconds`."""

    async def cpu() -> list[float]:
        shards = await asyncio.gather(*(a.__ray_call__.remote(_cpu_time) for a in actors))
        return [*shards, time.process_time()]

    before, t0 = await cpu(), time.perf_counter()
    await asyncio.sleep(seconds)
    after, wall = await cpu(), time.perf_counter() - t0
    cores = [(b - a) / wall for a, b in zip(before, after, strict=True)]
    return {"shard_cores": cores[:-1], "driver_cores": cores[-1]}


async def measure(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    from marconi_ray.protocol.orders import PrefillOrder, StepInput
    from marconi_ray.protocol.sampling import SamplingParams
    from marconi_ray.serve.replica.shard_group import ActorShards
    from marconi_ray.serve.settings import ServeSettings

    settings = ServeSettings(str(model_dir), "bench", tp=args.tp, max_batch=args.batch)
    group = ActorShards(settings, [f"fanout-shard{r}" for r in range(args.tp)])
    try:
        t0 = time.perf_counter()
        await group.ready()
        setup_s = time.perf_counter() - t0

        async def plain(step: Any) -> Any:
            return await group.call("advance", step)

        paths: dict[str, Step] = {"plain": plain, "compiled": group.advance}
        idle = {"plain": await idle_cpu(group.actors, args.idle_s)}
        t0 = time.perf_counter()
        await group.advance(StepInput())
        compile_s = time.perf_counter() - t0
        idle["compiled"] = await idle_cpu(group.actors, args.idle_s)
        out: dict[str, Any] = {"setup_s": setup_s, "first_compiled_step_s": compile_s}
        out["idle_cpu"] = idle
        out["empty"] = await alternate(paths, StepInput, args.empty_steps, args.warmup)

        decode_steps = 2 * (args.warmup + args.decode_steps)
        limit = int(group.info["max_position"]) - args.prompt_len - 2
        if decode_steps > limit:
            raise SystemExit(f"{decode_steps} decode steps exceed the context ({limit})")
        rng = np.random.default_rng(args.seed)
        params = SamplingParams(max_tokens=decode_steps + 1, temperature=0.0, ignore_eos=True)
        vocab = int(group.info["vocab_size"])
        orders = tuple(
            PrefillOrder(
                rid,
                rng.integers(3, vocab, args.prompt_len).astype(np.int32),
                params,
                decode_steps + 1,
            )
            for rid in range(args.batch)
        )
        await group.advance(StepInput(start=orders))
        running = (await group.rank0("store_stats"))["running"]
        if running != args.batch:
            raise SystemExit(f"{running} sequences running, wanted {args.batch}")
        out["decode"] = await alternate(paths, StepInput, args.decode_steps, args.warmup)
        out["decode"]["running"] = running
        return out
    finally:
        group.kill()


def report(figures: dict[str, Any]) -> None:
    print(
        f"set-up {figures['setup_s']:.2f} s; first compiled step (compiles the graph) "
        f"{figures['first_compiled_step_s'] * 1e3:.0f} ms"
    )
    print(f"{'step':<8}{'path':<10}{'n':>6}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for kind in ("empty", "decode"):
        for path in ("plain", "compiled"):
            s = figures[kind][path]
            print(
                f"{kind:<8}{path:<10}{s['n']:>6}{s['p50_ms']:>10.3f}{s['p99_ms']:>10.3f}"
                f"{s['mean_ms']:>10.3f}"
            )
        ratio = figures[kind]["ratio_plain_over_compiled"]
        print(f"{kind:<8}plain / compiled: p50 {ratio['p50']:.2f}x, p99 {ratio['p99']:.2f}x")
    for path, idle in figures["idle_cpu"].items():
        shards = ", ".join(f"{c:.2f}" for c in idle["shard_cores"])
        print(f"idle CPU cores, {path:<9} shards [{shards}], driver {idle['driver_cores']:.2f}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    import torch

    from marconi_ray.serve.model_source import resolve_model
    from marconi_ray.serve.settings import NAMESPACE

    torch.set_num_threads(1)
    model_dir = resolve_model(args.model)
    ray.init(
        address="local",
        num_cpus=max(4, args.tp + 2),
        include_dashboard=False,
        namespace=NAMESPACE,
        log_to_driver=False,
    )
    try:
        figures = asyncio.run(measure(args, model_dir))
    finally:
        ray.shutdown()
    for kind in ("empty", "decode"):
        plain, compiled = figures[kind]["plain"], figures[kind]["compiled"]
        figures[kind]["ratio_plain_over_compiled"] = {
            q: plain[f"{q}_ms"] / compiled[f"{q}_ms"] for q in ("p50", "p99")
        }
    result = {"config": vars(args) | {"model_dir": str(model_dir)}, "machine": machine()}
    result |= figures
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fanout.json").write_text(json.dumps(result, indent=2) + "\n")
    report(figures)
    print(f"wrote {out / 'fanout.json'}")
    return result


if __name__ == "__main__":
    main()
