"""One streaming completion request over HTTP (aiohttp), timed the way `vllm bench serve`
times it, with failures classified instead of raised.

TTFT runs from just before the POST to the first chunk carrying text or token ids; ITL
are the gaps between successive such chunks; usage comes from the final usage chunk and
generated ids from ``choices[0].token_ids``. Error kinds: ``connect`` (no connection),
``http_4xx``/``http_5xx`` (status, or an error object sent mid-stream), ``timeout``,
``stream`` (malformed SSE, missing ``[DONE]``, no tokens).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

ERROR_KINDS = ("connect", "http_4xx", "http_5xx", "timeout", "stream", "cancelled")
_DETAIL_CHARS = 500


@dataclass(frozen=True)
class Outcome:
    """The client's view of one request. Latencies in ms; ``error`` is None on success."""

    ttft_ms: float | None = None
    e2el_ms: float | None = None
    itl_ms: tuple[float, ...] = ()
    text: str = ""
    output_ids: tuple[int, ...] = ()
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int = 0
    chunks: int = 0
    error: str | None = None
    error_detail: str | None = None

    @property
    def output_tokens(self) -> int:
        """Generated tokens: usage if reported, else the ids, else the content chunks."""
        if self.completion_tokens is not None:
            return self.completion_tokens
        return len(self.output_ids) if self.output_ids else self.chunks


@dataclass
class _Stream:
    """Mutable accumulator while one stream is read (internal)."""

    start: float
    last: float | None = None
    ttft_ms: float | None = None
    itl_ms: list[float] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    chunks: int = 0
    done: bool = False

    def outcome(self, error: str | None = None, detail: str | None = None) -> Outcome:
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return Outcome(
            ttft_ms=self.ttft_ms,
            e2el_ms=None if error else (time.perf_counter() - self.start) * 1e3,
            itl_ms=tuple(self.itl_ms),
            text="".join(self.text),
            output_ids=tuple(self.ids),
            prompt_tokens=_int(usage.get("prompt_tokens")),
            completion_tokens=_int(usage.get("completion_tokens")),
            cached_tokens=_int(cached) or 0,
            chunks=self.chunks,
            error=error,
            error_detail=None if detail is None else detail[:_DETAIL_CHARS],
        )


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class StreamError(Exception):
    """A stream that is not a well-formed OpenAI SSE completion stream (kind ``stream``)."""

    def __init__(self, message: str, kind: str = "stream") -> None:
        super().__init__(message)
        self.kind = kind


def _error_message(body: str) -> str:
    try:
        obj = json.loads(body)
    except ValueError:
        return body.strip()
    err = obj.get("error") if isinstance(obj, dict) else None
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return body.strip()


def _take_chunk(st: _Stream, payload: str) -> None:
    """Account for one ``data:`` payload (not ``[DONE]``)."""
    try:
        obj = json.loads(payload)
    except ValueError:
        raise StreamError(f"malformed SSE data: {payload[:80]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError(f"SSE data is not an object: {payload[:80]!r}")
    if "error" in obj:
        err = obj["error"]
        msg = err.get("message") if isinstance(err, dict) else err
        raise StreamError(f"error in stream: {msg}", kind="http_5xx")
    if isinstance(obj.get("usage"), dict):
        st.usage = obj["usage"]
    choices = obj.get("choices") or []
    if not isinstance(choices, list):
        raise StreamError("SSE chunk 'choices' is not a list")
    if not choices:
        return
    choice = choices[0]
    text = choice.get("text") or ""
    ids = choice.get("token_ids") or []
    if not text and not ids:
        return
    now = time.perf_counter()
    if st.ttft_ms is None:
        st.ttft_ms = (now - st.start) * 1e3
    elif st.last is not None:
        st.itl_ms.append((now - st.last) * 1e3)
    st.last = now
    st.chunks += 1
    st.text.append(str(text))
    st.ids.extend(int(t) for t in ids)


async def _read_stream(resp: aiohttp.ClientResponse, st: _Stream) -> None:
    async for raw in resp.content:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line or line.startswith(":"):
            continue
        if not line.startswith("data:"):
            if line.startswith(("event:", "id:", "retry:")):
                continue
            raise StreamError(f"not an SSE line: {line[:80]!r}")
        payload = line[len("data:") :].strip()
        if payload == "[DONE]":
            st.done = True
            return
        _take_chunk(st, payload)


async def stream_completion(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any], timeout_s: float
) -> Outcome:
    """POST ``body`` to ``{url}/v1/completions`` and read its SSE stream.

    Never raises for server or network trouble: the Outcome's ``error`` names the kind
    (see the module docstring) and ``error_detail`` the message. Cancellation propagates.
    """
    st = _Stream(start=time.perf_counter())
    status: list[int] = []  # set once a response arrives

    async def exchange() -> Outcome | None:
        async with http.post(f"{url.rstrip('/')}/v1/completions", json=body) as resp:
            status.append(resp.status)
            if resp.status >= 400:
                msg = _error_message(await resp.text())
                kind = "http_4xx" if resp.status < 500 else "http_5xx"
                return st.outcome(kind, f"HTTP {resp.status}: {msg}")
            await _read_stream(resp, st)
        return None

    try:
        failed = await asyncio.wait_for(exchange(), timeout_s)
    except asyncio.TimeoutError:
        return st.outcome("timeout", f"no complete answer within {timeout_s:g} s")
    except StreamError as exc:
        return st.outcome(exc.kind, str(exc))
    except aiohttp.ClientConnectorError as exc:
        return st.outcome("connect", str(exc))
    except (aiohttp.ClientError, UnicodeError, ValueError) as exc:
        kind = "stream" if status else "connect"
        return st.outcome(kind, f"{type(exc).__name__}: {exc}")
    if failed is not None:
        return failed
    if not st.done:
        return st.outcome("stream", "the stream ended without data: [DONE]")
    if st.ttft_ms is None and not (st.usage and st.usage.get("completion_tokens")):
        return st.outcome("stream", "the stream carried no tokens")
    return st.outcome()
