"""The streaming client against a real local HTTP server (the fake): timings, usage, ids,
and every error kind classified without raising."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from loadgen.client import Outcome, stream_completion


def _call(url: str, body: dict[str, Any], timeout_s: float = 10.0) -> Outcome:
    async def go() -> Outcome:
        async with aiohttp.ClientSession() as http:
            return await stream_completion(http, url, body, timeout_s)

    return asyncio.run(go())


BODY = {
    "prompt": [7, 8, 9, 10],
    "max_tokens": 5,
    "stream": True,
    "stream_options": {"include_usage": True},
    "return_token_ids": True,
}


def test_good_stream(fake):
    url, _ = fake
    out = _call(url, BODY)
    assert out.error is None
    assert out.output_ids == (100, 101, 102, 103, 104) and out.output_tokens == 5
    assert out.prompt_tokens == 4 and out.text == "ttttt"
    assert len(out.itl_ms) == 4 and all(x > 0 for x in out.itl_ms)
    assert out.ttft_ms is not None and out.e2el_ms is not None and 0 < out.ttft_ms <= out.e2el_ms


def test_cached_tokens_come_from_usage(fake):
    url, _ = fake
    first = _call(url, {**BODY, "prompt": [50, 51, 52, 53]})
    again = _call(url, {**BODY, "prompt": [50, 51, 52, 53, 100, 101, 60]})
    assert first.error is None and again.cached_tokens >= 6


@pytest.mark.parametrize(
    ("mode", "kind", "detail"),
    [
        ("http_400", "http_4xx", "prompt is too long"),
        ("http_500", "http_5xx", "boom"),
        ("malformed", "stream", "malformed"),
        ("no_done", "stream", "DONE"),
        ("error_chunk", "http_5xx", "generation failed"),
    ],
)
def test_server_errors_are_classified(fake, mode, kind, detail):
    url, _ = fake
    out = _call(url, {**BODY, "fake": mode})
    assert out.error == kind and out.error_detail is not None and detail in out.error_detail
    assert out.e2el_ms is None


def test_timeout_is_classified(fake):
    url, _ = fake
    out = _call(url, {**BODY, "fake": "slow"}, timeout_s=0.3)
    assert out.error == "timeout"


def test_connection_refused_is_classified():
    out = _call("http://127.0.0.1:1", BODY)
    assert out.error == "connect" and out.error_detail
