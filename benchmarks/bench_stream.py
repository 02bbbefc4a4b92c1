"""Streamed tokens: the serving stack's CPU per token, next to its floors, in one run.

Systems, measured side by side on one local Ray instance:
- S, the service: the `tiny` preset (1 replica, tp 1, marconi, max_batch = the largest
  client count) streaming `/v1/completions`; once per `--stream-intervals` value (rows
  `service` for 1, `service/N` for N tokens per chunk at least).
- F, the bare Ray Serve streaming floor built here: a FastAPI ingress that per request
  awaits `plan` on a plain actor, streams from a second deployment (a generator through a
  DeploymentHandle with `stream=True`) that yields the N tokens at once, writes one SSE
  chunk per token, then awaits `commit`: the service's topology with no work in it.
- E, the in-process `Engine` on the same model folder (torch one thread): the same number
  of requests and tokens, decoded in batches of the client count (`generate_many`).

For each client count (`--clients`, default 1, 16, 64) every client streams
`--requests` completions of `--tokens` tokens (ignore_eos, temperature 0, a fresh random
prompt each: no cache hit) back to back. The CPU seconds of every process on the machine
(/proc, user + system) are read before and after each (system, client count) and divided
by the tokens delivered; processes are grouped as `replica` (the model replica's Serve
process and its shard actors), `outside` (the HTTP ingress, the Serve proxy, the cache
coordinator and tuner, the Serve controller: everything between the client and the
replica; its `ingress` and `proxy` parts are also shown alone) and `ray` (raylet, GCS).
ITL is the time between two chunks that carry text, per
stream (p50, p99 over all streams); chunks per token counts SSE chunks with text.

Writes OUT/stream.json and OUT/stream.png (CPU-ms per token by group, per system and
client count); prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import run_info
import torch
from bench_overhead import FLOOR_ACTOR, LETTERS, cpu_delta, cpu_seconds, start_floor
from fastapi import FastAPI, Request  # module level: FastAPI resolves the annotations
from fastapi.responses import StreamingResponse
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from marconi_ray.protocol.sampling import SamplingParams

HERE = Path(__file__).resolve().parent
FLOOR_APP = "stream-floor"
GROUPS = ("outside", "replica", "ray")
PARTS = ("ingress", "proxy")
"""Parts of `outside` reported on their own (the coordinator and controller are the rest)."""


def group_of(process: str) -> str | None:
    """The group of a process named by `cpu_seconds` (None: not the serving stack's)."""
    if process.startswith("ServeReplica:") and process.endswith(("ModelReplica", "FloorReplica")):
        return "replica"
    if process.startswith("ShardActor"):
        return "replica"
    if process in ("raylet", "gcs_server"):
        return "ray"
    if process.startswith(("ServeReplica:", "ProxyActor", "ServeController", "CacheCoordinator")):
        return "outside"
    if process.startswith(("TunerActor", "FloorActor")):
        return "outside"
    return None


# ---------------------------------------------------------------------- the floor (F)
def floor_app() -> Any:
    """FastAPI ingress -> actor.plan (bench_overhead's floor actor), FloorReplica.tokens (a
    generator yielding every token at once, streamed through the handle), one SSE chunk
    per token, actor.commit; CPU and queue options as the service's ingress and replica."""
    import ray
    from ray import serve

    from marconi_ray.serve.app import INGRESS_MAX_ONGOING
    from marconi_ray.serve.settings import NAMESPACE

    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    one_cpu = {"num_cpus": 1}

    @serve.deployment(name="FloorReplica", ray_actor_options=one_cpu, max_ongoing_requests=256)
    class FloorReplica:
        async def tokens(self, n: int) -> AsyncIterator[int]:
            for i in range(n):
                yield i

    @serve.deployment(ray_actor_options=one_cpu, max_ongoing_requests=INGRESS_MAX_ONGOING)
    @serve.ingress(api)
    class FloorIngress:
        def __init__(self, replica: Any) -> None:
            self.replica = replica.options(stream=True)
            self.actor = ray.get_actor(FLOOR_ACTOR, namespace=NAMESPACE)

        @api.post("/v1/completions")
        async def completions(self, request: Request) -> StreamingResponse:
            assert isinstance(request, Request)  # pickled by value: keeps the name resolvable
            body = json.loads(await request.body())
            rid = await self.actor.plan.remote(body["prompt"])
            n = int(body["max_tokens"])

            async def events() -> AsyncIterator[str]:
                async for _ in self.replica.tokens.remote(n):
                    choice = {"index": 0, "text": " a", "finish_reason": None}
                    yield f"data: {json.dumps({'id': 'cmpl-floor', 'choices': [choice]})}\n\n"
                await self.actor.commit.remote(rid)
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

    return FloorIngress.bind(FloorReplica.bind())


# ---------------------------------------------------------------------- streaming load
async def stream_one(http: httpx.AsyncClient, url: str, prompt: str, n: int) -> dict[str, Any]:
    """One streamed completion: tokens (from `usage` when the server sends it, else the
    text chunks), text chunks and the gaps between them."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "stream": True}
    body |= {"temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    arrivals: list[float] = []
    tokens = None
    async with http.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            data = json.loads(line[6:])
            if (data.get("usage") or {}).get("completion_tokens") is not None:
                tokens = int(data["usage"]["completion_tokens"])
            if (data.get("choices") or [{}])[0].get("text"):
                arrivals.append(time.perf_counter())
    gaps = np.diff(arrivals).tolist() if len(arrivals) > 1 else []
    return {"tokens": n if tokens is None else tokens, "chunks": len(arrivals), "gaps": gaps}


async def stream_load(url: str, clients: int, requests: int, n: int, rng: Any) -> dict[str, Any]:
    """`clients` closed-loop clients, `requests` streamed completions each: tokens, text
    chunks, ITL gaps, wall time and the CPU seconds per process meanwhile."""
    limits = httpx.Limits(max_connections=2 * clients, max_keepalive_connections=2 * clients)
    async with httpx.AsyncClient(limits=limits, timeout=600.0) as http:
        await stream_one(http, url, "".join(rng.choice(LETTERS, 40)), n)  # warm-up
        done: list[dict[str, Any]] = []
        bar = tqdm(total=clients * requests, desc=f"{url.split('/')[3]} c={clients}", leave=False)

        async def client() -> None:
            for _ in range(requests):
                prompt = "".join(rng.choice(LETTERS, 40))
                done.append(await stream_one(http, url, prompt, n))
                bar.update()

        before, t0 = cpu_seconds(), time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall, used = time.perf_counter() - t0, cpu_delta(before, cpu_seconds())
        bar.close()
    tokens = sum(d["tokens"] for d in done)
    gaps = [g for d in done for g in d["gaps"]]
    return {
        "tokens": tokens,
        "chunks": sum(d["chunks"] for d in done),
        "wall_s": wall,
        "cpu_s": used,
        "itl_p50_ms": 1e3 * float(np.percentile(gaps, 50)) if gaps else None,
        "itl_p99_ms": 1e3 * float(np.percentile(gaps, 99)) if gaps else None,
    }


def part_of(process: str) -> str | None:
    """The part of `outside` a process is, when it is the HTTP ingress or the proxy."""
    if process.startswith("ProxyActor"):
        return "proxy"
    if process.startswith("ServeReplica:") and group_of(process) == "outside":
        return "ingress"
    return None


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """CPU-ms per token by group (and total; `ingress` and `proxy` are parts of `outside`)
    and chunks per token of one load."""
    per_group = dict.fromkeys(GROUPS, 0.0)
    parts = dict.fromkeys(PARTS, 0.0)
    for process, seconds in run["cpu_s"].items():
        group, part = group_of(process), part_of(process)
        if group is not None:
            per_group[group] += seconds
        if part is not None:
            parts[part] += seconds
    tokens = max(run["tokens"], 1)
    ms = {g: 1e3 * s / tokens for g, s in per_group.items()}
    of_outside = {p: 1e3 * s / tokens for p, s in parts.items()}
    return {
        "cpu_ms_per_token": ms | {"total": sum(ms.values())} | of_outside,
        "chunks_per_token": run["chunks"] / tokens,
        "tokens_per_s": run["tokens"] / run["wall_s"],
        "itl_p50_ms": run["itl_p50_ms"],
        "itl_p99_ms": run["itl_p99_ms"],
    }


def engine_run(model_dir: Path, clients: int, requests: int, n: int, rng: Any) -> dict[str, Any]:
    """E: `clients * requests` requests of `n` tokens in batches of `clients`; its CPU."""
    from marconi_ray.engine.engine import Engine

    engine = Engine(model_dir, max_batch=max(clients, 1))
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    vocab = engine.config.vocab_size
    engine.generate(rng.integers(3, vocab, 40).tolist(), params)  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = 0
    for _ in range(requests):
        prompts = [rng.integers(3, vocab, 40).tolist() for _ in range(clients)]
        tokens += sum(len(r.tokens) for r in engine.generate_many(prompts, [params] * clients))
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    ms = 1e3 * cpu / tokens
    return {
        "cpu_ms_per_token": {"outside": 0.0, "replica": ms, "ray": 0.0, "total": ms}
        | dict.fromkeys(PARTS, 0.0),
        "chunks_per_token": None,
        "tokens_per_s": tokens / wall,
        "itl_p50_ms": None,
        "itl_p99_ms": None,
    }


# ---------------------------------------------------------------------- report
def table(results: dict[str, dict[str, dict[str, Any]]]) -> str:
    head = (
        f"{'system':<10} {'clients':>7} | {'total':>6} {'outside':>7} ({'ingress':>7} "
        f"{'proxy':>6}) {'replica':>7} {'ray':>5} | {'chunks/tok':>10} {'tok/s':>7} "
        f"{'ITL p50':>8} {'p99':>7}"
    )
    lines = ["CPU-ms per token delivered, by group (ingress and proxy: parts of outside)", head]
    for system, by_clients in results.items():
        for clients, r in by_clients.items():
            ms = r["cpu_ms_per_token"]
            chunks = "-" if r["chunks_per_token"] is None else f"{r['chunks_per_token']:.3f}"
            itl50 = "-" if r["itl_p50_ms"] is None else f"{r['itl_p50_ms']:.1f}"
            itl99 = "-" if r["itl_p99_ms"] is None else f"{r['itl_p99_ms']:.1f}"
            lines.append(
                f"{system:<10} {clients:>7} | {ms['total']:>6.3f} {ms['outside']:>7.3f} "
                f"({ms['ingress']:>7.3f} {ms['proxy']:>6.3f}) "
                f"{ms['replica']:>7.3f} {ms['ray']:>5.3f} | {chunks:>10} "
                f"{r['tokens_per_s']:>7.0f} {itl50:>8} {itl99:>7}"
            )
    return "\n".join(lines)


def plot(results: dict[str, dict[str, dict[str, Any]]], path: Path) -> None:
    """Stacked bars: CPU-ms per token by group, per system and client count."""
    fig = Figure(figsize=(9.0, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    labels, bottoms = [], []
    bars = [(s, c, r) for s, by in results.items() for c, r in by.items()]
    x = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    for group in GROUPS:
        heights = np.asarray([r["cpu_ms_per_token"][group] for _, _, r in bars])
        ax.bar(x, heights, bottom=bottom, label=group)
        bottom += heights
    labels = [f"{s}\nc={c}" for s, c, _ in bars]
    bottoms.extend(bottom.tolist())
    ax.set_xticks(x, labels)
    ax.set_ylabel("CPU-ms per token delivered")
    ax.set_title("Streamed tokens: CPU per token by process group (service, floor, engine)")
    ax.legend()
    fig.savefig(path, dpi=110)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    p.add_argument("--out", default=str(HERE / "results" / "stream"), help="output folder")
    p.add_argument(
        "--clients", default="1,16,64", help="comma list of streaming client counts [%(default)s]"
    )
    p.add_argument("--requests", type=int, default=4, help="completions per client [%(default)s]")
    p.add_argument("--tokens", type=int, default=64, help="tokens per completion [%(default)s]")
    p.add_argument("--port", type=int, default=8144, help="Serve proxy port [%(default)s]")
    p.add_argument("--ray-cpus", type=int, default=12, help="logical CPUs of the local Ray")
    p.add_argument(
        "--systems", default="service,floor,engine", help="which systems to run [%(default)s]"
    )
    p.add_argument(
        "--stream-intervals",
        default="1,8",
        help="the service's stream_interval values to run, comma list [%(default)s]",
    )
    args = p.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",") if c.strip()]
    args.systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    if bad := set(args.systems) - {"service", "floor", "engine"}:
        p.error(f"unknown system(s) {sorted(bad)}; choose from service, floor, engine")
    if not args.clients or min(args.clients) < 1:
        p.error(f"--clients must be counts >= 1, got {args.clients}")
    args.stream_intervals = [int(n) for n in args.stream_intervals.split(",") if n.strip()]
    if not args.stream_intervals or min(args.stream_intervals) < 1:
        p.error(f"--stream-intervals must be counts >= 1, got {args.stream_intervals}")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    import ray
    from ray import serve

    from marconi_ray.serve.app import build_app, shutdown_app, start_actors
    from marconi_ray.serve.config import ServeConfig
    from marconi_ray.serve.settings import NAMESPACE

    cfg = ServeConfig(model="tiny", port=args.port, max_batch=max(args.clients))
    settings = replace(cfg.to_settings(), app_name="stream")
    model_dir, out = Path(settings.model_dir), Path(args.out)
    rng = np.random.default_rng(0)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    raw: dict[str, Any] = {}
    if "engine" in args.systems:
        results["engine"] = {
            c: engine_run(model_dir, c, args.requests, args.tokens, rng) for c in args.clients
        }
    base = f"http://127.0.0.1:{args.port}"
    quiet = {"include_dashboard": False, "log_to_driver": False}
    ray.init(address="local", num_cpus=args.ray_cpus, namespace=NAMESPACE, **quiet)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        if "floor" in args.systems:
            actor = start_floor()
            serve.run(floor_app(), name=FLOOR_APP, route_prefix="/floor")
            url = f"{base}/floor/v1/completions"
            raw["floor"] = {
                c: asyncio.run(stream_load(url, c, args.requests, args.tokens, rng))
                for c in args.clients
            }
            serve.delete(FLOOR_APP)
            ray.kill(actor)
        for interval in args.stream_intervals if "service" in args.systems else ():
            served = replace(settings, stream_interval=interval)
            start_actors(served)
            try:
                serve.run(build_app(served), name=served.app_name, route_prefix="/")
                url = f"{base}/v1/completions"
                raw["service" if interval == 1 else f"service/{interval}"] = {
                    c: asyncio.run(stream_load(url, c, args.requests, args.tokens, rng))
                    for c in args.clients
                }
            finally:
                shutdown_app(served)
    finally:
        serve.shutdown()
        ray.shutdown()
    for system, by_clients in raw.items():
        results[system] = {c: summarize(r) for c, r in by_clients.items()}
    services = sorted((s for s in results if s.startswith("service")), key=len)
    order = [*services, *(s for s in ("floor", "engine") if s in results)]
    results = {s: results[s] for s in order}
    print(table(results))
    out.mkdir(parents=True, exist_ok=True)
    report = {
        "config": {k: v for k, v in vars(args).items()},
        "machine": run_info.machine(("ray", "torch", "fastapi", "httpx", "marconi-ray")),
        "results": results,
        "raw_cpu_s": {s: {c: r["cpu_s"] for c, r in by.items()} for s, by in raw.items()},
    }
    (out / "stream.json").write_text(json.dumps(report, indent=2, default=str))
    plot(results, out / "stream.png")
    print(f"wrote {out / 'stream.json'} and {out / 'stream.png'}")
    return report


if __name__ == "__main__":
    main()
