"""`serve --model tiny:FAMILY` for the families added in late 2026, over the OpenAI HTTP
API: each preset resolved (built) as the CLI resolves it, served by the same ingress app
(on an in-process engine through `LocalBackend`; the Ray path is the same app, covered
for a model with no KV by tests/serve/test_openai_e2e.py). A second chat turn hits the
cache, streamed equals whole, and a completion's tokens equal the engine's uncached
greedy tokens on the same ids."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from marconi_ray.engine.engine import Engine
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.model_source import resolve_model

torch.set_num_threads(1)

FAMILIES = (
    "mamba",
    "falcon_mamba",
    "mamba2",
    "olmo_hybrid",
    "recurrent_gemma",
    "kimi_linear",
    "minimax",
    "bailing_hybrid",
    "lfm3",
    "xlstm",
)
"""The families of issue 36 (each on its tiny preset)."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("presets")


@pytest.fixture(params=FAMILIES)
def served(request: pytest.FixtureRequest, root: Path) -> Iterator[tuple[str, Path, TestClient]]:
    spec = f"tiny:{request.param}"
    model_dir = resolve_model(spec, root=root)
    engine = Engine(model_dir, system="marconi", cache_bytes=50_000_000)
    app = build_app(LocalBackend(engine), ServedModel.load(model_dir, spec))
    with TestClient(app) as client:
        yield spec, model_dir, client


def _chat(client: TestClient, model: str, messages: list[dict[str, str]], stream: bool) -> Any:
    body = {"model": model, "messages": messages, "max_tokens": 6, "temperature": 0}
    if not stream:
        response = client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        reply = response.json()
        return reply["choices"][0]["message"]["content"], reply["usage"]
    body["stream"] = True
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    lines = [ln.removeprefix("data: ") for ln in response.text.split("\n\n") if ln]
    assert lines[-1] == "[DONE]"
    pieces = [json.loads(ln)["choices"] for ln in lines[:-1]]
    return "".join(c[0]["delta"].get("content") or "" for c in pieces if c), None


def test_a_family_preset_serves_chats_from_the_cache_and_exact_completions(served) -> None:
    spec, model_dir, client = served
    assert client.get("/v1/models").json()["data"][0]["id"] == spec
    messages: list[dict[str, str]] = []
    for turn, user in enumerate(["Hello there!", "Tell me more."]):
        messages.append({"role": "user", "content": user})
        text, usage = _chat(client, spec, messages, stream=False)
        streamed, _ = _chat(client, spec, messages, stream=True)
        assert streamed == text and usage["completion_tokens"] == 6
        if turn:
            assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        messages.append({"role": "assistant", "content": text})
    prompt = list(range(40, 90))
    body = {
        "model": spec,
        "prompt": prompt,
        "max_tokens": 6,
        "temperature": 0,
        "return_token_ids": True,
        "ignore_eos": True,
    }
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    want = Engine(model_dir, system="vanilla").generate(
        prompt, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    )
    assert response.json()["choices"][0]["token_ids"] == list(want.tokens)
