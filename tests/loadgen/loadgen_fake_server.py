"""A tiny fake OpenAI streaming /v1/completions server (aiohttp TestServer) on its own
thread and event loop, for the load generator's client tests.

A request's ``fake`` field picks the behaviour: ``ok`` (default), ``http_400``,
``http_500``, ``malformed``, ``no_done``, ``error_chunk``, ``slow`` (sleeps 5 s); prompts
longer than ``FakeState.fail_over`` get a 500. Good
streams emit one chunk per token (ids 100, 101, ...) with ``token_ids`` when
``return_token_ids`` is set, then a usage chunk whose ``cached_tokens`` is the longest
prefix shared with an earlier prompt, then ``[DONE]``. GET /metrics serves marconi_*
counters built from those figures.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer


@dataclass
class FakeState:
    prompts: list[list[int]] = field(default_factory=list)
    hit_tokens: int = 0
    input_tokens: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    fail_over: int | None = None  # answer 500 to prompts longer than this


def _hit(prompts: list[list[int]], prompt: list[int]) -> int:
    best = 0
    for p in prompts:
        n = 0
        for a, b in zip(p, prompt, strict=False):
            if a != b:
                break
            n += 1
        best = max(best, n)
    return min(best, len(prompt) - 1)


def _chunk(text: str, ids: list[int] | None) -> bytes:
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": None}
    if ids is not None:
        choice["token_ids"] = ids
    return f"data: {json.dumps({'choices': [choice]})}\n\n".encode()


def make_app(state: FakeState) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        state.bodies.append(body)
        mode = body.get("fake", "ok")
        if mode == "http_400":
            err = {"error": {"message": "prompt is too long", "type": "BadRequestError"}}
            return web.json_response(err, status=400)
        too_long = state.fail_over is not None and len(body["prompt"]) > state.fail_over
        if mode == "http_500" or too_long:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if mode == "slow":
            await asyncio.sleep(5)
        if mode == "malformed":
            await resp.write(b"data: {not json\n\n")
            return resp
        prompt = body["prompt"] if isinstance(body["prompt"], list) else [1] * len(body["prompt"])
        want_ids = bool(body.get("return_token_ids"))
        n = int(body["max_tokens"])
        for i in range(n):
            await asyncio.sleep(0.002)
            await resp.write(_chunk("t", [100 + i] if want_ids else None))
            if mode == "error_chunk" and i == 0:
                await resp.write(b'data: {"error": {"message": "generation failed"}}\n\n')
                await resp.write(b"data: [DONE]\n\n")
                return resp
        hit = _hit(state.prompts, prompt)
        state.prompts.append(list(prompt) + [100 + i for i in range(n)])
        state.hit_tokens += hit
        state.input_tokens += len(prompt)
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": n,
            "total_tokens": len(prompt) + n,
            "prompt_tokens_details": {"cached_tokens": hit},
        }
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        if mode != "no_done":
            await resp.write(b"data: [DONE]\n\n")
        return resp

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def metrics(_: web.Request) -> web.Response:
        lines = [
            "# TYPE marconi_cache_hit_tokens counter",
            f'marconi_cache_hit_tokens_total{{replica="r0"}} {state.hit_tokens}',
            "# TYPE marconi_cache_input_tokens counter",
            f'marconi_cache_input_tokens_total{{replica="r0"}} {state.input_tokens}',
            "# TYPE marconi_cache_evictions counter",
            'marconi_cache_evictions_total{replica="r0"} 0',
            "# TYPE marconi_cache_alpha gauge",
            'marconi_cache_alpha{replica="r0"} 0.5',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    return app


@contextmanager
def fake_server() -> Iterator[tuple[str, FakeState]]:
    """Run the fake on 127.0.0.1 (a free port); yields its base URL and its state."""
    state = FakeState()
    loop = asyncio.new_event_loop()
    server = TestServer(make_app(state), host="127.0.0.1", port=0)
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start_server(), loop).result(10)
    try:
        yield str(server.make_url("")).rstrip("/"), state
    finally:
        asyncio.run_coroutine_threadsafe(server.close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
