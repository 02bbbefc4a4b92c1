"""`stream_options.continuous_usage_stats` (as vLLM serves it): with `include_usage`,
every streamed chunk carries the usage so far, ending at the final usage; without it the
chunks carry none (`LocalBackend` on an in-process Engine over a real tiny model)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel

torch.set_num_threads(1)

NAME = "tiny-hybrid"
GREEDY = {"model": NAME, "temperature": 0, "ignore_eos": True, "stream": True}
CONTINUOUS = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    model_dir = make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("su") / "tiny")
    engine = Engine(model_dir, system="marconi", cache_bytes=50_000_000)
    with TestClient(build_app(LocalBackend(engine), ServedModel.load(model_dir, NAME))) as c:
        yield c


def chunks(client: TestClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    lines = [ln.removeprefix("data: ") for ln in response.text.split("\n\n") if ln]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def _check_running(got: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    final = got[-1]["usage"]
    assert got[-1]["choices"] == [] and final["completion_tokens"] == max_tokens
    content = got[:-1]
    assert all(c["usage"] is not None for c in content)
    done = [c["usage"]["completion_tokens"] for c in content]
    assert done == sorted(done) and done[-1] == final["completion_tokens"]
    for c in content:
        u = c["usage"]
        assert u["prompt_tokens"] == final["prompt_tokens"]
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["prompt_tokens_details"] == final["prompt_tokens_details"]
    return final


def test_completion_chunks_carry_the_usage_so_far(client: TestClient) -> None:
    body = {**GREEDY, "prompt": "Usage as it grows", "max_tokens": 7, **CONTINUOUS}
    got = chunks(client, "/v1/completions", body)
    _check_running(got, 7)
    plain = chunks(client, "/v1/completions", {**body, "stream_options": {"include_usage": True}})
    assert all(c["usage"] is None for c in plain[:-1]) and plain[-1]["usage"] is not None
    alone = {"stream_options": {"continuous_usage_stats": True}}
    bare = chunks(client, "/v1/completions", {**body, **alone})
    assert all(c["usage"] is None for c in bare)  # no include_usage: no usage anywhere


def test_chat_chunks_carry_the_usage_so_far_with_the_cached_tokens(client: TestClient) -> None:
    messages = [{"role": "user", "content": "Hello there"}]
    body = {**GREEDY, "messages": messages, "max_tokens": 5, **CONTINUOUS}
    first = chunks(client, "/v1/chat/completions", body)
    assert first[0]["usage"]["completion_tokens"] == 0  # the opening role chunk
    _check_running(first, 5)
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in first if c["choices"])
    messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "More"}]
    second = chunks(client, "/v1/chat/completions", {**body, "messages": messages})
    final = _check_running(second, 5)
    assert final["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_bad_flag_is_a_400_naming_it(client: TestClient) -> None:
    bad = {"stream_options": {"include_usage": True, "continuous_usage_stats": "yes"}}
    response = client.post("/v1/completions", json={**GREEDY, "prompt": "x", **bad})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stream_options.continuous_usage_stats"
