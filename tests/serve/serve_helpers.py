"""Shared helpers for the Ray-backed serve tests: a local Ray, deployed apps, streaming."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import ray
from ray import serve
from ray_session import SERVE_PORT as SERVE_PORT  # the shared local Ray and Serve
from ray_session import local_ray as local_ray

from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.app import shutdown_app, start_actors
from marconi_ray.serve.messages import Completed
from marconi_ray.serve.replica.deployment import replica_deployment
from marconi_ray.serve.settings import NAMESPACE, ServeSettings

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


@contextmanager
def replicas_app(settings: ServeSettings) -> Iterator[tuple[Any, Any]]:
    """Deploy the coordinator, tuner and model replicas (no HTTP ingress); yields the
    coordinator actor (the first of the group) and the replica deployment handle."""
    with group_app(settings) as (coordinators, handle):
        yield coordinators[0], handle


@contextmanager
def group_app(settings: ServeSettings) -> Iterator[tuple[list[Any], Any]]:
    """`replicas_app` for a coordinator group (`settings.coordinators`): yields every
    coordinator actor, by index, once all the replicas registered with one of them."""
    start_actors(settings)
    handle = serve.run(
        replica_deployment(settings).bind(settings), name=settings.app_name, route_prefix=None
    )
    coordinators = [
        ray.get_actor(member.coordinator_name, namespace=NAMESPACE) for member in settings.group()
    ]
    deadline = time.monotonic() + 60
    while sum(len(ray.get(c.replicas.remote())) for c in coordinators) < settings.replicas:
        assert time.monotonic() < deadline, "replicas did not register"
        time.sleep(0.2)
    try:
        yield coordinators, handle
    finally:
        shutdown_app(settings)


async def run_request(
    coordinator: Any, handle: Any, prompt: list[int], params: SamplingParams = GREEDY
) -> tuple[str, list[int], Completed]:
    """Plan at the coordinator, stream from the chosen replica; (replica, tokens, done)."""
    dispatch = await coordinator.plan.remote(np.asarray(prompt, np.int32), params, time.time())
    tokens: list[int] = []
    done: Completed | None = None
    async for event in handle.options(stream=True).generate.remote(dispatch):
        if isinstance(event, Completed):
            done = event
        else:  # the tokens of one replica step (or more, when this reader lags)
            tokens.extend(e.token for e in event)
    assert done is not None
    return dispatch.replica_id, tokens, done


# ---------------------------------------------------------------------- soak
# The soak (tests/serve/test_soak.py and benchmarks/soak.py): the real HTTP service on
# loopback, the load generator's multi-turn sessions as fixed concurrent users, and a
# watcher polling the coordinator's byte accounting while the load runs.


@dataclass(frozen=True)
class SoakConfig:
    """One soak run.

    Attributes:
        model_dir: the model folder (`make_model` output); model_name: its served name.
        sessions: concurrent users; each runs one ShareGPT session after another, every
            turn a streaming request whose prompt extends the previous turn's.
        duration_s: no request starts after this many seconds (in-flight ones finish).
        pool: sessions available to the users (at least `sessions`).
        replicas, tp, cache_bytes (per replica), system, max_batch: the deployment.
        max_tokens: most tokens decoded per turn; max_prompt: a session ends at the first
            turn whose prompt would be longer.
        port, app_name: where the service listens (127.0.0.1) and its Serve app name.
        poll_s: the capacity watcher's interval.
        trace: a trace spec for the load generator (None: `sharegpt` when the shared data
            folder has it, else the packaged sample replicated with shifted token ids).
        request_timeout_s: the client's per-request timeout.
    """

    model_dir: str
    model_name: str = "tiny"
    sessions: int = 32
    duration_s: float = 30.0
    pool: int = 128
    replicas: int = 2
    tp: int = 1
    cache_bytes: int = 1_000_000
    system: str = "marconi"
    max_batch: int = 8
    max_tokens: int = 4
    max_prompt: int = 1024
    port: int = 8150
    app_name: str = "soak"
    poll_s: float = 0.05
    trace: str | None = None
    request_timeout_s: float = 120.0

    def settings(self) -> ServeSettings:
        return ServeSettings(
            model_dir=self.model_dir,
            model_name=self.model_name,
            tp=self.tp,
            replicas=self.replicas,
            cache_bytes=self.cache_bytes,
            system=self.system,
            max_batch=self.max_batch,
            port=self.port,
            app_name=self.app_name,
        )


@dataclass
class ReplicaEnd:
    """One replica's figures: peaks while the load ran, state after it settled."""

    replica_id: str
    capacity: int
    peak_seen: int  # max bytes_used + reserved over the watcher's polls
    peak_bytes: int  # the cache's own peak of bytes_used (CacheStats.peak_bytes)
    evictions: int
    requests: int
    bytes_used: int
    reserved: int
    in_flight: int
    locked_nodes: int
    store_bytes: int | None  # the replica's rank-0 store (None: not reached)


@dataclass
class SoakReport:
    """What a soak measured (`run_soak`)."""

    config: dict[str, Any]
    trace: str
    requests: int
    completed: int
    errors: dict[str, int]
    error_details: list[str]
    incomplete: int  # completed requests with fewer tokens than asked for
    sessions_started: int
    max_concurrent_requests: int  # client side: most requests open at once
    peak_in_flight: int  # coordinator side: most requests planned and not yet committed
    polls: int
    violations: list[str]
    watcher_error: str | None
    replicas: list[ReplicaEnd]
    invariant_nodes: int
    settle_s: float
    load_wall_s: float
    ttft_ms: dict[str, float | None]
    e2el_ms: dict[str, float | None]
    request_throughput: float
    output_throughput: float
    client_token_hit_rate: float | None
    server: dict[str, Any] | None

    @property
    def capacity(self) -> int:
        return max(r.capacity for r in self.replicas)

    @property
    def peak_seen(self) -> int:
        return max(r.peak_seen for r in self.replicas)

    @property
    def peak_bytes(self) -> int:
        return max(r.peak_bytes for r in self.replicas)

    @property
    def evictions(self) -> int:
        return sum(r.evictions for r in self.replicas)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            capacity=self.capacity,
            peak_seen=self.peak_seen,
            peak_bytes=self.peak_bytes,
            peak_ratio=self.peak_seen / self.capacity,
            evictions=self.evictions,
        )
        return out


def soak_trace(pool: int, workdir: Path) -> str:
    """The trace spec for `pool` sessions: `sharegpt` when the shared data folder has it,
    else the packaged 20-session sample replicated (copy k shifts every token id by k,
    so copies share no prefix) into a JSONL file under `workdir`."""
    from marconi_ray.traces.registry import load_sample, load_trace
    from marconi_ray.traces.trace import Request, Trace, write_jsonl

    try:
        if len(load_trace("sharegpt", n_sessions=pool).session_ids()) >= pool:
            return "sharegpt"
    except (FileNotFoundError, OSError, ValueError):
        pass
    sample = load_sample()
    ids = sample.session_ids()
    requests = []
    for copy in range((pool + len(ids) - 1) // len(ids)):
        for r in sample.requests:
            requests.append(
                Request(
                    r.session_id + copy * (max(ids) + 1),
                    r.turn_id,
                    r.ts,
                    np.asarray(r.input_tokens, np.int32) + copy,
                    np.asarray(r.output_tokens, np.int32) + copy,
                )
            )
    path = write_jsonl(Trace("soak-sample", tuple(requests)), workdir / "soak_trace.jsonl")
    return str(path)


class CapacityWatcher:
    """A thread polling `coordinator.stats()` every `poll_s` seconds: every replica's
    `bytes_used + reserved` against its capacity (violations recorded, not raised), the
    per-replica peak of that sum and the most requests in flight at once."""

    def __init__(self, coordinator: Any, poll_s: float, progress_s: float | None = None) -> None:
        """`progress_s`: show a tqdm bar of elapsed seconds out of this many (None: none)."""
        self.coordinator, self.poll_s, self.progress_s = coordinator, poll_s, progress_s
        self.polls = 0
        self.peak: dict[str, int] = {}
        self.peak_in_flight = 0
        self.violations: list[str] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-watcher", daemon=True)

    def _run(self) -> None:
        from tqdm import tqdm

        t0 = time.monotonic()
        total = self.progress_s or 0.0
        bar = tqdm(total=round(total), disable=self.progress_s is None, unit="s", desc="soak")
        try:
            while not self._stop.is_set():
                stats = ray.get(self.coordinator.stats.remote(), timeout=30)
                self.polls += 1
                in_flight = sum(s.in_flight for s in stats)
                self.peak_in_flight = max(self.peak_in_flight, in_flight)
                for s in stats:
                    held = s.bytes_used + s.reserved
                    self.peak[s.replica_id] = max(self.peak.get(s.replica_id, 0), held)
                    if held > s.capacity:
                        self.violations.append(
                            f"poll {self.polls}: {s.replica_id} {s.bytes_used}+{s.reserved}"
                            f" > {s.capacity}"
                        )
                if self.progress_s is not None and self.polls % 10 == 0:
                    bar.n = min(round(total), int(time.monotonic() - t0))
                    ratio = max((s.bytes_used + s.reserved) / s.capacity for s in stats)
                    bar.set_postfix(
                        in_flight=in_flight, held=f"{ratio:.3f}", violations=len(self.violations)
                    )
                self._stop.wait(self.poll_s)
        except Exception as exc:  # a dead coordinator is a finding, not a crash
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            bar.close()

    def __enter__(self) -> CapacityWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def max_overlap(records: list[Any]) -> int:
    """Most requests open at once, from the records' start times and latencies (failed
    requests without a latency count as instantaneous)."""
    events: list[tuple[float, int]] = []
    for r in records:
        end = r.start_s + (r.e2el_ms or 0.0) / 1e3
        events += [(r.start_s, 1), (end, -1)]
    best = now = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        now += step
        best = max(best, now)
    return best


@contextmanager
def http_service(settings: ServeSettings, timeout_s: float = 120.0) -> Iterator[Any]:
    """The full service (coordinator, tuner, replicas, OpenAI ingress) over HTTP on
    settings.host:settings.port, ready (all replicas registered, /health answers);
    yields the coordinator actor. Needs a connected Ray (see `local_ray`)."""
    import urllib.error
    import urllib.request

    from marconi_ray.serve.app import run_app

    try:
        run_app(settings)
        coordinator = ray.get_actor(settings.coordinator_name, namespace=NAMESPACE)
        deadline = time.monotonic() + timeout_s
        while len(ray.get(coordinator.replicas.remote())) < settings.replicas:
            assert time.monotonic() < deadline, "replicas did not register"
            time.sleep(0.2)
        url = f"http://{settings.host}:{settings.port}/health"
        while True:
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            assert time.monotonic() < deadline, f"{url} did not answer"
            time.sleep(0.2)
        yield coordinator
    finally:
        shutdown_app(settings)


def _settle(coordinator: Any, timeout_s: float) -> tuple[list[Any], float]:
    """Coordinator stats once no request is in flight or reserved (or at the timeout)."""
    t0 = time.monotonic()
    while True:
        stats = ray.get(coordinator.stats.remote())
        idle = all(s.in_flight == 0 and s.reserved == 0 for s in stats)
        if idle or time.monotonic() - t0 > timeout_s:
            return stats, time.monotonic() - t0
        time.sleep(0.1)


def _store_bytes(app_name: str, want: dict[str, int], timeout_s: float) -> dict[str, int]:
    """Each replica's rank-0 store bytes, via the deployment handle; polled until they
    equal `want` or the timeout (the replicas free what a commit released
    asynchronously). Serve sends an unpinned call to the replica with the shortest queue,
    the same one whenever all are idle, so each round sends several calls at once."""
    handle = serve.get_deployment_handle("ModelReplica", app_name=app_name)
    held: dict[str, int] = {}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        calls = [handle.stats.remote() for _ in range(4 * max(1, len(want)))]
        for call in calls:
            s = call.result(timeout_s=30)
            held[s["replica_id"]] = int(s["bytes_used"])
        if held == want:
            break
        time.sleep(0.02)
    return held


def expected_tokens(trace: str, pool: int, max_tokens: int) -> dict[tuple[int, int], int]:
    """The tokens the load generator asks for at each (session, turn) of `trace`."""
    from loadgen.sessions import build_sessions
    from loadgen.sessions import max_tokens as turn_tokens
    from marconi_ray.traces.registry import load_trace

    sessions = build_sessions(load_trace(trace, n_sessions=pool), pool)
    return {
        (s.session_id, t.turn_id): turn_tokens(t, max_tokens)
        for s in sessions.sessions
        for t in s.turns
    }


def run_soak(cfg: SoakConfig, workdir: Path, progress: bool = False) -> SoakReport:
    """Deploy `cfg`'s service on the connected Ray, drive `cfg.sessions` concurrent users
    over loopback HTTP for `cfg.duration_s` while a `CapacityWatcher` polls, then let it
    settle and collect the end state (locks, reservations, invariants, store bytes)."""
    from loadgen.config import LoadConfig
    from loadgen.runner import run_load

    trace = cfg.trace or soak_trace(cfg.pool, workdir)
    pool = max(cfg.pool, cfg.sessions)
    settings = cfg.settings()
    vocab = int(json.loads((Path(cfg.model_dir) / "config.json").read_text())["vocab_size"])
    load = LoadConfig(
        url=f"http://{settings.host}:{settings.port}",
        trace=trace,
        model=cfg.model_name,
        sessions=pool,
        session_rate=None,
        concurrency=cfg.sessions,
        vocab_size=vocab,
        max_output=cfg.max_tokens,
        max_prompt=cfg.max_prompt,
        max_seconds=cfg.duration_s,
        timeout_s=cfg.request_timeout_s,
    )
    want = expected_tokens(trace, pool, cfg.max_tokens)
    with http_service(settings) as coordinator:
        bar_s = cfg.duration_s if progress else None
        with CapacityWatcher(coordinator, cfg.poll_s, bar_s) as watcher:
            result = run_load(load, progress=False)
        stats, settle_s = _settle(coordinator, timeout_s=30.0)
        invariant_nodes = int(ray.get(coordinator.check_invariants.remote()))
        locked = {
            s.replica_id: int(ray.get(coordinator.locked_nodes.remote(s.replica_id))) for s in stats
        }
        store = _store_bytes(cfg.app_name, {s.replica_id: s.bytes_used for s in stats}, 30.0)
    records = result.records
    done = [r for r in records if r.error is None]
    summary = result.summary
    return SoakReport(
        config=asdict(cfg),
        trace=trace,
        requests=len(records),
        completed=len(done),
        errors=dict(summary["errors"]),
        error_details=[f"{r.error}: {r.error_detail}" for r in records if r.error][:20],
        incomplete=sum(
            len(r.output_ids) != r.output_tokens
            or r.output_tokens != want.get((r.session_id, r.turn), -1)
            for r in done
        ),
        sessions_started=len({r.session_id for r in records}),
        max_concurrent_requests=max_overlap(records),
        peak_in_flight=watcher.peak_in_flight,
        polls=watcher.polls,
        violations=watcher.violations,
        watcher_error=watcher.error,
        replicas=[
            ReplicaEnd(
                replica_id=s.replica_id,
                capacity=s.capacity,
                peak_seen=watcher.peak.get(s.replica_id, 0),
                peak_bytes=int(s.stats["peak_bytes"]),
                evictions=int(s.stats["evictions"]),
                requests=int(s.stats["requests"]),
                bytes_used=s.bytes_used,
                reserved=s.reserved,
                in_flight=s.in_flight,
                locked_nodes=locked[s.replica_id],
                store_bytes=store.get(s.replica_id),
            )
            for s in stats
        ],
        invariant_nodes=invariant_nodes,
        settle_s=settle_s,
        load_wall_s=result.wall_s,
        ttft_ms=summary["ttft_ms"],
        e2el_ms=summary["e2el_ms"],
        request_throughput=summary["request_throughput"],
        output_throughput=summary["output_throughput"],
        client_token_hit_rate=summary["client_token_hit_rate"],
        server=summary["server"],
    )


async def read_tokens(stream: AsyncIterable[Any]) -> tuple[list[int], Completed]:
    """(the tokens, the `Completed`) of an event stream that yields `TokenEvent`s one at a
    time, such as `GuardedStream`; AssertionError when it ends without `Completed`."""
    tokens: list[int] = []
    async for item in stream:
        if isinstance(item, Completed):
            return tokens, item
        tokens.append(item.token)
    raise AssertionError("no Completed")
