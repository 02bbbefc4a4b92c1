"""Run a load: sessions start on an arrival process (or as fixed users), each turn is a
streaming request whose prompt depends on the previous turn, and every request becomes a
RequestRecord.

Bounds: no new request starts after ``max_requests`` requests or ``max_seconds``
seconds; in-flight requests finish, or are cancelled (error ``cancelled``) at
``max_seconds + timeout_s``. A failed turn ends its session (later turns extend it). The
server's ``/metrics`` is scraped before and after (None when it has none).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np
from tqdm import tqdm

from loadgen.arrivals import ThinkTime, parse_think, session_start_times, trace_start_times
from loadgen.client import stream_completion
from loadgen.config import LoadConfig, RequestRecord
from loadgen.detok import load_detokenizer
from loadgen.metrics import summarize
from loadgen.server_metrics import delta, scrape
from loadgen.sessions import (
    Prompt,
    PromptSpec,
    Reply,
    Session,
    SessionSet,
    build_sessions,
    max_tokens,
    next_prompt,
)
from loadgen.validate import validate_config
from marconi_ray.traces.registry import load_trace


@dataclass(frozen=True)
class LoadResult:
    """A finished run: its records (launch order), summary (`metrics.summarize` plus
    ``sessions``, ``sessions_failed``, ``sessions_cut_by_max_prompt``,
    ``non_extending_turns``, ``model``, ``server`` (`server_metrics.delta`) and
    ``config``), the server scrapes before/after, and the wall time in seconds."""

    records: list[RequestRecord]
    summary: dict[str, Any]
    server_before: dict[str, Any] | None
    server_after: dict[str, Any] | None
    wall_s: float


@dataclass
class _Driver:
    """Mutable state of one run while its event loop runs (internal)."""

    config: LoadConfig
    spec: PromptSpec
    think: ThinkTime
    http: aiohttp.ClientSession
    model: str | None
    bar: tqdm[Any]
    t0: float = field(default_factory=time.perf_counter)
    launched: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    sessions_failed: int = 0
    cut_by_max_prompt: int = 0

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def remaining(self) -> float | None:
        """Seconds left to launch requests (None: unbounded)."""
        ms = self.config.max_seconds
        return None if ms is None else max(0.0, ms - self.elapsed())

    def may_launch(self) -> bool:
        limit = self.config.max_requests
        left = self.remaining()
        return (limit is None or self.launched < limit) and (left is None or left > 0)

    def body(self, prompt: Prompt, n_out: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "prompt": list(prompt.ids) if prompt.ids is not None else prompt.text,
            "max_tokens": n_out,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
            "return_token_ids": True,
        }
        if self.model is not None:
            body["model"] = self.model
        return body

    async def session(self, s: Session) -> None:
        """Run the turns of ``s`` until done, a failure, a bound, or ``max_prompt``."""
        rng = np.random.default_rng([self.config.seed, s.session_id])
        prompt: Prompt | None = None
        reply: Reply | None = None
        for turn in s.turns:
            if turn.turn_id > 0:
                wait = self.think.sample(turn.think_s, rng)
                left = self.remaining()
                await asyncio.sleep(wait if left is None else min(wait, left))
            if not self.may_launch():
                return
            prompt = next_prompt(turn, prompt, reply, self.spec)
            if prompt.n_tokens > self.config.max_prompt:
                self.cut_by_max_prompt += 1
                return
            index = self.launched
            self.launched += 1
            rec = RequestRecord(
                session_id=s.session_id,
                turn=turn.turn_id,
                start_s=self.elapsed(),
                prompt_tokens=prompt.n_tokens,
                warmup=index < self.config.warmup,
                input_ids=list(prompt.ids) if prompt.ids is not None else [],
            )
            body = self.body(prompt, max_tokens(turn, self.config.max_output))
            try:
                out = await stream_completion(
                    self.http, self.config.url, body, self.config.timeout_s
                )
            except asyncio.CancelledError:
                rec.error, rec.error_detail = "cancelled", "the run's deadline passed"
                self.records.append(rec)
                raise
            rec.prompt_tokens = (
                out.prompt_tokens if out.prompt_tokens is not None else rec.prompt_tokens
            )
            rec.output_tokens, rec.cached_tokens = out.output_tokens, out.cached_tokens
            rec.ttft_ms, rec.e2el_ms, rec.itl_ms = out.ttft_ms, out.e2el_ms, list(out.itl_ms)
            rec.error, rec.error_detail = out.error, out.error_detail
            rec.output_ids = list(out.output_ids)
            self.records.append(rec)
            self.bar.update(1)
            if out.error is not None:
                self.sessions_failed += 1
                return
            reply = Reply(out.output_ids, out.text, out.output_tokens)


async def _first_model(http: aiohttp.ClientSession, url: str) -> str | None:
    """The first model id of GET /v1/models, or None if that fails."""
    try:
        async with http.get(f"{url.rstrip('/')}/v1/models") as resp:
            data = await resp.json(content_type=None)
        return str(data["data"][0]["id"])
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, IndexError, TypeError):
        return None


async def _launch(d: _Driver, sessions: tuple[Session, ...]) -> list[asyncio.Task[None]]:
    """Start sessions per the arrival process; returns their tasks."""
    cfg = d.config
    tasks: list[asyncio.Task[None]] = []
    if cfg.session_rate is None and cfg.arrivals == "rate":
        assert cfg.concurrency is not None  # validated
        queue = list(reversed(sessions))

        async def user() -> None:
            while queue and d.may_launch():
                await d.session(queue.pop())

        return [asyncio.create_task(user()) for _ in range(cfg.concurrency)]
    if cfg.arrivals == "trace":
        starts = trace_start_times([s.start_s for s in sessions], cfg.time_scale)
    else:
        assert cfg.session_rate is not None
        rng = np.random.default_rng(cfg.seed)
        starts = session_start_times(len(sessions), cfg.session_rate, cfg.burstiness, rng)
    sem = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency is not None else None

    async def bounded(s: Session) -> None:
        assert sem is not None
        try:
            await d.session(s)
        finally:
            sem.release()

    for s, at in zip(sessions, starts, strict=True):
        wait = at - d.elapsed()
        left = d.remaining()
        if left is not None:
            wait = min(wait, left)
        if wait > 0:
            await asyncio.sleep(wait)
        if not d.may_launch():
            break
        if sem is None:
            tasks.append(asyncio.create_task(d.session(s)))
            continue
        try:
            await asyncio.wait_for(sem.acquire(), d.remaining())
        except asyncio.TimeoutError:
            break
        tasks.append(asyncio.create_task(bounded(s)))
    return tasks


async def _drive(
    config: LoadConfig, sessions: SessionSet, spec: PromptSpec, progress: bool
) -> tuple[_Driver, float]:
    planned = sessions.n_turns
    if config.max_requests is not None:
        planned = min(planned, config.max_requests)
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as http:
        model = config.model or await _first_model(http, config.url)
        with tqdm(total=planned, disable=not progress, unit="req", desc="loadgen") as bar:
            d = _Driver(config, spec, parse_think(config.think), http, model, bar)
            tasks = await _launch(d, sessions.sessions)
            deadline = None
            if config.max_seconds is not None:
                deadline = max(0.0, config.max_seconds + config.timeout_s - d.elapsed())
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=deadline)
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            wall = d.elapsed()
    d.records.sort(key=lambda r: r.start_s)
    return d, wall


def run_load(config: LoadConfig, progress: bool = True) -> LoadResult:
    """Run ``config`` to completion (it stops by itself at its bounds) and summarize it.

    Raises ValueError naming a bad config value or an unknown trace, FileNotFoundError for
    missing trace data; server trouble never raises (it is recorded per request).
    """
    validate_config(config)
    trace = load_trace(config.trace, n_sessions=config.sessions)
    sessions = build_sessions(trace, config.sessions)
    detok = load_detokenizer() if config.prompt_mode == "text" else None
    spec = PromptSpec(config.history, config.prompt_mode, config.vocab_size, detok)
    before = scrape(config.url)
    d, wall = asyncio.run(_drive(config, sessions, spec, progress))
    after = scrape(config.url)
    summary = summarize(d.records, wall, config)
    summary.update(
        sessions=len(sessions.sessions),
        sessions_failed=d.sessions_failed,
        sessions_cut_by_max_prompt=d.cut_by_max_prompt,
        non_extending_turns=sessions.non_extending_turns,
        model=d.model,
        server=delta(before, after),
        config=asdict(config),
    )
    return LoadResult(d.records, summary, before, after, wall)
