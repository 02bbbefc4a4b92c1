"""Closed-loop HTTP clients of the node-loss run: multi-turn sessions over
`POST /v1/completions` with token-id prompts (greedy, `ignore_eos`, `return_token_ids`),
each turn's prompt the previous prompt + the reply + a few new "user" tokens.

Every request ends as one `Outcome`: `ok` (200 with all its tokens), `error` (a clean
HTTP error: a status, its `Retry-After`), or `broken` (the connection failed, the body
was not the promised JSON, or a stream ended without `[DONE]` or with an error event).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

USER_TOKENS = 5
TOKEN_RANGE = (7, 263)
"""Token ids the sessions draw from (clear of the tiny model's special tokens)."""


@dataclass
class Session:
    """One conversation: its history (the next prompt, minus the new user turn) and
    whether its turns are streamed."""

    sid: int
    history: list[int]
    stream: bool
    rng: np.random.Generator
    turns: int = 0

    def next_prompt(self) -> list[int]:
        low, high = TOKEN_RANGE
        return self.history + self.rng.integers(low, high, USER_TOKENS).tolist()


@dataclass(frozen=True)
class Outcome:
    """How one request ended (times: `time.monotonic()`)."""

    sid: int
    turn: int
    stream: bool
    start: float
    end: float
    kind: str  # ok | error | broken
    prompt: tuple[int, ...]
    output: tuple[int, ...] = ()
    cached_tokens: int = 0
    status: int | None = None
    retry_after: str | None = None
    detail: str = ""

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / len(self.prompt)


def _body(prompt: list[int], max_tokens: int, stream: bool, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def request(
    client: httpx.Client, url: str, model: str, session: Session, max_tokens: int
) -> Outcome:
    """Send the session's next turn; on `ok`, extend its history with the reply."""
    prompt = session.next_prompt()
    t0 = time.monotonic()
    base = {"sid": session.sid, "turn": session.turns, "stream": session.stream, "start": t0}
    try:
        out = _send(client, url, _body(prompt, max_tokens, session.stream, model))
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        out = {"kind": "broken", "detail": f"{type(exc).__name__}: {exc}"}
    outcome = Outcome(**base, end=time.monotonic(), prompt=tuple(prompt), **out)
    if outcome.kind == "ok":
        if len(outcome.output) != max_tokens:
            return dataclasses.replace(outcome, kind="broken", detail="short output")
        session.history = prompt + list(outcome.output)
        session.turns += 1
    return outcome


def _send(client: httpx.Client, url: str, body: dict[str, Any]) -> dict[str, Any]:
    if not body["stream"]:
        resp = client.post(url, json=body)
        if resp.status_code != 200:
            return _error(resp.status_code, resp.headers, resp.text)
        data = resp.json()
        cached = data["usage"]["prompt_tokens_details"]["cached_tokens"]
        return {
            "kind": "ok",
            "status": 200,
            "output": tuple(data["choices"][0]["token_ids"]),
            "cached_tokens": int(cached),
        }
    with client.stream("POST", url, json=body) as resp:
        if resp.status_code != 200:
            return _error(resp.status_code, resp.headers, resp.read().decode())
        ids: list[int] = []
        cached, done = 0, False
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line.removeprefix("data: ")
            if payload == "[DONE]":
                done = True
                break
            chunk = json.loads(payload)
            if "error" in chunk:
                return {"kind": "broken", "status": 200, "detail": f"error event: {payload}"}
            for choice in chunk.get("choices") or []:
                ids.extend(choice.get("token_ids") or [])
            if chunk.get("usage"):
                cached = int(chunk["usage"]["prompt_tokens_details"]["cached_tokens"])
        if not done:
            return {"kind": "broken", "status": 200, "detail": "stream ended without [DONE]"}
        return {"kind": "ok", "status": 200, "output": tuple(ids), "cached_tokens": cached}


def _error(status: int, headers: httpx.Headers, text: str) -> dict[str, Any]:
    return {
        "kind": "error",
        "status": status,
        "retry_after": headers.get("retry-after"),
        "detail": text[:300],
    }


@dataclass
class ClosedLoopClients:
    """`clients` threads, each cycling through its share of `sessions` one request at a
    time (a client whose request failed waits `pause_s`, then moves on), from `start()`
    until `stop()`; `outcomes` grows as requests end, `in_flight()` names the sessions
    whose requests are open."""

    url: str
    model: str
    sessions: list[Session]
    clients: int
    max_tokens: int
    timeout_s: float = 120.0
    pause_s: float = 0.2
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, Session] = {}
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(
                target=self._run,
                args=(self.sessions[i :: self.clients],),
                name=f"node-loss-client-{i}",
                daemon=True,
            )
            for i in range(self.clients)
        ]

    def _run(self, mine: list[Session]) -> None:
        with httpx.Client(timeout=self.timeout_s) as client:
            k = 0
            while not self._stop.is_set():
                session = mine[k % len(mine)]
                with self._lock:
                    self._open[session.sid] = session
                outcome = request(client, self.url, self.model, session, self.max_tokens)
                with self._lock:
                    del self._open[session.sid]
                    self.outcomes.append(outcome)
                if outcome.kind != "ok":
                    self._stop.wait(self.pause_s)
                k += 1

    def start(self) -> ClosedLoopClients:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        """Let every client finish its request in flight, then return."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self.timeout_s + 10)

    def in_flight(self) -> list[Session]:
        """The sessions whose requests are open now."""
        with self._lock:
            return list(self._open.values())

    def snapshot(self) -> list[Outcome]:
        with self._lock:
            return list(self.outcomes)


def make_sessions(n: int, prompt_tokens: int, seed: int) -> list[Session]:
    """`n` sessions with random first prompts of `prompt_tokens` tokens; odd ones stream."""
    rng = np.random.default_rng(seed)
    low, high = TOKEN_RANGE
    return [
        Session(
            i,
            rng.integers(low, high, prompt_tokens).tolist(),
            i % 2 == 1,
            np.random.default_rng([seed, i]),
        )
        for i in range(n)
    ]
