"""The serving path against its floors (issue "Serving at GPU speed: take the orchestration
out of the hot path"), measured side by side in one run on one local Ray instance.

Systems:
- F, the bare-Ray-Serve floor built here: a FastAPI ingress deployment (route /floor) that
  per request awaits `plan` on a plain Ray actor, calls a second deployment (through a
  DeploymentHandle) that returns at once, then awaits `commit` on the actor: the topology
  of the service (ingress -> coordinator actor -> replica deployment) with no work in it.
- S, the service: the `tiny` preset with `ServeConfig`'s defaults (1 replica, tp 1, marconi)
  but max_batch = CONCURRENCY (unless --max-batch), deployed with `start_actors` +
  `serve.run(build_app(...))` at route / of the same HTTP proxy (127.0.0.1:PORT).
- E, the in-process `Engine` on the same model folder (torch one thread, the same
  max_batch: at c=16 both decode all 16 requests together).
Every prompt is fresh random text (no prefix-cache hit anywhere); the byte tokenizer makes
a 200-character prompt 200 tokens. F and S run in alternating rounds; E runs first, alone.

Workloads and targets:
(a) 1-token completions (200-char prompt, temperature 0, not streamed): latency p50/p95 of
    sequential requests, and req/s of 16 closed-loop clients (httpx.AsyncClient), F and S;
    E's `generate` time as a reference. Target: S <= 1.25x F latency, S >= 0.8x F req/s.
(b) 64-token greedy decodes (ignore_eos): generated tokens/s with 1 client (sequential
    requests, tokens / total time) and with 16 (bursts of 16 requests, median), S and E
    (`generate`, `generate_many`). Target: S >= 0.8x E at both.
(c) TTFT (streamed, first chunk with text) of a short request sent while a ~16k-token prompt
    is prefilled on the same replica (DELAY x the long request's idle latency after it),
    next to the idle TTFT. Served from a copy of the tiny folder allowing 32768 positions
    (NemotronH attention has no RoPE: the weights stay valid). Target: <= 2x idle. Run
    with the default step budget (max_batch_tokens 2048, sized for a GPU) and again with
    --ttft-batch-tokens (256), sized for this CPU: here a 2048-token chunk at 8-16k depth
    is 0.3-0.45 s of attention arithmetic, and a short request waits for the chunk that
    is running when it arrives.
(d) The coordinator alone: a real `CacheCoordinator` actor with one registered (fake)
    replica, filled by plan/commit to >= 10,000 tree nodes (bench_serve's workload:
    documents x continuations plus multi-turn chains), then 2,000-token prompts that cut a
    chain at a random depth, planned and committed by 8 concurrent callers (plans through
    the ingress's PlanBatcher, commits coalesced into commit_many as a replica's step
    sends them): pairs/s and p50/p99 per pair. Target: >= 1,000 pairs/s, p99 < 10 ms.

Writes OUT/overhead.json (raw figures, machine, versions, commit) and OUT/overhead.png
(bars per workload with the target lines); prints the table of figures, ratios, verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import run_info
import torch
from bench_serve import REPLICA, FakeWorker, Workload, fill_cache, long_context_copy, timed_prompts
from fastapi import FastAPI, Request  # module level: FastAPI resolves the annotations
from fastapi.responses import JSONResponse
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from marconi_ray.protocol.sampling import SamplingParams

SECTIONS = ("latency", "decode", "ttft", "coordinator", "engine")
HERE = Path(__file__).resolve().parent
FLOOR_APP, FLOOR_ACTOR = "overhead-floor", "overhead-floor-actor"
LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz     .,"))


def dist(seconds: list[float]) -> dict[str, Any]:
    """n, mean, p50, p95, p99 and every value, in ms."""
    a = 1e3 * np.asarray(seconds)
    q = {f"p{p}_ms": float(np.percentile(a, p)) for p in (50, 95, 99)}
    return {"n": len(a), "mean_ms": float(a.mean()), **q, "raw_ms": np.round(a, 3).tolist()}


# ---------------------------------------------------------------------- the floor (F)
def start_floor() -> Any:
    """The floor's plain actor (a local class: pickled by value, no import of this file)."""
    import ray

    from marconi_ray.serve.settings import NAMESPACE

    class FloorActor:
        def plan(self, prompt: str) -> int:
            return len(prompt)

        def commit(self, request: int) -> int:
            return request

    opts = {"name": FLOOR_ACTOR, "namespace": NAMESPACE, "num_cpus": 0}
    return ray.remote(FloorActor).options(**opts).remote()


def floor_app() -> Any:
    """FastAPI ingress -> actor.plan, FloorReplica.generate (returns at once), actor.commit;
    CPU and queue options as the service's ingress and replica."""
    import ray
    from ray import serve

    from marconi_ray.serve.app import INGRESS_MAX_ONGOING
    from marconi_ray.serve.settings import NAMESPACE

    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    one_cpu = {"num_cpus": 1}

    @serve.deployment(name="FloorReplica", ray_actor_options=one_cpu, max_ongoing_requests=64)
    class FloorReplica:
        async def generate(self, request: int) -> int:
            return request

    @serve.deployment(ray_actor_options=one_cpu, max_ongoing_requests=INGRESS_MAX_ONGOING)
    @serve.ingress(api)
    class FloorIngress:
        def __init__(self, replica: Any) -> None:
            self.replica = replica
            self.actor = ray.get_actor(FLOOR_ACTOR, namespace=NAMESPACE)

        @api.post("/v1/completions")
        async def completions(self, request: Request) -> JSONResponse:
            assert isinstance(request, Request)  # pickled by value: keeps the name resolvable
            body = json.loads(await request.body())
            rid = await self.actor.plan.remote(body["prompt"])
            await self.actor.commit.remote(await self.replica.generate.remote(rid))
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1}
            choice = {"index": 0, "text": " ", "finish_reason": "length"}
            return JSONResponse({"id": "cmpl-floor", "choices": [choice], "usage": usage})

    return FloorIngress.bind(FloorReplica.bind())


# ---------------------------------------------------------------------- CPU accounting
def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by each Ray process of this machine and by
    this driver (the HTTP clients), read from /proc; a process is named by its title
    without the method it runs (`ray::CacheCoordinator.plan_many` -> `CacheCoordinator`)
    or by its command (raylet, gcs_server). Empty where /proc is missing."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            pid = stat.parent.name
            title = (stat.parent / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if pid == str(os.getpid()):
            name = "driver (HTTP clients)"
        elif title.startswith("ray::"):
            name = title[5:].split(".")[0].split(" ")[0]
        elif any(k in title for k in ("raylet", "gcs_server")):
            name = "raylet" if "raylet" in title else "gcs_server"
        else:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        out[name] = out.get(name, 0.0) + cpu
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Per process: CPU seconds used between two `cpu_seconds` readings (>= 1 ms only)."""
    used = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: v for k, v in sorted(used.items(), key=lambda kv: -kv[1]) if v >= 1e-3}


# ---------------------------------------------------------------------- HTTP load
class Load:
    """The client side: fresh random prompts, one-shot and streamed completions."""

    def __init__(self, args: argparse.Namespace, rng: np.random.Generator) -> None:
        self.rng, self.chars, self.c = rng, args.prompt_chars, args.concurrency
        self.http: httpx.AsyncClient

    def run(self, section: Callable[..., Any], *args: Any) -> Any:
        """`await section(*args)` in a fresh event loop, with a client of its own (pooled
        connections belong to one loop)."""
        n = 4 * self.c
        limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)

        async def go() -> Any:
            async with httpx.AsyncClient(limits=limits, timeout=600.0) as self.http:
                return await section(*args)

        return asyncio.run(go())

    def prompts(self, n: int, chars: int | None = None) -> list[str]:
        return ["".join(self.rng.choice(LETTERS, chars or self.chars)) for _ in range(n)]

    async def post(self, url: str, prompt: str, n: int) -> float:
        """One non-streamed completion of `n` tokens (checked); its latency."""
        body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "temperature": 0}
        t0 = time.perf_counter()
        r = await self.http.post(url, json=body | {"ignore_eos": True})
        dt = time.perf_counter() - t0
        r.raise_for_status()
        assert r.json()["usage"]["completion_tokens"] == n, (url, r.json())
        return dt

    async def ttft(self, url: str, prompt: str, n: int = 8) -> float:
        """Time to the first SSE chunk carrying text (the stream is read to its end)."""
        body = {"model": "tiny", "prompt": prompt, "max_tokens": n, "stream": True}
        ttft, t0 = None, time.perf_counter()
        async with self.http.stream("POST", url, json=body | {"temperature": 0}) as r:
            r.raise_for_status()
            async for line in r.aiter_lines():
                data = json.loads(line[6:]) if line.startswith("data: {") else {}
                if ttft is None and (data.get("choices") or [{}])[0].get("text"):
                    ttft = time.perf_counter() - t0
        assert ttft is not None, f"{url}: no text in the stream"
        return ttft

    async def seq(self, url: str, k: int, n: int, desc: str) -> list[float]:
        """`k` requests one after another; their latencies."""
        bar = tqdm(self.prompts(k), desc=desc, disable=None, leave=False)
        return [await self.post(url, p, n) for p in bar]

    async def conc(self, url: str, k: int, n: int, desc: str) -> float:
        """`k` requests from `concurrency` closed-loop clients; the wall time."""
        todo, bar = iter(self.prompts(k)), tqdm(total=k, desc=desc, disable=None, leave=False)

        async def user() -> None:
            for p in todo:
                await self.post(url, p, n)
                bar.update()

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(self.c)))
        bar.close()
        return time.perf_counter() - t0


# ---------------------------------------------------------------------- sections
def engine_bench(args: argparse.Namespace, model_dir: Path, load: Load) -> dict[str, Any]:
    """E: 1-token `generate` times (a); decode tokens/s at 1 and 16 (b)."""
    from marconi_ray.engine.engine import Engine

    batch = args.max_batch or args.concurrency
    engine = Engine(model_dir, system="marconi", cache_bytes=10**9, max_batch=batch)
    enc, k, out = engine.tokenizer.encode, args.gen_tokens, {}
    one, dec = (SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (1, k))
    for p in load.prompts(8):
        engine.generate(enc(p), one)
    if "latency" not in args.skip:
        times = []
        for p in tqdm(load.prompts(args.requests), desc="E 1-token", disable=None):
            t0 = time.perf_counter()
            engine.generate(enc(p), one)
            times.append(time.perf_counter() - t0)
        out["one_token"] = dist(times)
    if "decode" not in args.skip:
        t0 = time.perf_counter()
        for p in tqdm(load.prompts(args.decode_requests), desc="E decode c=1", disable=None):
            assert len(engine.generate(enc(p), dec).tokens) == k
        out["decode_c1_tok_s"] = args.decode_requests * k / (time.perf_counter() - t0)
        bursts = []
        for _ in tqdm(range(args.bursts), desc="E decode c=16", disable=None):
            batch = [enc(p) for p in load.prompts(args.concurrency)]
            t0 = time.perf_counter()
            res = engine.generate_many(batch, [dec] * len(batch))
            bursts.append(sum(len(r.tokens) for r in res) / (time.perf_counter() - t0))
        out |= {"decode_c16_tok_s": float(np.median(bursts)), "decode_c16_bursts_tok_s": bursts}
    return out


async def http_bench(args: argparse.Namespace, urls: dict[str, str], load: Load) -> dict[str, Any]:
    """(a) for F and S in alternating rounds; (b) for S."""
    lat: dict[str, list[float]] = {k: [] for k in urls}
    wall, sent = dict.fromkeys(urls, 0.0), dict.fromkeys(urls, 0)
    cpu: dict[str, dict[str, float]] = {k: {} for k in urls}
    n_seq = max(1, args.requests // args.rounds)
    n_conc = max(args.concurrency, args.requests // args.rounds)
    out: dict[str, Any] = {}
    for name, url in urls.items():  # warm-up: code paths, connections, the router
        await load.seq(url, 4, 1, f"warm {name}")
        await load.conc(url, 2 * args.concurrency, 1, f"warm {name}")
    if "latency" not in args.skip:
        for rnd in range(args.rounds):
            for name in list(urls)[:: 1 if rnd % 2 == 0 else -1]:
                lat[name] += await load.seq(urls[name], n_seq, 1, f"{name} c=1 round {rnd}")
                before = cpu_seconds()
                wall[name] += await load.conc(urls[name], n_conc, 1, f"{name} c=16 round {rnd}")
                for proc, used in cpu_delta(before, cpu_seconds()).items():
                    cpu[name][proc] = cpu[name].get(proc, 0.0) + used
                sent[name] += n_conc
        out["one_token"] = {k: dist(v) for k, v in lat.items()}
        out["req_s"] = {k: sent[k] / wall[k] for k in urls}
        # where the time goes at c=16: CPU ms per request, per process (2 cores shared)
        out["cpu_ms_per_request_c16"] = {
            k: {p: 1e3 * v / sent[k] for p, v in sorted(cpu[k].items(), key=lambda kv: -kv[1])}
            for k in urls
        }
    if "decode" not in args.skip:
        url, k = urls["service"], args.gen_tokens
        seq = await load.seq(url, args.decode_requests, k, "S decode c=1")
        bursts = []
        for _ in tqdm(range(args.bursts), desc="S decode c=16", disable=None):
            bursts.append(args.concurrency * k / await load.conc(url, args.concurrency, k, "burst"))
        out |= {"decode_c1_tok_s": len(seq) * k / sum(seq), "decode_c1_latency": dist(seq)}
        out |= {"decode_c16_tok_s": float(np.median(bursts)), "decode_c16_bursts_tok_s": bursts}
    return out


async def ttft_bench(args: argparse.Namespace, url: str, load: Load) -> dict[str, Any]:
    """(c): idle TTFT of short requests; TTFT of one sent while a long prompt prefills."""
    for p in load.prompts(3):
        await load.ttft(url, p)
    alone = await load.post(url, load.prompts(1, args.long_tokens)[0], 1)
    delay = args.ttft_delay * alone
    idle, during, long_s, overlapped = [], [], [], []
    for _ in tqdm(range(args.long_reps), desc="TTFT reps", disable=None):
        idle += [await load.ttft(url, p) for p in load.prompts(3)]
        long = asyncio.ensure_future(load.post(url, load.prompts(1, args.long_tokens)[0], 1))
        await asyncio.sleep(delay)
        during.append(await load.ttft(url, load.prompts(1)[0]))
        overlapped.append(not long.done())  # the short one ended before the long one
        long_s.append(await long)
    out = {"long_tokens": args.long_tokens, "long_alone_s": alone, "delay_s": delay}
    out |= {"idle": dist(idle), "during_long_prefill": dist(during), "long_latency_s": long_s}
    return out | {"short_done_before_long": overlapped}


def coordinator_bench(args: argparse.Namespace, model_dir: Path) -> dict[str, Any]:
    """(d): fill a real CacheCoordinator actor, then plan + commit from `callers` callers:
    plans through the ingress's `PlanBatcher`, commits through a `Coalescer` over
    `commit_many` (a replica commits what finished in one step in one call), each with
    one call in flight, so what arrives meanwhile leaves together."""
    import ray

    from marconi_ray.engine.model.loader import load_model
    from marconi_ray.engine.worker import Worker
    from marconi_ray.serve.app import start_coordinator
    from marconi_ray.serve.ingress.coalescer import Coalescer
    from marconi_ray.serve.ingress.plan_batcher import PlanBatcher
    from marconi_ray.serve.settings import ServeSettings

    store = Worker(load_model(model_dir), 1).store
    # the fake replica sends no heartbeats: a long lease keeps it registered
    settings = ServeSettings(str(model_dir), "tiny", cache_bytes=10**15, lease_s=1e6)
    coord = start_coordinator(replace(settings, app_name="overhead-coordinator"))
    try:
        ray.get(coord.register_replica.remote(REPLICA, store.kv_bytes_per_token, store.state_bytes))
        work, worker = Workload(args.workload), FakeWorker()

        def plan(prompt: np.ndarray, params: SamplingParams) -> Any:
            return ray.get(coord.plan.remote(prompt, params, time.time())).order

        t0 = time.perf_counter()
        acked = [0]  # the fake replica acknowledges what it was sent

        def commit(done: Any) -> None:
            answer = ray.get(coord.commit.remote(REPLICA, done, acked[0]))
            acked[0] = max(acked[0], answer.last)

        histories = fill_cache(plan, commit, work, worker, "fill the coordinator")
        fill_s, nodes = time.perf_counter() - t0, int(ray.get(coord.check_invariants.remote()))
        if nodes < args.min_nodes:
            raise RuntimeError(f"the coordinator's tree has {nodes} nodes < {args.min_nodes}")
        prompts = timed_prompts(work, histories)
        params = SamplingParams(max_tokens=work.out_len, temperature=0.0, ignore_eos=True)
        pairs, hits, bar = [], [], tqdm(total=len(prompts), desc="plan+commit", disable=None)

        batcher = PlanBatcher(coord)  # plans coalesce as the ingress's do

        async def commit_many(done: list[Any]) -> list[None]:
            answer = await coord.commit_many.remote(REPLICA, done, acked[0])
            acked[0] = max(acked[0], answer.last)
            return [None] * len(done)

        commits: Coalescer[Any, None] = Coalescer(commit_many)  # as a replica's step does

        async def caller(todo: Any) -> None:
            for p in todo:
                t0 = time.perf_counter()
                d = await batcher.plan(p, params, time.time())
                t1 = time.perf_counter()
                done = worker.finish(d.order, work.output(p))  # driver-side, not timed
                t2 = time.perf_counter()
                await commits.submit(done)
                pairs.append(t1 - t0 + time.perf_counter() - t2)
                hits.append(d.order.hit_len)
                bar.update()

        async def run() -> float:
            todo, t0 = iter(prompts), time.perf_counter()
            await asyncio.gather(*(caller(todo) for _ in range(args.callers)))
            return time.perf_counter() - t0

        wall = asyncio.run(run())
        bar.close()
        fill_n = len(work.fill) + len(work.chain_seeds) * work.chain_turns
        out = {"callers": args.callers, "prompt_tokens": work.prompt_tokens, "fill": fill_n}
        out |= {"fill_s": fill_s, "nodes_after_fill": nodes, "pairs": len(pairs), "wall_s": wall}
        out |= {"nodes_after": int(ray.get(coord.check_invariants.remote()))}
        out |= {"pairs_s": len(pairs) / wall, "pair": dist(pairs), "mean_hit_tokens": np.mean(hits)}
        out |= {"plan_calls": batcher.calls, "plans_per_call": batcher.planned / batcher.calls}
        out |= {"commit_calls": commits.calls, "commits_per_call": commits.items / commits.calls}
        return out
    finally:
        ray.kill(coord)


# ---------------------------------------------------------------------- verdicts, table, plot
COLUMNS = ("workload", "metric", "floor", "service", "engine", "ratio", "target", "met", "line")


def verdicts(r: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per judged figure: F, S, E (those that apply), the ratio, the target, the
    verdict and `line`, the target as an absolute value (for the plot)."""
    a, e, rows = r.get("http", {}), r.get("engine", {}), []
    if "floor" in a.get("one_token", {}):
        ot = a["one_token"]
        for q in ("p50_ms", "p95_ms"):
            f, s, ref = ot["floor"][q], ot["service"][q], e.get("one_token", {}).get(q)
            what = f"1-token latency {q[:3]} ms, c=1"
            rows.append(("a", what, f, s, ref, s / f, "S/F <= 1.25", s / f <= 1.25, 1.25 * f))
        f, s = a["req_s"]["floor"], a["req_s"]["service"]
        row = ("a", "1-token req/s, c=16", f, s, None, s / f, "S/F >= 0.8", s / f >= 0.8, 0.8 * f)
        rows.append(row)
    for c in ("1", "16"):
        if (k := f"decode_c{c}_tok_s") in a and k in e:
            s, x = a[k], e[k]
            what = f"{r['config']['gen_tokens']}-token decode tok/s, c={c}"
            rows.append(("b", what, None, s, x, s / x, "S/E >= 0.8", s / x >= 0.8, 0.8 * x))
    for key in ("ttft", "ttft_fine"):
        if t := r.get(key):
            i, d = t["idle"]["p50_ms"], t["during_long_prefill"]["p50_ms"]
            steps = f", {t['max_batch_tokens']}-token steps" if "max_batch_tokens" in t else ""
            what = f"TTFT p50 ms: idle (F col), in prefill (S){steps}"
            rows.append(("c", what, i, d, None, d / i, "S/idle <= 2", d / i <= 2, 2 * i))
    if c := r.get("coordinator"):
        n, p = c["pairs_s"], c["pair"]["p99_ms"]
        what = f"coordinator pairs/s, {c['callers']} callers"
        rows.append(("d", what, None, n, None, n / 1e3, ">= 1,000/s", n >= 1e3, 1e3))
        what = f"coordinator pair p99 ms (p50 {c['pair']['p50_ms']:.2f})"
        rows.append(("d", what, None, p, None, p / 10, "< 10 ms", p < 10, 10.0))
    return [dict(zip(COLUMNS, row, strict=True)) for row in rows]


def table(rows: list[dict[str, Any]]) -> str:
    def f(v: Any) -> str:
        return "-" if v is None else f"{v:,.2f}" if v < 100 else f"{v:,.0f}"

    head = f"   {'figure':44} {'floor':>8} {'service':>8} {'engine':>8} {'ratio':>7}  target"
    lines = [head, "-" * (len(head) + 20)]
    for x in rows:
        cells = " ".join(f"{f(x[k]):>8}" for k in ("floor", "service", "engine"))
        verdict = f"{x['target']:12} {'met' if x['met'] else 'MISSED'}"
        lines.append(f"{x['workload']}  {x['metric']:44} {cells} {x['ratio']:>6.2f}x  {verdict}")
    return "\n".join(lines)


def cpu_table(r: dict[str, Any]) -> str:
    """(a) at c=16: CPU ms per request of each process, per system (the profile of where
    the time goes; the machine has `cpu_count` cores for all of them)."""
    cpu = r.get("http", {}).get("cpu_ms_per_request_c16")
    if not cpu:
        return ""
    lines = ["", "CPU ms per request at c=16 (1-token), by process:"]
    for system, procs in cpu.items():
        parts = ", ".join(f"{p} {ms:.2f}" for p, ms in procs.items())
        lines.append(f"  {system}: total {sum(procs.values()):.2f} = {parts}")
    return "\n".join(lines) + "\n"


def plot(r: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per judged figure: its bars (floor, service, engine) and the target line."""
    fig = Figure(figsize=(4 * min(4, len(rows)), 3.4 * ((len(rows) + 3) // 4)))
    FigureCanvasAgg(fig)
    for i, row in enumerate(rows):
        ax = fig.add_subplot((len(rows) + 3) // 4, min(4, len(rows)), i + 1)
        names = {"c": ("idle", "in prefill"), "d": ("", "coordinator")}.get(
            row["workload"], COLUMNS[2:5]
        )
        vals = {n: row[k] for n, k in zip(names, COLUMNS[2:5], strict=False) if row[k]}
        bars = ax.bar(list(vals), list(vals.values()), color=[f"C{names.index(n)}" for n in vals])
        for b, v in zip(bars, vals.values(), strict=True):
            xy = (b.get_x() + b.get_width() / 2, b.get_height())
            ax.annotate(f"{v:,.1f}", xy, ha="center", va="bottom", fontsize=8)
        ax.axhline(row["line"], color="k", ls="--", lw=1, label=f"target {row['target']}")
        ax.set_yscale("log" if row["workload"] == "c" else "linear")
        verdict = "met" if row["met"] else "MISSED"
        ax.set_title(f"({row['workload']}) {row['metric']}: {verdict}", fontsize=8)
        ax.margins(y=0.25)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    quick = " [--quick]" if r["quick"] else ""
    fig.suptitle(f"Serving path vs floors: tiny NemotronH, CPU, {os.cpu_count()} cores{quick}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------- driver
def machine() -> dict[str, Any]:
    return run_info.machine(("ray", "torch", "fastapi", "httpx", "numpy", "marconi-ray"))


OPTIONS = (  # name, type, default, help
    ("requests", int, 300, "(a) requests per system at c=1 and again at c=16; E's 1-token runs"),
    ("rounds", int, 3, "(a) alternating F/S rounds the requests are split over"),
    ("concurrency", int, 16, "clients of the c=16 figures of (a) and (b)"),
    ("prompt_chars", int, 200, "characters (= tokens) of each short prompt"),
    ("gen_tokens", int, 64, "(b) tokens decoded per request"),
    ("decode_requests", int, 30, "(b) sequential requests at c=1"),
    ("bursts", int, 8, "(b) bursts of CONCURRENCY requests at c=16 (median reported)"),
    ("long_tokens", int, 16_000, "(c) tokens of the long prompt"),
    ("long_reps", int, 5, "(c) long prefills, each with a short request sent during it"),
    ("ttft_delay", float, 0.3, "(c) send the short request this x the long one's idle latency"),
    ("pairs", int, 4000, "(d) timed plan+commit pairs"),
    ("callers", int, 8, "(d) concurrent callers"),
    ("min_nodes", int, 10_000, "(d) tree nodes required after the fill"),
    ("port", int, 8143, "HTTP port of the Serve proxy on 127.0.0.1"),
    ("ray_cpus", int, 12, "logical CPUs of the local Ray"),
    ("max_batch", int, 0, "max_batch of the service and of E (0: CONCURRENCY)"),
    ("max_batch_tokens", int, 0, "the service's max_batch_tokens (0: ServeConfig's default)"),
    ("ttft_batch_tokens", int, 256, "(c) measured again with this max_batch_tokens (0: skip)"),
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    fmt = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=fmt)
    p.add_argument("--out", default=str(HERE / "results" / "overhead"), help="output folder")
    for name, typ, default, text in OPTIONS:
        p.add_argument(
            f"--{name.replace('_', '-')}", type=typ, default=default, help=f"{text} [%(default)s]"
        )
    p.add_argument(
        "--skip", default="", help=f"comma-separated sections to omit: {', '.join(SECTIONS)}"
    )
    quick = "smoke run: 24 requests in 1 round, 4 decodes, 1 burst, 1 long prefill, 200 pairs"
    p.add_argument("--quick", action="store_true", help=f"{quick} on a 300-node tree")
    args = p.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if bad := args.skip - set(SECTIONS):
        p.error(f"unknown section(s) {sorted(bad)}; choose from {list(SECTIONS)}")
    docs, conts = 250, 41  # with 8 chains x 12 turns (~2k tokens each): ~10,900 nodes
    if args.quick:
        small = dict(requests=24, rounds=1, decode_requests=4, bursts=1, long_reps=1, pairs=200)
        vars(args).update(small, min_nodes=300)
        docs, conts = 20, 12
    w = dict(documents=docs, continuations=conts, doc_tokens=256, cont_tokens=32, chains=8)
    w |= dict(chain_turns=12, turn_tokens=150, out_tokens=16, prompt_tokens=2000)
    w["requests"] = args.pairs
    args.workload = argparse.Namespace(**w)
    return args


def deploy(s: Any, section: Callable[[], Any]) -> Any:
    """Run `section` against the service deployed with settings `s`, then tear it down."""
    import ray
    from ray import serve

    from marconi_ray.serve.app import build_app, shutdown_app, start_actors
    from marconi_ray.serve.settings import NAMESPACE

    try:
        start_actors(s)
        serve.run(build_app(s), name=s.app_name, route_prefix="/")
        coordinator = ray.get_actor(s.coordinator_name, namespace=NAMESPACE)
        while len(ray.get(coordinator.replicas.remote())) < s.replicas:
            time.sleep(0.2)
        return section()
    finally:
        shutdown_app(s)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM tears down as Ctrl-C
    import ray
    from ray import serve

    from marconi_ray.cli.serve import cpus_needed
    from marconi_ray.serve.config import ServeConfig
    from marconi_ray.serve.settings import NAMESPACE

    budget = {"max_batch_tokens": args.max_batch_tokens} if args.max_batch_tokens else {}
    batch = args.max_batch or args.concurrency
    cfg = ServeConfig(model="tiny", port=args.port, max_batch=batch, **budget)
    settings = replace(cfg.to_settings(), app_name="overhead")
    tiny, out, load = Path(settings.model_dir), Path(args.out), Load(args, np.random.default_rng(0))
    report: dict[str, Any] = {"quick": args.quick, "skip": sorted(args.skip), "machine": machine()}
    report["config"] = {k: v for k, v in vars(args).items() if k not in ("skip", "workload")}
    report["config"] |= {"model_dir": str(tiny), "service_max_batch": settings.max_batch}
    report["config"]["service_max_batch_tokens"] = settings.max_batch_tokens
    report["config"]["workload_d"] = vars(args.workload)
    start, ab = time.perf_counter(), {"latency", "decode"} - args.skip
    base = f"http://127.0.0.1:{args.port}"
    try:
        if "engine" not in args.skip and ab:
            report["engine"] = engine_bench(args, tiny, load)
        quiet = {"include_dashboard": False, "log_to_driver": False}
        cpus = max(args.ray_cpus, cpus_needed(settings) + 2)
        ray.init(address="local", num_cpus=cpus, namespace=NAMESPACE, **quiet)
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        with tempfile.TemporaryDirectory() as tmp:
            long_dir = long_context_copy(tiny, Path(tmp) / "tiny-long")  # 32768 positions
            if "coordinator" not in args.skip:
                report["coordinator"] = coordinator_bench(args, long_dir)
            if ab:
                urls = {"service": f"{base}/v1/completions"}
                if floor := "latency" not in args.skip:
                    floor_actor = start_floor()
                    serve.run(floor_app(), name=FLOOR_APP, route_prefix="/floor")
                    urls = {"floor": f"{base}/floor/v1/completions", **urls}
                report["http"] = deploy(settings, lambda: load.run(http_bench, args, urls, load))
                if floor:
                    serve.delete(FLOOR_APP)
                    ray.kill(floor_actor)
            if "ttft" not in args.skip:
                long = replace(settings, app_name="overhead-long", model_dir=str(long_dir))
                url = f"{base}/v1/completions"
                report["ttft"] = deploy(long, lambda: load.run(ttft_bench, args, url, load))
                report["ttft"]["max_batch_tokens"] = long.max_batch_tokens
                if fine := args.ttft_batch_tokens:
                    long = replace(long, app_name="overhead-fine", max_batch_tokens=fine)
                    run = deploy(long, lambda: load.run(ttft_bench, args, url, load))
                    report["ttft_fine"] = run | {"max_batch_tokens": fine}
    finally:
        if ray.is_initialized():
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
    report["wall_s"] = time.perf_counter() - start
    report["targets"] = rows = verdicts(report)
    out.mkdir(parents=True, exist_ok=True)
    (out / "overhead.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    plot(report, rows, out / "overhead.png")
    print(f"\n{table(rows)}\n{cpu_table(report)}\nwall time {report['wall_s']:.0f} s")
    print(f"wrote {out / 'overhead.json'}, {out / 'overhead.png'}")
    return report


if __name__ == "__main__":
    main()
