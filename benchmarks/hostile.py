"""Hostile clients and long outages, measured in one run against the real service
(the `tiny` preset, 2 replicas, tp 1, local Ray, HTTP on 127.0.0.1:PORT).

Deployments: A = max_batch 4, max_queued_requests 4 (capacity C = replicas x (4 + 4) = 16
requests planned at once), a 2 MB cache per replica, the default lease (30 s), and the
coordinator's journal in a private `redis-server` started here (AOF persistence, password,
a free loopback port) with journal_max_backlog_bytes = --journal-bound: 2 MB, so that the
bound is reached within the outage (the service's default is 64 MiB). (a) runs on a copy of
A of its own (what the drops leave behind stays there); (b), (c) and (d)'s shedding runs on
A; B = A with max_queued_requests = -1 (no shedding) for (d)'s other run.

(a) Dropped streams: --drops streamed requests (max_tokens 3000, ignore_eos), --drop-
    concurrency at a time, alternating /v1/chat/completions and /v1/completions, each cut
    (raw socket closed) at one of four points in rotation: before the response headers,
    right after them, after the first chunk, mid-stream (6 chunks). From the coordinator
    actor's `stats()` (in_flight and reserved, summed over replicas, polled every 0.1 s
    during the drops and 0.05 s after): plans open and bytes reserved 1 s after the last
    drop, and the seconds from the last drop until both are zero for good (a leaked plan
    holds until its lease expires: 30 s + the coordinator's 50% grace). Also the statuses
    the cut streams got before their client left (expected: 200), locked nodes and the
    tree invariants after, and --after-requests normal requests with one shared prompt:
    their statuses, latency and cached tokens (Marconi admits the prompt's state at the
    second request's branch point, so the third and later hit).
(b) /health under big bodies: bursts of --bodies concurrent ~1 MB bodies (a prompt of
    --body-chars non-blank characters: refused by the cheap size bound before tokenizing),
    repeated for --body-min-s; then --bodies bodies of --blank-chars blanks (they pass the
    bound and are tokenized in a worker thread before their 400: the slow case); all under
    the proxy's 1 MiB body limit. While they are in flight a thread polls /health every
    --health-poll-s: p50/p99/max latency next to the idle /health latency, and the
    statuses the bodies got (expected: 400 context_length_exceeded).
(c) Journal during a Redis outage: --journal-clients closed-loop clients (fresh random
    prompts of --journal-prompt-chars tokens, 8 output tokens), Redis up for
    --journal-warm-s, stopped (SIGTERM) for --outage-s while the load goes on, restarted.
    Every second: /health's `journal` (state, backlog_bytes, backlog_records,
    lost_records) and the coordinator process's RSS (/proc/PID/status VmRSS, the pid from
    the actor); every 0.1 s the same journal figures from the actor (the backlog fills in
    well under a second). Reported: peak backlog bytes against the bound, the state
    timeline, the backlog an unbounded journal would have held (records lost x their mean
    size), RSS before / peak during / after the outage, catch-up time (restart -> state ok
    with an empty backlog, polled every 0.1 s) and the errors the clients saw.
(d) Goodput at 2x capacity: first C closed-loop clients for --calib-s: the p50 latency L_C
    of a 32-token completion (200-token fresh prompts) when the service holds exactly what
    it is sized for. SLO = --slo-factor x L_C (1.5; or --slo-s): a request may take 1.5x
    what it takes at the configured capacity, the latency an operator sizing
    max_queued_requests signs up for (on another machine the seconds differ, the rule
    does not). Then 2C closed-loop clients for --goodput-s on A (shedding: a 429 client
    sleeps Retry-After seconds and retries) and on B (no shedding; B gets the same C-client
    warm-up first): goodput (requests answered 200 within the SLO and the window, per
    second), 429s, p50/p95 latency of the served ones, errors, the most plans the
    coordinator held at once (<= C with shedding).

Targets (the table's verdicts): (a) nothing open 1 s after the last drop, released within
1 s, no non-200 stream, the normal requests served and hitting the cache; (b) /health p99
< 500 ms under every burst, every body refused with context_length_exceeded; (c) backlog
<= the bound, RSS growth <= the bound + 16 MB (allocator slack and the cache tree's own
growth; an unbounded backlog would hold far more), catch-up <= 5 s, no client error;
(d) goodput with shedding >= without, no 429 without shedding, <= C plans at once, no
error.

Writes OUT/hostile.json (every figure, machine, versions, git commit) and OUT/hostile.png
(one panel per section); prints the table of headline figures with their targets.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from math import inf
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import run_info
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from redis_process import RedisProcess
from tqdm import tqdm

SECTIONS = ("drops", "health", "journal", "goodput")
HERE = Path(__file__).resolve().parent
DROP_POINTS = ("before headers", "after headers", "after the first chunk", "mid-stream")
MID_STREAM_CHUNKS = 6
LETTERS = np.array(list("abcdefghijklmnopqrstuvwxyz     .,"))
RELEASE_S = 1.0  # the target: a dropped client's plan is released "at once" (~1 s)
HEALTH_P99_MS = 500.0  # /health keeps answering while big bodies are refused
RSS_SLACK_MB = 16.0  # allocator slack and the cache tree's own growth under the load
CATCH_UP_S = 5.0  # Redis back: the journal is ok (snapshot written, backlog empty) within
CLIENT_TIMEOUT_S = 60.0  # per request: a stuck service shows as errors, not as a hang
STATE_COLORS = {"ok": "C2", "degraded": "C1", "lost": "C3", "down": "k"}


def dist(seconds: list[float]) -> dict[str, Any]:
    """n, mean, p50, p95, p99, max (ms); zeros when empty."""
    if not seconds:
        return {"n": 0, "mean_ms": 0.0, "p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    a = 1e3 * np.asarray(seconds, dtype=float)
    q = {f"p{p}_ms": float(np.percentile(a, p)) for p in (50, 95, 99)}
    return {"n": len(a), "mean_ms": float(a.mean()), **q, "max_ms": float(a.max())}


def text(rng: np.random.Generator, chars: int) -> str:
    """Fresh random prose of `chars` characters (the byte tokenizer: ~1 token each)."""
    return "".join(rng.choice(LETTERS, chars)).strip() or "x"


def client(**kw: Any) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    return httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, limits=limits, trust_env=False, **kw)


# ---------------------------------------------------------------------- processes
def actor_pid(actor: Any) -> int:
    """The OS pid of a Ray actor's process (a method run inside it)."""
    import ray

    return int(ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60))


def rss_bytes(pid: int) -> int | None:
    """VmRSS of `pid` from /proc (None when unreadable)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def open_plans(coordinator: Any) -> tuple[int, int]:
    """(plans in flight, bytes reserved), summed over the coordinator's replicas."""
    import ray

    stats = ray.get(coordinator.stats.remote(), timeout=60)
    return sum(s.in_flight for s in stats), sum(s.reserved for s in stats)


class Poller:
    """A thread calling `fn` every `interval` s; `samples` = [(perf_counter, value)]."""

    def __init__(self, fn: Callable[[], Any], interval: float) -> None:
        self.fn, self.interval = fn, interval
        self.samples: list[tuple[float, Any]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-poller", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter(), self.fn()))
            except Exception as exc:  # recorded: a failing probe is a finding
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.interval)

    def __enter__(self) -> Poller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


# ---------------------------------------------------------------------- (a) dropped streams
def request_bytes(path: str, body: dict[str, Any], port: int) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


async def read_until(
    reader: asyncio.StreamReader, marker: bytes, count: int = 1, got: bytearray | None = None
) -> bytes:
    """Read until `marker` was seen `count` times; what arrives is appended to `got`."""
    got = bytearray() if got is None else got
    while got.count(marker) < count:
        chunk = await reader.read(4096)
        if not chunk:
            raise ConnectionError(f"closed before {count} x {marker!r}: {bytes(got[-200:])!r}")
        got += chunk
    return bytes(got)


async def drop_one(port: int, i: int, name: str) -> tuple[str, int | None, str]:
    """Request i, cut at DROP_POINTS[i % 4]; (the point, the HTTP status if seen, the end
    of what was received when the status was not 200)."""
    where = DROP_POINTS[i % len(DROP_POINTS)]
    params = {"max_tokens": 3000, "ignore_eos": True, "temperature": 0.0, "stream": True}
    if (i // len(DROP_POINTS)) % 2 == 0:
        path, body = "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
    else:
        path, body = "/v1/completions", {"prompt": "a long story"}
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    status, got, stage = None, bytearray(), "the response headers"
    try:
        writer.write(request_bytes(path, {"model": name, **body, **params}, port))
        await writer.drain()
        if where != "before headers":
            head = read_until(reader, b"\r\n\r\n", 1, got)
            status = int((await asyncio.wait_for(head, CLIENT_TIMEOUT_S)).split(b" ", 2)[1])
            if status != 200:  # an error is a whole JSON body: read it, then leave
                with contextlib.suppress(TimeoutError, ConnectionError):
                    await asyncio.wait_for(read_until(reader, b"}}", 1, got), 5.0)
            elif where != "after headers":
                count = 1 if where == "after the first chunk" else MID_STREAM_CHUNKS
                stage = f"{count} chunk(s)"
                await asyncio.wait_for(read_until(reader, b"data: ", count, got), CLIENT_TIMEOUT_S)
    except TimeoutError:
        seen = bytes(got[:60]) + b"..." + bytes(got[-60:]) if len(got) > 120 else bytes(got)
        wait = f"waited {CLIENT_TIMEOUT_S:g} s for {stage}"
        raise TimeoutError(f"{where}, {path}: {wait}; received {len(got)} B {seen!r}") from None
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return (
        where,
        status,
        "" if status in (None, 200) else bytes(got[-160:]).decode(errors="replace"),
    )


async def normal_requests(base: str, name: str, n: int) -> list[dict[str, Any]]:
    """n sequential non-streamed completions of one shared prompt (4 tokens each)."""
    prompt = "The prefix cache keeps the states of a shared prompt. " * 5
    out = []
    async with client() as c:
        for _ in range(n):
            body = {"model": name, "prompt": prompt, "max_tokens": 4, "temperature": 0.0}
            t0 = time.perf_counter()
            try:
                r = await c.post(f"{base}/v1/completions", json=body)
            except httpx.HTTPError as exc:
                out.append({"status": type(exc).__name__, "cached_tokens": None})
                continue
            usage = (r.json().get("usage") or {}) if r.status_code == 200 else {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
            latency = time.perf_counter() - t0
            out.append({"status": r.status_code, "cached_tokens": cached, "s": latency})
    return out


def drops_bench(args: argparse.Namespace, coordinator: Any, name: str) -> dict[str, Any]:
    """(a): drop the streams, then watch the coordinator until nothing is open for good."""
    base = f"http://127.0.0.1:{args.port}"
    points: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    errors: list[str] = []
    last = [0.0]

    async def run() -> None:
        todo, bar = iter(range(args.drops)), tqdm(total=args.drops, desc="(a) drops", disable=None)

        async def worker() -> None:
            for i in todo:
                try:
                    where, status, error = await drop_one(args.port, i, name)
                    points[where] += 1
                    statuses[str(status) if status is not None else "not read"] += 1
                    if error and len(errors) < 10:
                        errors.append(f"{where}: {status} {error}")
                except Exception as exc:
                    failures.append(f"drop {i}: {type(exc).__name__}: {exc}")
                last[0] = time.perf_counter()
                bar.update()

        await asyncio.gather(*(worker() for _ in range(args.drop_concurrency)))
        bar.close()

    with Poller(lambda: open_plans(coordinator), 0.1) as during:
        t0 = time.perf_counter()
        asyncio.run(run())
    t_last = last[0]
    samples = [(t - t_last, v) for t, v in during.samples]
    while True:  # until >= 1 s after the last drop with nothing open, or the timeout
        now = time.perf_counter() - t_last
        held = open_plans(coordinator)
        samples.append((now, held))
        if (now >= max(RELEASE_S, 1.0) and held == (0, 0)) or now > args.release_timeout_s:
            break
        time.sleep(0.05)
    after = [(t, v) for t, v in samples if t >= 0]
    at_1s = next((v for t, v in after if t >= 1.0), after[-1][1])
    open_idx = [k for k, (_, v) in enumerate(after) if v != (0, 0)]
    if after[-1][1] != (0, 0):
        released = None
    elif not open_idx:
        released = 0.0
    else:
        released = after[open_idx[-1] + 1][0]
    import ray

    replicas = ray.get(coordinator.replicas.remote())
    locked = sum(ray.get([coordinator.locked_nodes.remote(rid) for rid in replicas]))
    nodes = int(ray.get(coordinator.check_invariants.remote()))  # raises on a violation
    normal = asyncio.run(normal_requests(base, name, args.after_requests))
    cached = [r["cached_tokens"] or 0 for r in normal]
    return {
        "drops": args.drops,
        "concurrency": args.drop_concurrency,
        "drop_wall_s": t_last - t0,
        "points": dict(points),
        "statuses_seen": dict(statuses),
        "non_200_examples": errors,
        "drop_failures": failures[:20],
        "drop_failure_count": len(failures),
        "in_flight_at_1s": at_1s[0],
        "reserved_at_1s": at_1s[1],
        "released_s": released,
        "locked_nodes_after": locked,
        "tree_nodes_checked": nodes,
        "peak_in_flight": max((v[0] for _, v in samples), default=0),
        "timeline": [[round(t, 3), v[0], v[1]] for t, v in samples],
        "after_requests": normal,
        "after_ok": sum(r["status"] == 200 for r in normal),
        "mean_cached_tokens": float(np.mean(cached)) if cached else 0.0,
        "poller_errors": during.errors[:5],
    }


# ---------------------------------------------------------------------- (b) /health, big bodies
def health_latencies(url: str, n: int) -> list[float]:
    out = []
    with httpx.Client(timeout=30, trust_env=False) as c:
        for _ in range(n):
            t0 = time.perf_counter()
            c.get(url)
            out.append(time.perf_counter() - t0)
    return out


async def big_bodies(base: str, body: bytes, n: int, desc: str) -> list[dict[str, Any]]:
    """n concurrent POSTs of `body`; each one's status, error code and seconds."""
    bar = tqdm(total=n, desc=desc, disable=None)

    async def one(c: httpx.AsyncClient) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            r = await c.post(
                f"{base}/v1/completions",
                content=body,
                headers={"Content-Type": "application/json"},
            )
            code = None
            with contextlib.suppress(Exception):
                code = (r.json().get("error") or {}).get("code")
            out = {"status": r.status_code, "code": code}
        except Exception as exc:
            out = {"status": None, "code": f"{type(exc).__name__}: {exc}"}
        bar.update()
        return out | {"s": time.perf_counter() - t0}

    async with client() as c:
        got = await asyncio.gather(*(one(c) for _ in range(n)))
    bar.close()
    return list(got)


def health_bench(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """(b): idle /health, then /health while each kind of big body is in flight (bursts
    of --bodies at once, repeated until --body-min-s passed)."""
    base = f"http://127.0.0.1:{args.port}"
    url = f"{base}/health"
    health_latencies(url, 5)  # warm the connection and the path
    out: dict[str, Any] = {"bodies": args.bodies, "idle": dist(health_latencies(url, 30))}
    kinds = {"refused_by_bound": "x" * args.body_chars, "tokenized": " " * args.blank_chars}
    for kind, prompt in kinds.items():
        body = json.dumps({"model": name, "prompt": prompt, "max_tokens": 1}).encode()
        probe = httpx.Client(timeout=60, trust_env=False)

        def poll(probe: httpx.Client = probe) -> tuple[float, int]:
            t0 = time.perf_counter()
            status = probe.get(url).status_code
            return time.perf_counter() - t0, status

        got: list[dict[str, Any]] = []
        with Poller(poll, args.health_poll_s) as poller:
            t0 = time.perf_counter()
            while not got or time.perf_counter() - t0 < args.body_min_s:
                got += asyncio.run(big_bodies(base, body, args.bodies, f"(b) {kind}"))
            wall = time.perf_counter() - t0
        probe.close()
        # polls sent while bodies were in flight (a poll is stamped when sent)
        inside = [v for t, v in poller.samples if t0 <= t <= t0 + wall]
        counts = Counter(f"{g['status']} {g['code']}" for g in got)
        ok = sum(g["status"] == 400 and g["code"] == "context_length_exceeded" for g in got)
        out[kind] = {
            "body_bytes": len(body),
            "rounds": len(got) // args.bodies,
            "sent": len(got),
            "wall_s": wall,
            "health": dist([lat for lat, _ in inside]),
            "health_non_200": sum(status != 200 for _, status in inside),
            "poller_errors": poller.errors[:5],
            "statuses": dict(counts),
            "expected": ok,
            "body_latency": dist([g["s"] for g in got]),
        }
    return out


# ---------------------------------------------------------------------- (c) Redis outage
def journal_bench(
    args: argparse.Namespace, coordinator: Any, redis: RedisProcess, name: str, bound: int
) -> dict[str, Any]:
    """(c): steady load; Redis stopped for --outage-s; /health's journal and the
    coordinator's RSS every second; catch-up after the restart."""
    base = f"http://127.0.0.1:{args.port}"
    pid = actor_pid(coordinator)
    health = httpx.Client(timeout=30, trust_env=False)
    phase = ["warm"]

    def sample() -> dict[str, Any]:
        t0 = time.perf_counter()
        r = health.get(f"{base}/health")
        latency = time.perf_counter() - t0
        journal = r.json().get("journal", {}) if r.status_code == 200 else {}
        keys = ("state", "backlog_bytes", "backlog_records", "lost_records")
        return (
            {"phase": phase[0], "status": r.status_code, "health_ms": 1e3 * latency}
            | {k: journal.get(k) for k in keys}
            | {"rss": rss_bytes(pid)}
        )

    requests: list[tuple[float, int | str, float]] = []
    marks: dict[str, float] = {}
    catch_up: list[dict[str, Any]] = []

    async def run(t0: float) -> None:
        rng, stop = np.random.default_rng(3), asyncio.Event()

        async def user(c: httpx.AsyncClient) -> None:
            while not stop.is_set():
                body = {"model": name, "prompt": text(rng, args.journal_prompt_chars)}
                body |= {"max_tokens": 8, "temperature": 0.0, "ignore_eos": True}
                start = time.perf_counter()
                try:
                    r = await c.post(f"{base}/v1/completions", json=body)
                    status: int | str = r.status_code
                except Exception as exc:
                    status = f"{type(exc).__name__}: {exc}"
                requests.append((start - t0, status, time.perf_counter() - start))

        async def check(c: httpx.AsyncClient) -> dict[str, Any]:
            r = await c.get(f"{base}/health")
            return r.json().get("journal", {}) if r.status_code == 200 else {}

        total = args.journal_warm_s + args.outage_s + args.journal_after_s
        bar = tqdm(total=round(total), desc="(c) journal", unit="s", disable=None)
        async with client() as c:
            users = [asyncio.ensure_future(user(c)) for _ in range(args.journal_clients)]
            await asyncio.sleep(args.journal_warm_s)
            bar.update(round(args.journal_warm_s))
            phase[0] = "outage"
            marks["stop"] = time.perf_counter() - t0
            await asyncio.to_thread(redis.stop)
            marks["stopped"] = time.perf_counter() - t0
            for _ in range(round(args.outage_s)):
                await asyncio.sleep(1.0)
                bar.update()
            phase[0] = "restart"
            marks["restart"] = time.perf_counter() - t0
            redis.start()  # in this (main) thread: its death signal follows the thread
            marks["answering"] = time.perf_counter() - t0
            restart = time.perf_counter()
            while time.perf_counter() - restart < args.catch_up_timeout_s:
                j = await check(c)
                now = time.perf_counter() - restart
                catch_up.append({"t": now} | {k: j.get(k) for k in ("state", "backlog_records")})
                if j.get("state") == "ok" and j.get("backlog_records") == 0:
                    marks["caught_up"] = time.perf_counter() - t0
                    break
                await asyncio.sleep(0.1)
            phase[0] = "after"
            await asyncio.sleep(args.journal_after_s)
            bar.update(round(args.journal_after_s))
            stop.set()
            await asyncio.gather(*users)
        bar.close()

    import ray

    def probe() -> list[Any]:
        j = ray.get(coordinator.journal_health.remote(), timeout=30)
        return [j["state"], j["backlog_bytes"], j["backlog_records"], j["lost_records"]]

    try:  # /health every second; the journal's figures from the actor every 0.1 s
        with Poller(sample, 1.0) as poller, Poller(probe, 0.1) as fast:
            t0 = time.perf_counter()
            asyncio.run(run(t0))
    finally:
        health.close()
    timeline = [{"t": round(t - t0, 2), **v} for t, v in poller.samples]
    fine = [[round(t - t0, 2), *v] for t, v in fast.samples]
    by_phase = {p: [s for s in timeline if s["phase"] == p] for p in ("warm", "outage", "after")}

    def peak(rows: list[dict[str, Any]], key: str) -> int:
        return max((int(s[key]) for s in rows if s.get(key) is not None), default=0)

    warm_rss = [s["rss"] for s in by_phase["warm"] if s["rss"]]
    errors = [r for r in requests if r[1] != 200]
    queued = [(x[2], x[3]) for x in fine if x[3]]  # (backlog bytes, records) while queueing
    per_record = max(queued)[0] / max(queued)[1] if queued else None
    caught = marks.get("caught_up")
    served = [r for r in requests if r[1] == 200]
    in_outage = [r for r in served if marks["stop"] <= r[0] < marks["restart"]]
    return {
        "bound_bytes": bound,
        "clients": args.journal_clients,
        "prompt_chars": args.journal_prompt_chars,
        "outage_s": args.outage_s,
        "marks": marks,
        "coordinator_pid": pid,
        "requests": len(requests),
        "served": len(served),
        "served_in_outage_per_s": len(in_outage) / max(1e-9, marks["restart"] - marks["stop"]),
        "client_errors": len(errors),
        "client_error_examples": [str(e[1]) for e in errors[:10]],
        "peak_backlog_bytes": max(peak(timeline, "backlog_bytes"), *(x[2] for x in fine), 0),
        "peak_backlog_bytes_health": peak(timeline, "backlog_bytes"),
        "peak_backlog_records": max(peak(timeline, "backlog_records"), *(x[3] for x in fine), 0),
        "peak_lost_records": max(peak(timeline, "lost_records"), *(x[4] for x in fine), 0),
        "fine_timeline": fine,
        "probe_errors": fast.errors[:5],
        "mean_record_bytes": per_record,
        "unbounded_backlog_bytes": None
        if per_record is None
        else max(x[4] * per_record + x[2] for x in fine),
        "states_in_outage": sorted({s["state"] for s in by_phase["outage"] if s["state"]}),
        "first_state_s": {
            st: next((s["t"] - marks["stop"] for s in by_phase["outage"] if s["state"] == st), None)
            for st in ("degraded", "lost")
        },
        "rss_before": int(np.median(warm_rss)) if warm_rss else None,
        "rss_peak_outage": peak(by_phase["outage"], "rss"),
        "rss_after": by_phase["after"][-1]["rss"] if by_phase["after"] else None,
        "catch_up_s": None if caught is None else caught - marks["restart"],
        "catch_up_polls": catch_up,
        "state_after": by_phase["after"][-1]["state"] if by_phase["after"] else None,
        "health_ms": dist([s["health_ms"] / 1e3 for s in timeline]),
        "timeline": timeline,
        "sampler_errors": poller.errors[:5],
    }


# ---------------------------------------------------------------------- (d) goodput
async def closed_loop(
    args: argparse.Namespace, name: str, clients: int, duration: float, desc: str
) -> tuple[list[dict[str, Any]], float]:
    """`clients` closed-loop clients for `duration` s (no new request after it); a 429
    client sleeps Retry-After s. Records: start, end (s from t0), status, retry_after."""
    url = f"http://127.0.0.1:{args.port}/v1/completions"
    rng = np.random.default_rng(clients)
    records: list[dict[str, Any]] = []
    bar = tqdm(total=round(duration), desc=desc, unit="s", disable=None)
    t0 = time.perf_counter()

    async def user(c: httpx.AsyncClient) -> None:
        while (start := time.perf_counter() - t0) < duration:
            body = {"model": name, "prompt": text(rng, args.prompt_chars), "temperature": 0.0}
            body |= {"max_tokens": args.gen_tokens, "ignore_eos": True}
            retry = None
            try:
                r = await c.post(url, json=body)
                status: int | str = r.status_code
                retry = r.headers.get("retry-after")
            except Exception as exc:
                status = f"{type(exc).__name__}: {exc}"
            end = time.perf_counter() - t0
            records.append({"start": start, "end": end, "status": status, "retry_after": retry})
            bar.n = min(round(duration), int(end))
            bar.refresh()
            if status == 429:
                await asyncio.sleep(float(retry or 1))

    async with client() as c:
        await asyncio.gather(*(user(c) for _ in range(clients)))
    bar.close()
    return records, time.perf_counter() - t0


def summarize(records: list[dict[str, Any]], duration: float, slo_s: float) -> dict[str, Any]:
    served = [r for r in records if r["status"] == 200]
    lat = [r["end"] - r["start"] for r in served]
    good = [r for r in served if r["end"] <= duration and r["end"] - r["start"] <= slo_s]
    errors = [r for r in records if r["status"] not in (200, 429)]
    return {
        "requests": len(records),
        "served": len(served),
        "served_in_window": sum(r["end"] <= duration for r in served),
        "shed_429": sum(r["status"] == 429 for r in records),
        "retry_after": sorted({str(r["retry_after"]) for r in records if r["status"] == 429}),
        "errors": len(errors),
        "error_examples": [str(r["status"]) for r in errors[:10]],
        "within_slo": len(good),
        "goodput_rps": len(good) / duration,
        "throughput_rps": sum(r["end"] <= duration for r in served) / duration,
        "latency": dist(lat),
    }


def per_second(records: list[dict[str, Any]], duration: float, slo_s: float) -> list[list[int]]:
    """[second, answered 200, of them within the SLO, 429s] for each second of the window
    (by the time the answer came)."""
    bins = [[k, 0, 0, 0] for k in range(int(np.ceil(duration)))]
    for r in records:
        if r["end"] >= len(bins):
            continue
        row = bins[int(r["end"])]
        if r["status"] == 200:
            row[1] += 1
            row[2] += r["end"] - r["start"] <= slo_s
        elif r["status"] == 429:
            row[3] += 1
    return bins


def measure(
    args: argparse.Namespace,
    coordinator: Any,
    name: str,
    clients: int,
    duration: float,
    slo_s: float,
    desc: str,
) -> dict[str, Any]:
    """`closed_loop` while a poller reads the coordinator's plans in flight: the summary,
    its per-second bins, the most plans held at once and the alpha searches adopted
    before and after (the tuner's one-time search costs CPU while it runs)."""
    import ray

    tuner_before = int(ray.get(coordinator.tuner_runs.remote()))
    with Poller(lambda: open_plans(coordinator)[0], 0.1) as p:
        records, wall = asyncio.run(closed_loop(args, name, clients, duration, desc))
    out = summarize(records, duration, slo_s) | {"clients": clients, "wall_s": wall}
    out["peak_in_flight"] = max((v for _, v in p.samples), default=0)
    out["tuner_runs"] = [tuner_before, int(ray.get(coordinator.tuner_runs.remote()))]
    return out | {"slo_s": slo_s, "per_second": per_second(records, duration, slo_s)}


def warm_up(args: argparse.Namespace, name: str, n: int) -> None:
    async def go() -> None:
        url = f"http://127.0.0.1:{args.port}/v1/completions"
        body = {"model": name, "prompt": "warm up " * 20, "max_tokens": 8, "ignore_eos": True}
        async with client() as c:
            await asyncio.gather(*(c.post(url, json=body) for _ in range(n)))

    asyncio.run(go())


# ---------------------------------------------------------------------- figures, table, plot
COLUMNS = ("section", "figure", "value", "target", "met")


def fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return f"{v:,}"
    return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"


def figures(r: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per headline figure: its value, the target and whether it was met."""
    rows: list[dict[str, Any]] = []

    def row(section: str, figure: str, value: Any, target: str, met: bool) -> None:
        rows.append(dict(zip(COLUMNS, (section, figure, value, target, bool(met)), strict=True)))

    if a := r.get("drops"):
        inf1, res1, rel = a["in_flight_at_1s"], a["reserved_at_1s"], a["released_s"]
        row(
            "a", f"plans in flight 1 s after the last of {a['drops']} drops", inf1, "= 0", inf1 == 0
        )
        label = (
            f"bytes reserved 1 s after the last drop (locked nodes {a.get('locked_nodes_after')})"
        )
        row("a", label, res1, "= 0", res1 == 0)
        met = rel is not None and rel <= RELEASE_S
        row("a", "s from the last drop until nothing is open", rel, f"<= {RELEASE_S:g} s", met)
        bad = sum(v for k, v in a["statuses_seen"].items() if k not in ("200", "not read"))
        bad += a.get("drop_failure_count", 0)
        codes = ", ".join(
            f"{k} x {v}" for k, v in a["statuses_seen"].items() if k not in ("200", "not read")
        )
        label = f"streams answered non-200 ({codes or 'none'}) or stalled before the drop"
        row("a", label, bad, "= 0", bad == 0)
        k, ok = len(a["after_requests"]), a["after_ok"]
        slow = max((x.get("s") or 0.0 for x in a["after_requests"]), default=0.0)
        label = f"normal requests after the drops answered 200 (of {k}; slowest {slow:.2f} s)"
        row("a", label, ok, f"= {k}", ok == k)
        cached = [x["cached_tokens"] for x in a["after_requests"]]
        label = f"mean cached tokens of those requests {cached}"
        row("a", label, a["mean_cached_tokens"], "> 0", a["mean_cached_tokens"] > 0)
    if b := r.get("health"):
        idle = b["idle"]["p50_ms"]
        for kind, what in (("refused_by_bound", "non-blank"), ("tokenized", "blank")):
            if not (x := b.get(kind)):
                continue
            h, mb, n = x["health"], x["body_bytes"] / 1e6, x.get("sent", b["bodies"])
            label = f"/health p99 ms, {b['bodies']} x {mb:.1f} MB {what} bodies at once"
            label += f" (p50 {h['p50_ms']:.1f}, max {h['max_ms']:.0f}; idle p50 {idle:.1f})"
            met = h["n"] > 0 and h["p99_ms"] < HEALTH_P99_MS and not x.get("health_non_200")
            row("b", label, h["p99_ms"], f"< {HEALTH_P99_MS:g} ms", met)
            label = f"  bodies answered 400 context_length_exceeded (of {n})"
            row("b", label, x["expected"], f"= {n}", x["expected"] == n)
    if c := r.get("journal"):
        bound, pk = c["bound_bytes"], c["peak_backlog_bytes"]
        label = f"peak journal backlog MB, {c['outage_s']:g} s Redis outage"
        label += f" ({c['peak_lost_records']:,} records lost, then a snapshot)"
        row("c", label, pk / 1e6, f"<= bound {bound / 1e6:.1f} MB", pk <= bound)
        before, during = c["rss_before"] or 0, c["rss_peak_outage"] or 0
        growth, limit = (during - before) / 1e6, bound / 1e6 + RSS_SLACK_MB
        unbounded = c.get("unbounded_backlog_bytes")
        label = f"coordinator RSS growth MB in the outage ({before / 1e6:.0f} -> {during / 1e6:.0f}"
        label += ")" if unbounded is None else f"; unbounded backlog {unbounded / 1e6:.1f} MB)"
        target = f"<= bound + {RSS_SLACK_MB:g} MB"
        row("c", label, growth, target, before > 0 and growth <= limit)
        cu = c["catch_up_s"]
        met = cu is not None and cu <= CATCH_UP_S
        row(
            "c",
            "catch-up s (Redis back -> journal ok, backlog empty)",
            cu,
            f"<= {CATCH_UP_S:g} s",
            met,
        )
        errs = c["client_errors"]
        row("c", f"errors seen by clients (of {c['requests']:,} requests)", errs, "= 0", errs == 0)
    if d := r.get("goodput"):
        shed, free = d["shed"], d["no_shed"]
        g, f = shed["goodput_rps"], free["goodput_rps"]
        label = f"goodput req/s, {d['clients']} clients = 2C, SLO {d['slo_s']:.2f} s: shedding"
        label += f" (p95 {shed['latency']['p95_ms'] / 1e3:.2f} s, {shed['shed_429']:,} x 429)"
        row("d", label, g, f">= no shedding ({f:.1f})", g > 0 and g >= f)
        label = f"  without shedding (p95 {free['latency']['p95_ms'] / 1e3:.2f} s;"
        label += f" served {free['throughput_rps']:.1f}/s)"
        row("d", label, f, "no 429", free["shed_429"] == 0)
        cap, pk = d["capacity"], shed["peak_in_flight"]
        row("d", f"most plans held at once with shedding (C = {cap})", pk, f"<= {cap}", pk <= cap)
        errs = shed["errors"] + free["errors"]
        row("d", "errors (neither 200 nor 429), both runs", errs, "= 0", errs == 0)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    width = max([60, *(len(x["figure"]) for x in rows)])
    head = f"   {'figure':{width}} {'value':>10}  {'target':22} verdict"
    lines = [head, "-" * len(head)]
    for x in rows:
        verdict = "met" if x["met"] else "MISSED"
        value = fmt(x["value"])
        lines.append(
            f"{x['section']}  {x['figure']:{width}} {value:>10}  {x['target']:22} {verdict}"
        )
    return "\n".join(lines)


def plot(r: dict[str, Any], rows: list[dict[str, Any]], path: Path) -> None:
    """(a) plans in flight around the drops; (b) /health latency idle vs under bodies;
    (c) journal backlog and coordinator RSS through the outage; (d) goodput."""
    fig = Figure(figsize=(13, 9))
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(2, 2, i + 1) for i in range(4)]
    verdict = {s: all(x["met"] for x in rows if x["section"] == s) for s in "abcd"}

    def title(ax: Any, s: str, what: str) -> None:
        ax.set_title(f"({s}) {what}: {'met' if verdict[s] else 'MISSED'}", fontsize=9)

    ax = axes[0]
    if a := r.get("drops"):
        tl = np.asarray(a["timeline"], dtype=float).reshape(-1, 3)
        ax.step(tl[:, 0], tl[:, 1], where="post", label="plans in flight")
        ax2 = ax.twinx()
        ax2.step(tl[:, 0], tl[:, 2] / 1e3, where="post", color="C1", label="reserved KB")
        ax2.set_ylabel("reserved KB", fontsize=8)
        ax.axvline(0, color="k", lw=1, ls="--")
        ax.axvline(1, color="C3", lw=1, ls=":", label="+1 s")
        ax.set_xlabel("s from the last drop")
        ax.set_ylabel("plans in flight")
        rel = "never" if a["released_s"] is None else f"{a['released_s']:.2f} s"
        ax.text(
            0.5,
            0.6,
            f"{a['drops']} drops; released after {rel}\n+1 s: "
            f"{a['in_flight_at_1s']} plans, {a['reserved_at_1s']:,} B reserved",
            transform=ax.transAxes,
            ha="center",
            fontsize=8,
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "0.7"},
        )
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(lines, [h.get_label() for h in lines], loc="upper right", fontsize=7)
        title(ax, "a", "dropped streams")
    ax = axes[1]
    if b := r.get("health"):
        kinds = [("idle", b["idle"])] + [
            (k, b[k]["health"]) for k in ("refused_by_bound", "tokenized") if k in b
        ]
        x = np.arange(len(kinds))
        for j, q in enumerate(("p50_ms", "p99_ms", "max_ms")):
            vals = [max(1e-3, d[q]) for _, d in kinds]
            bars = ax.bar(x + (j - 1) * 0.27, vals, 0.27, label=q[:-3])
            for bar, v in zip(bars, vals, strict=True):
                xy = (bar.get_x() + bar.get_width() / 2, v)
                ax.annotate(
                    f"{v:.0f}" if v >= 10 else f"{v:.1f}", xy, ha="center", va="bottom", fontsize=7
                )
        ax.set_xticks(x, [k for k, _ in kinds], fontsize=8)
        ax.axhline(HEALTH_P99_MS, color="k", ls="--", lw=1, label=f"p99 target {HEALTH_P99_MS:g}")
        ax.set_yscale("log")
        ax.set_ylabel("/health latency ms")
        ax.legend(fontsize=7)
        title(ax, "b", f"/health under {b['bodies']} concurrent big bodies")
    ax = axes[2]
    if c := r.get("journal"):
        tl, m, bound = c["timeline"], c["marks"], c["bound_bytes"] / 1e6
        fine = c.get("fine_timeline") or [
            [s["t"], s["state"], s["backlog_bytes"] or 0, 0, 0] for s in tl
        ]
        ft = [x[0] for x in fine]
        ax.plot(ft, [x[2] / 1e6 for x in fine], label="journal backlog MB", color="C0")
        ax.axhline(bound, color="C0", ls="--", lw=1, label="bound (journal_max_backlog_bytes)")
        ax.axvspan(m["stop"], m["restart"], color="0.85", label="Redis down")
        colors = [STATE_COLORS.get(x[1] or "down", "k") for x in fine]
        ax.scatter(ft, [-0.06 * bound] * len(fine), c=colors, marker="|", s=60)
        ax.set_xlabel("s")
        ax.set_ylabel("journal backlog MB")
        ax2 = ax.twinx()
        t = [s["t"] for s in tl]
        ax2.plot(t, [(s["rss"] or 0) / 1e6 for s in tl], color="C1", label="coordinator RSS MB")
        ax2.set_ylabel("coordinator RSS MB", fontsize=8)
        lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
        ax.legend(lines, [h.get_label() for h in lines], fontsize=7, loc="upper left")
        ax.text(
            0.99,
            0.06,
            "journal state (band): ok green, degraded orange, lost red",
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7,
        )
        title(ax, "c", f"journal through a {c['outage_s']:g} s Redis outage")
    ax = axes[3]
    if d := r.get("goodput"):
        for key, label, color in (("shed", "shedding", "C2"), ("no_shed", "no shedding", "C3")):
            x = d[key]
            ps = np.asarray(x["per_second"], dtype=float).reshape(-1, 4)
            lat = x["latency"]
            text = f"{label}: goodput {x['goodput_rps']:.1f}/s, p50 {lat['p50_ms'] / 1e3:.2f} s"
            text += f", p95 {lat['p95_ms'] / 1e3:.2f} s, {x['shed_429']:,} x 429"
            ax.plot(ps[:, 0] + 0.5, ps[:, 2], color=color, label=text)
            ax.plot(ps[:, 0] + 0.5, ps[:, 1], color=color, ls=":", lw=1)
        ax.plot([], [], color="k", ls=":", lw=1, label="dotted: answered 200 per second")
        ax.set_xlabel("s")
        ax.set_ylabel("answered within the SLO per second")
        ax.set_ylim(bottom=0)
        ax.margins(y=0.35)
        ax.legend(fontsize=7, loc="upper left")
        title(ax, "d", f"goodput, {d['clients']} clients = 2C, SLO {d['slo_s']:.2f} s")
    for ax, s in zip(axes, SECTIONS, strict=True):
        if s not in r:
            ax.text(0.5, 0.5, f"{s}: skipped", ha="center", transform=ax.transAxes)
        ax.grid(True, alpha=0.3)
    quick = " [--quick]" if r.get("quick") else ""
    fig.suptitle(
        f"Hostile clients and long outages: tiny NemotronH, CPU, "
        f"{r.get('machine', {}).get('cpu_count')} cores{quick}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------- driver
def machine() -> dict[str, Any]:
    """`run_info.machine` with the redis-server version."""
    out = run_info.machine(("ray", "fastapi", "httpx", "numpy", "redis", "marconi-ray"))
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        run = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
        out["versions"]["redis-server"] = run.stdout.split(" v=")[-1].split()[0]
    return out


OPTIONS = (  # name, type, default, help
    ("drops", int, 200, "(a) streamed requests dropped (the four cut points in rotation)"),
    ("drop_concurrency", int, 8, "(a) drops in progress at once"),
    ("release_timeout_s", float, 55.0, "(a) stop watching for the release after this (lease: 45)"),
    ("after_requests", int, 4, "(a) normal requests (one shared prompt) after the drops"),
    ("bodies", int, 45, "(b) concurrent big bodies of each kind"),
    ("body_chars", int, 1_000_000, "(b) non-blank characters of the bound-refused prompt"),
    ("blank_chars", int, 900_000, "(b) blanks of the prompt that is tokenized"),
    ("health_poll_s", float, 0.02, "(b) pause between two /health requests of the poller"),
    ("body_min_s", float, 3.0, "(b) bursts of BODIES are repeated until this many seconds passed"),
    ("outage_s", float, 60.0, "(c) seconds Redis is down"),
    ("journal_warm_s", float, 8.0, "(c) load with Redis up before the outage"),
    ("journal_after_s", float, 8.0, "(c) load after the journal caught up"),
    ("catch_up_timeout_s", float, 60.0, "(c) give up waiting for the catch-up after this"),
    ("journal_clients", int, 4, "(c) closed-loop clients of the steady load"),
    ("journal_prompt_chars", int, 1000, "(c) characters (~tokens) of each fresh prompt"),
    ("journal_bound", int, 2_000_000, "(c) journal_max_backlog_bytes (service default 64 MiB)"),
    ("max_batch", int, 4, "(d) max_batch of the service (all sections)"),
    ("max_queued", int, 4, "(d) max_queued_requests of the shedding deployment"),
    ("calib_s", float, 15.0, "(d) seconds of C clients measuring the latency at capacity"),
    ("goodput_s", float, 60.0, "(d) seconds of 2C clients, with and without shedding"),
    ("slo_factor", float, 1.5, "(d) SLO = this x p50 latency at capacity C"),
    ("slo_s", float, 0.0, "(d) a fixed SLO in seconds instead (0: from the calibration)"),
    ("gen_tokens", int, 32, "(d) tokens decoded per request (ignore_eos)"),
    ("prompt_chars", int, 200, "(d) characters (~tokens) of each fresh prompt"),
    ("replicas", int, 2, "model replicas (tp 1)"),
    ("cache_bytes", int, 2_000_000, "prefix cache bytes per replica"),
    ("port", int, 8147, "HTTP port of the Serve proxy on 127.0.0.1"),
    ("ray_cpus", int, 12, "logical CPUs of the local Ray"),
)
QUICK = dict(
    drops=20,
    bodies=12,
    outage_s=10.0,
    journal_warm_s=4.0,
    journal_after_s=3.0,
    journal_bound=300_000,
    calib_s=6.0,
    goodput_s=12.0,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    raw = argparse.RawDescriptionHelpFormatter
    p = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    p.add_argument("--out", default=str(HERE / "results" / "hostile"), help="output folder")
    for name, typ, default, help_text in OPTIONS:
        p.add_argument(
            f"--{name.replace('_', '-')}",
            type=typ,
            default=default,
            help=f"{help_text} [%(default)s]",
        )
    p.add_argument(
        "--skip", default="", help=f"comma-separated sections to omit: {', '.join(SECTIONS)}"
    )
    quick = ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in QUICK.items())
    p.add_argument("--quick", action="store_true", help=f"smoke run: {quick}")
    args = p.parse_args(argv)
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if bad := args.skip - set(SECTIONS):
        p.error(f"unknown section(s) {sorted(bad)}; choose from {list(SECTIONS)}")
    if args.quick:  # options given on the command line keep their value
        vars(args).update({k: v for k, v in QUICK.items() if getattr(args, k) == p.get_default(k)})
    if args.max_queued < 0:
        p.error("--max-queued must be >= 0 (the shedding deployment)")
    return args


@contextlib.contextmanager
def deployed(s: Any, timeout_s: float = 180.0) -> Iterator[Any]:
    """The service with settings `s` on the connected Ray, ready (every replica
    registered, /health 200); yields the coordinator actor; torn down after."""
    import ray
    from ray import serve

    from marconi_ray.serve.app import build_app, shutdown_app, start_actors
    from marconi_ray.serve.settings import NAMESPACE

    try:
        start_actors(s)
        serve.run(build_app(s), name=s.app_name, route_prefix="/")
        coordinator = ray.get_actor(s.coordinator_name, namespace=NAMESPACE)
        deadline = time.monotonic() + timeout_s
        while len(ray.get(coordinator.replicas.remote())) < s.replicas:
            if time.monotonic() > deadline:
                raise RuntimeError("the replicas did not register")
            time.sleep(0.2)
        with httpx.Client(timeout=10, trust_env=False) as c:
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if c.get(f"http://127.0.0.1:{s.port}/health").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("/health did not answer 200")
                time.sleep(0.2)
        yield coordinator
    finally:
        shutdown_app(s)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM tears down as Ctrl-C
    import ray
    from ray import serve

    from marconi_ray.cli.serve import cpus_needed
    from marconi_ray.serve.config import ServeConfig
    from marconi_ray.serve.settings import NAMESPACE

    cfg = ServeConfig(
        model="tiny",
        port=args.port,
        replicas=args.replicas,
        cache_bytes=args.cache_bytes,
        max_batch=args.max_batch,
        max_queued_requests=args.max_queued,
        journal_max_backlog_bytes=args.journal_bound,
    )
    base_settings = replace(cfg.to_settings(), app_name="hostile")
    name = base_settings.model_name
    capacity = args.replicas * (args.max_batch + args.max_queued)
    out = Path(args.out)
    report: dict[str, Any] = {"quick": args.quick, "skip": sorted(args.skip), "machine": machine()}
    report["config"] = {k: v for k, v in vars(args).items() if k != "skip"}
    report["config"] |= {"model_dir": base_settings.model_dir, "model_name": name}
    report["config"] |= {"lease_s": base_settings.lease_s, "capacity": capacity}
    report["config"]["max_body_bytes"] = base_settings.max_body_bytes
    start = time.perf_counter()
    redis: RedisProcess | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
            if "journal" not in args.skip:
                redis = RedisProcess(Path(tmp) / "redis", persist=True).start()
                base_settings = replace(base_settings, redis_url=redis.url)
            quiet = {"include_dashboard": False, "log_to_driver": False}
            cpus = max(args.ray_cpus, cpus_needed(base_settings) + 2)
            ray.init(address="local", num_cpus=cpus, namespace=NAMESPACE, **quiet)
            serve.start(http_options={"host": "127.0.0.1", "port": args.port})
            deploy_s: dict[str, float] = {}
            report["deploy_s"] = deploy_s
            if "drops" not in args.skip:  # its own deployment: what it leaves stays there
                t0 = time.perf_counter()
                with deployed(replace(base_settings, app_name="hostile-drops")) as coordinator:
                    deploy_s["drops"] = time.perf_counter() - t0
                    warm_up(args, name, 2 * args.replicas)
                    report["drops"] = drops_bench(args, coordinator, name)
            t0 = time.perf_counter()
            with deployed(base_settings) as coordinator:
                deploy_s["main"] = time.perf_counter() - t0
                warm_up(args, name, 2 * args.replicas)
                if "health" not in args.skip:
                    report["health"] = health_bench(args, name)
                if redis is not None:
                    bound = base_settings.journal_max_backlog_bytes
                    report["journal"] = journal_bench(args, coordinator, redis, name, bound)
                if "goodput" not in args.skip:
                    at_c = measure(
                        args, coordinator, name, capacity, args.calib_s, inf, "(d) C, shedding"
                    )
                    slo = args.slo_s or args.slo_factor * at_c["latency"]["p50_ms"] / 1e3
                    d = {"capacity": capacity, "clients": 2 * capacity, "slo_s": slo}
                    d |= {"slo_from": "--slo-s" if args.slo_s else "slo_factor x p50 at C"}
                    d |= {"duration_s": args.goodput_s, "calibration": at_c}
                    d["shed"] = measure(
                        args, coordinator, name, 2 * capacity, args.goodput_s, slo, "(d) 2C, shed"
                    )
                    report["goodput"] = d
            if "goodput" not in args.skip:
                free = replace(base_settings, app_name="hostile-noshed", max_queued_requests=-1)
                t0 = time.perf_counter()
                with deployed(free) as coordinator:
                    deploy_s["no_shed"] = time.perf_counter() - t0
                    warm_up(args, name, 2 * args.replicas)
                    d["calibration_no_shed"] = measure(
                        args, coordinator, name, capacity, args.calib_s, slo, "(d) C, no shed"
                    )
                    d["no_shed"] = measure(
                        args, coordinator, name, 2 * capacity, args.goodput_s, slo, "(d) 2C"
                    )
    finally:
        if ray.is_initialized():
            with contextlib.suppress(Exception):
                serve.shutdown()
            ray.shutdown()
        if redis is not None:
            redis.stop()
    report["wall_s"] = time.perf_counter() - start
    report["figures"] = rows = figures(report)
    out.mkdir(parents=True, exist_ok=True)
    (out / "hostile.json").write_text(json.dumps(report, indent=2, default=float) + "\n")
    plot(report, rows, out / "hostile.png")
    print(f"\n{table(rows)}\n\nwall time {report['wall_s']:.0f} s")
    print(f"wrote {out / 'hostile.json'}, {out / 'hostile.png'}")
    return report


if __name__ == "__main__":
    main()
