"""The OpenAI FastAPI app over a real tiny model (`LocalBackend` on an in-process Engine,
no Ray): streamed and whole answers agree, chat turns hit the prefix cache, stop strings
cut the text, and every bad input gets its 4xx in OpenAI's error shape and changes nothing.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from marconi_ray.core.cache import cache_codec
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.byte_tokenizer import BYTE_OFFSET
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.messages import Dispatch, ReplicaStats

torch.set_num_threads(1)

NAME = "tiny-hybrid"
GREEDY = {"model": NAME, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("serve") / "tiny")


def make_app(model_dir: Path) -> tuple[Any, Engine]:
    engine = Engine(model_dir, system="marconi", cache_bytes=50_000_000)
    return build_app(LocalBackend(engine), ServedModel.load(model_dir, NAME)), engine


@pytest.fixture(scope="module")
def served(model_dir: Path) -> Iterator[tuple[TestClient, Engine]]:
    app, engine = make_app(model_dir)
    with TestClient(app) as client:
        yield client, engine


@pytest.fixture
def client(served: tuple[TestClient, Engine]) -> TestClient:
    return served[0]


def events(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON events of an SSE body, checking it ends with [DONE]."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = [ln for ln in response.text.split("\n\n") if ln]
    assert all(ln.startswith("data: ") for ln in lines)
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]


def post(client: TestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def test_completion_whole_and_streamed_agree(client: TestClient) -> None:
    body = {**GREEDY, "prompt": "Hello, hybrid world", "max_tokens": 12}
    whole = post(client, "/v1/completions", body)
    assert whole["object"] == "text_completion" and whole["id"].startswith("cmpl-")
    assert whole["model"] == NAME
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    usage = whole["usage"]
    assert usage["prompt_tokens"] == len(b"Hello, hybrid world")
    assert usage["completion_tokens"] == 12 and usage["total_tokens"] == usage["prompt_tokens"] + 12
    assert "cached_tokens" in usage["prompt_tokens_details"]

    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    chunks = events(client.post("/v1/completions", json=stream_body))
    *content, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 12
    assert {c["id"] for c in chunks} == {chunks[0]["id"]}
    assert "".join(c["choices"][0]["text"] for c in content) == choice["text"]
    assert content[-1]["choices"][0]["finish_reason"] == "length"

    ids = [BYTE_OFFSET + b for b in b"Hello, hybrid world"]
    token_prompt = {**body, "prompt": ids}
    assert post(client, "/v1/completions", token_prompt)["choices"][0]["text"] == choice["text"]


def test_chat_whole_and_streamed_agree(client: TestClient) -> None:
    body = {**GREEDY, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 10}
    whole = post(client, "/v1/chat/completions", body)
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    message = whole["choices"][0]["message"]
    assert message["role"] == "assistant"
    chunks = events(client.post("/v1/chat/completions", json={**body, "stream": True}))
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == message["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    assert all(c.get("usage") is None for c in chunks)  # no include_usage: no usage chunk


def test_second_chat_turn_hits_the_cache(client: TestClient) -> None:
    # A reply that survives decode -> re-encode (ASCII) makes turn 2 extend turn 1's tokens.
    for i in range(64):
        first = [{"role": "user", "content": f"question {i}"}]
        turn1 = post(client, "/v1/chat/completions", {**GREEDY, "messages": first, "max_tokens": 3})
        reply = turn1["choices"][0]["message"]["content"]
        if len(reply) == 3 and reply.isascii():
            break
    else:
        pytest.fail("no ASCII reply found")
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": "and?"}]
    turn2 = post(client, "/v1/chat/completions", {**GREEDY, "messages": second, "max_tokens": 3})
    cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Beyond the shared "question " prefix: the whole first turn (prompt + reply) is reused.
    assert cached >= turn1["usage"]["prompt_tokens"] + len(reply)


def test_stop_string_cuts_whole_and_streamed(served: tuple[TestClient, Engine]) -> None:
    client, engine = served
    body = {**GREEDY, "prompt": "stop strings", "max_tokens": 16}
    text = post(client, "/v1/completions", body)["choices"][0]["text"]
    i = next(k for k in range(2, len(text)) if text[k] != "\ufffd")
    stop = text[i]
    expected = text[: text.find(stop)]
    whole = post(client, "/v1/completions", {**body, "stop": [stop, "never-seen"]})
    assert whole["choices"][0] == {
        "index": 0,
        "text": expected,
        "finish_reason": "stop",
        "logprobs": None,
    }
    assert whole["usage"]["completion_tokens"] < 16
    streamed = events(client.post("/v1/completions", json={**body, "stop": stop, "stream": True}))
    assert "".join(c["choices"][0]["text"] for c in streamed) == expected
    assert streamed[-1]["choices"][0]["finish_reason"] == "stop"
    assert engine.planner.open_requests == 0 and engine.num_running == 0


BAD_COMPLETIONS = [
    ({"prompt": ""}, 400, "prompt", None),
    ({"prompt": []}, 400, "prompt", None),
    ({"prompt": ["a", "b"]}, 400, "prompt", None),
    ({"prompt": [5, 600, 7]}, 400, "prompt", None),
    ({"prompt": [5, -1]}, 400, "prompt", None),
    ({"prompt": [65] * 4096}, 400, "prompt", "context_length_exceeded"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", None),
    ({"prompt": "x", "max_tokens": -3}, 400, "max_tokens", None),
    ({"prompt": "x", "max_tokens": 10**9}, 400, "max_tokens", None),
    ({"prompt": "x", "max_tokens": "5"}, 400, "max_tokens", None),
    ({"prompt": "x", "temperature": 3}, 400, "temperature", None),
    ({"prompt": "x", "top_p": 0}, 400, "top_p", None),
    ({"prompt": "x", "n": 3}, 400, "n", None),
    ({"prompt": "x", "stop_token_ids": [100000]}, 400, "stop_token_ids", None),
    ({"prompt": "x", "model": "gpt-4"}, 404, "model", "model_not_found"),
]


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    err: dict[str, Any] = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["message"]
    return err


@pytest.mark.parametrize(("fields", "status", "param", "code"), BAD_COMPLETIONS)
def test_bad_completion_requests(
    served: tuple[TestClient, Engine],
    fields: dict[str, Any],
    status: int,
    param: str,
    code: str | None,
) -> None:
    client, engine = served
    before = (
        cache_codec.snapshot(engine.cache),
        engine.store.bytes_used,
        engine.cache.stats.to_dict(),
    )
    err = error_of(client.post("/v1/completions", json={**GREEDY, **fields}), status)
    assert err["param"] == param and err["code"] == code
    assert (
        cache_codec.snapshot(engine.cache),
        engine.store.bytes_used,
        engine.cache.stats.to_dict(),
    ) == before
    assert engine.planner.open_requests == 0


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x" * 5000}]}, "messages"),
        ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, None),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
    ],
)
def test_bad_chat_requests(client: TestClient, fields: dict[str, Any], param: str | None) -> None:
    err = error_of(client.post("/v1/chat/completions", json={**GREEDY, **fields}), 400)
    assert err["param"] == (param or "max_completion_tokens")


def test_malformed_bodies_and_routes(client: TestClient) -> None:
    headers = {"content-type": "application/json"}
    err = error_of(client.post("/v1/completions", content=b"{not json", headers=headers), 400)
    assert "JSON" in err["message"]
    err = error_of(client.post("/v1/completions", content=b"[1, 2]", headers=headers), 400)
    assert "JSON object" in err["message"]
    error_of(client.post("/v1/chat/completions", content=b"\xff\xfe", headers=headers), 400)
    err = error_of(client.get("/v1/nothing-here"), 404)
    assert err["code"] == "not_found"
    error_of(client.get("/v1/completions"), 405)


def test_models_health_metrics(client: TestClient) -> None:
    models = client.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["object"]) for m in models["data"]] == [(NAME, "model")]
    health = client.get("/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    post(client, "/v1/completions", {**GREEDY, "prompt": "metrics", "max_tokens": 2})
    client.post("/v1/completions", json={**GREEDY, "prompt": ""})
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(response.text)
        for s in f.samples
    }
    assert got[("marconi_ttft_seconds_count", ())] >= 1
    assert got[("marconi_e2e_latency_seconds_count", ())] >= 1
    assert got[("marconi_requests_total", (("status", "200"),))] >= 1
    assert got[("marconi_requests_total", (("status", "400"),))] >= 1
    assert got[("marconi_cache_input_tokens_total", (("replica", "local"),))] > 0
    assert got[("marconi_cache_capacity_bytes", (("replica", "local"),))] == 50_000_000


class DownBackend:
    """A backend whose coordinator cannot be reached."""

    async def plan(self, prompt: Any, params: Any, submitted: float) -> Dispatch:
        raise ConnectionError("coordinator unreachable")

    def generate(self, dispatch: Dispatch) -> Any:
        raise AssertionError("never called")

    async def stats(self) -> list[ReplicaStats]:
        raise ConnectionError("coordinator unreachable")

    async def tuner_runs(self) -> int:
        raise ConnectionError("coordinator unreachable")


def test_backend_down_gives_503(model_dir: Path) -> None:
    app = build_app(DownBackend(), ServedModel.load(model_dir, NAME))
    with TestClient(app) as client:
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json()["error"]["type"] == "service_unavailable"
        response = client.post("/v1/completions", json={**GREEDY, "prompt": "x"})
        assert response.status_code == 503 and "unreachable" in response.json()["error"]["message"]
        assert client.get("/metrics").status_code == 200


def test_concurrent_requests_share_decode_steps(model_dir: Path) -> None:
    """Several requests in flight at once give the same texts as one at a time."""
    app, engine = make_app(model_dir)
    prompts = [f"concurrent {i}" for i in range(3)]

    async def run() -> tuple[list[str], list[str]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:

            async def one(prompt: str) -> str:
                body = {**GREEDY, "prompt": prompt, "max_tokens": 8}
                response = await http.post("/v1/completions", json=body)
                assert response.status_code == 200, response.text
                text: str = response.json()["choices"][0]["text"]
                return text

            together = await asyncio.gather(*(one(p) for p in prompts))
            apart = [await one(p) for p in prompts]
        return list(together), apart

    together, apart = asyncio.run(run())
    assert together == apart
    assert engine.planner.open_requests == 0
    assert np.all(np.array([len(t) for t in apart]) > 0)


def test_return_token_ids_extension(client):
    """`return_token_ids` returns the generated ids, whole and per chunk, and they are
    exactly what the cache then holds: prompt + ids is served wholly from the cache."""
    body = {
        "model": NAME,
        "prompt": [7, 8, 9, 10, 11],
        "max_tokens": 5,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    whole = client.post("/v1/completions", json=body).json()
    ids = whole["choices"][0]["token_ids"]
    assert len(ids) == 5
    streamed = []
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for choice in chunk["choices"]:
                    streamed.extend(choice.get("token_ids") or [])
    assert streamed == ids
    again = client.post(
        "/v1/completions", json={**body, "prompt": body["prompt"] + ids, "return_token_ids": False}
    ).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 10
    assert "token_ids" not in again["choices"][0]


def test_stream_interval_sends_fewer_chunks_with_exact_usage(model_dir: Path) -> None:
    """`stream_interval=4`: every streamed chunk but the last carries at least 4 tokens,
    the chunks' texts and token ids are the whole answer's, and the usage is exact; a
    stop string still cuts where it does in the whole answer."""
    engine = Engine(model_dir, system="marconi", cache_bytes=50_000_000)
    app = build_app(LocalBackend(engine), ServedModel.load(model_dir, NAME), stream_interval=4)
    body = {**GREEDY, "prompt": "interval", "max_tokens": 14, "return_token_ids": True}
    with TestClient(app) as client:
        whole = post(client, "/v1/completions", body)["choices"][0]
        stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        *content, last = events(client.post("/v1/completions", json=stream_body))
        text = whole["text"]
        stop = text[next(k for k in range(6, len(text)) if text[k] != "\ufffd")]
        cut = events(client.post("/v1/completions", json={**stream_body, "stop": stop}))
    ids = [choice["token_ids"] for choice in (c["choices"][0] for c in content)]
    assert all(len(chunk) >= 4 for chunk in ids[:-1]) and len(ids) <= 4
    assert [t for chunk in ids for t in chunk] == whole["token_ids"]
    assert "".join(c["choices"][0]["text"] for c in content) == text
    assert last["usage"]["completion_tokens"] == 14
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    *cut_content, _ = cut
    assert "".join(c["choices"][0]["text"] for c in cut_content) == text[: text.find(stop)]
    assert cut_content[-1]["choices"][0]["finish_reason"] == "stop"
    with pytest.raises(ValueError, match="stream_interval must be an integer >= 1, got 0"):
        build_app(LocalBackend(engine), ServedModel.load(model_dir, NAME), stream_interval=0)


class BehindStream:
    """A request's events all generated before its consumer reads the first: the stream
    of a client that is behind (everything ready at every read)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.items: list[Any] | None = None

    def __aiter__(self) -> BehindStream:
        return self

    async def __anext__(self) -> Any:
        if self.items is None:
            self.items = [event async for event in self.inner]
        if not self.items:
            raise StopAsyncIteration
        return self.items.pop(0)

    def ready(self) -> bool:
        return bool(self.items)

    def cancel(self) -> None:
        self.inner.cancel()


class BehindBackend(LocalBackend):
    def generate(self, dispatch: Any, stream: bool = True) -> Any:
        return BehindStream(super().generate(dispatch, stream))


def test_a_client_behind_gets_every_ready_token_in_one_chunk_with_exact_usage(
    model_dir: Path,
) -> None:
    """When tokens wait for the client, the next chunk carries all of them: here the
    whole answer in one chunk, its ids and text the whole answer's, usage exact; with a
    stop string the chunk ends where the whole answer does and usage counts the tokens
    up to the stop, as the whole answer's does."""
    model = ServedModel.load(model_dir, NAME)
    engine = Engine(model_dir, system="marconi", cache_bytes=50_000_000)
    body = {**GREEDY, "prompt": "behind", "max_tokens": 14, "return_token_ids": True}
    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with TestClient(build_app(LocalBackend(engine), model)) as client:
        whole = post(client, "/v1/completions", body)
        text = whole["choices"][0]["text"]
        stop = text[next(k for k in range(6, len(text)) if text[k] != "\ufffd")]
        whole_cut = post(client, "/v1/completions", {**body, "stop": stop})
    with TestClient(build_app(BehindBackend(engine), model)) as client:
        *content, last = events(client.post("/v1/completions", json=stream_body))
        *cut, cut_last = events(client.post("/v1/completions", json={**stream_body, "stop": stop}))
    (chunk,) = content
    assert chunk["choices"][0]["token_ids"] == whole["choices"][0]["token_ids"]
    assert chunk["choices"][0]["text"] == text and chunk["choices"][0]["finish_reason"] == "length"
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")  # the hits differ
    assert [last["usage"][k] for k in counts] == [whole["usage"][k] for k in counts]
    assert last["usage"]["completion_tokens"] == 14
    (cut_chunk,) = cut
    assert cut_chunk["choices"][0]["text"] == text[: text.find(stop)]
    assert cut_chunk["choices"][0]["finish_reason"] == "stop"
    assert [cut_last["usage"][k] for k in counts] == [whole_cut["usage"][k] for k in counts]
    assert cut_last["usage"]["completion_tokens"] < 14
    assert cut_chunk["choices"][0]["token_ids"] == whole_cut["choices"][0]["token_ids"]
