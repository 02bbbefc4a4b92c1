"""Log-probabilities through the OpenAI API (`LocalBackend` on an in-process Engine over a
real tiny model): completions' `logprobs` and `echo` (lm-evaluation-harness's
loglikelihood request: `max_tokens` 0), chat's `logprobs` / `top_logprobs`, streamed equal
to whole, every value equal to the log-softmax of the model's own logits over the whole
sequence; bad values get a 400 naming the field."""

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
GREEDY = {"model": NAME, "temperature": 0, "ignore_eos": True}
ATOL = 1e-4


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, Engine]]:
    model_dir = make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("lp") / "tiny")
    engine = Engine(model_dir, system="marconi", cache_bytes=50_000_000)
    app = build_app(LocalBackend(engine), ServedModel.load(model_dir, NAME))
    with TestClient(app) as client:
        yield client, engine


def post(client: TestClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    out: dict[str, Any] = response.json()
    return out


def streamed(client: TestClient, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    response = client.post(path, json={**body, "stream": True})
    assert response.status_code == 200, response.text
    lines = [ln.removeprefix("data: ") for ln in response.text.split("\n\n") if ln]
    assert lines[-1] == "[DONE]"
    return [json.loads(ln) for ln in lines[:-1]]


def reference(engine: Engine, ids: list[int]) -> torch.Tensor:
    """log-softmax [L, V] of the model's logits over `ids` from scratch."""
    logits = engine.model.forward_logits(torch.as_tensor(ids, dtype=torch.long))
    return torch.log_softmax(logits.float(), dim=-1)


def test_completion_logprobs_match_the_model_streamed_and_whole(served) -> None:
    client, engine = served
    body = {
        **GREEDY,
        "prompt": "The cache",
        "max_tokens": 6,
        "logprobs": 3,
        "return_token_ids": True,
    }
    whole = post(client, "/v1/completions", body)
    choice = whole["choices"][0]
    lp = choice["logprobs"]
    ids = choice["token_ids"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(ids) == 6
    prompt = engine.tokenizer.encode("The cache")
    want = reference(engine, prompt + ids)
    for i, (token, value, top) in enumerate(
        zip(ids, lp["token_logprobs"], lp["top_logprobs"], strict=True)
    ):
        row = want[len(prompt) - 1 + i]
        assert value == pytest.approx(float(row[token]), abs=ATOL)
        assert 1 <= len(top) <= 3  # tokens whose texts coincide show once
        assert max(top.values()) == pytest.approx(float(row.max()), abs=ATOL)
        assert value == pytest.approx(max(top.values()), abs=ATOL)  # greedy: the top one
    assert lp["text_offset"][0] == 0
    assert lp["text_offset"] == sorted(lp["text_offset"])
    chunks = streamed(client, "/v1/completions", body)
    joined: dict[str, list[Any]] = {k: [] for k in lp}
    for chunk in chunks:
        for k in joined:
            joined[k] += chunk["choices"][0]["logprobs"][k]
    # the streamed run's prompt is a cached hit: the same tokens, values to float noise
    assert joined["tokens"] == lp["tokens"] and joined["text_offset"] == lp["text_offset"]
    assert joined["token_logprobs"] == pytest.approx(lp["token_logprobs"], abs=ATOL)
    for got, want_top in zip(joined["top_logprobs"], lp["top_logprobs"], strict=True):
        assert got == pytest.approx(want_top, abs=ATOL)
    plain = post(client, "/v1/completions", {**GREEDY, "prompt": "The cache", "max_tokens": 6})
    assert plain["choices"][0]["logprobs"] is None
    assert plain["choices"][0]["text"] == choice["text"]


def test_echo_with_zero_max_tokens_scores_the_prompt_alone(served) -> None:
    client, engine = served
    text = "Prefix caching for hybrid models"
    first = engine.tokenizer.encode(text)
    turn = {**GREEDY, "prompt": first, "max_tokens": 3, "return_token_ids": True}
    answer = post(client, "/v1/completions", turn)["choices"][0]["token_ids"]
    # the next turn's prompt starts with a cached state (after the last decoded token)
    for prompt in (first, first + answer + engine.tokenizer.encode(" next")):
        body = {**GREEDY, "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 1}
        out = post(client, "/v1/completions", body)
        choice = out["choices"][0]
        assert choice["text"] == engine.tokenizer.decode(prompt)
        assert choice["finish_reason"] == "length"
        assert out["usage"]["completion_tokens"] == 0
        assert out["usage"]["prompt_tokens"] == len(prompt)
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(prompt)
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        want = reference(engine, prompt)
        expected = [float(want[p - 1, prompt[p]]) for p in range(1, len(prompt))]
        assert lp["token_logprobs"][1:] == pytest.approx(expected, abs=ATOL)
    assert out["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    chunks = streamed(client, "/v1/completions", {**body, "prompt": text})
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    assert sum(len(c["choices"][0]["logprobs"]["tokens"]) for c in chunks) == len(first)


def test_echo_puts_the_prompt_before_the_output(served) -> None:
    client, engine = served
    prompt = engine.tokenizer.encode("ab")
    body = {**GREEDY, "prompt": prompt, "max_tokens": 3, "echo": True, "logprobs": 0}
    choice = post(client, "/v1/completions", body)["choices"][0]
    generated = post(client, "/v1/completions", {**GREEDY, "prompt": prompt, "max_tokens": 3})
    assert choice["text"] == engine.tokenizer.decode(prompt) + generated["choices"][0]["text"]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(prompt) + 3
    assert all(t == {} for t in lp["top_logprobs"][1:])  # logprobs 0: no alternatives
    no_lp = post(client, "/v1/completions", {**body, "logprobs": None})["choices"][0]
    assert no_lp["text"] == choice["text"] and no_lp["logprobs"] is None


def test_chat_logprobs_and_top_logprobs(served) -> None:
    client, _ = served
    messages = [{"role": "user", "content": "hello there"}]
    body = {
        **GREEDY,
        "messages": messages,
        "max_tokens": 5,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
    }
    choice = post(client, "/v1/chat/completions", body)["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == len(choice["token_ids"]) == 5
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert bytes(entry["bytes"]).decode() == entry["token"]
        assert len(entry["top_logprobs"]) == 2
        first, second = entry["top_logprobs"]
        assert first["logprob"] >= second["logprob"]
        assert entry["logprob"] == pytest.approx(first["logprob"], abs=ATOL)  # greedy
    chunks = streamed(client, "/v1/chat/completions", body)
    joined = [
        e for c in chunks for e in (c["choices"][0].get("logprobs") or {"content": []})["content"]
    ]
    assert [e["token"] for e in joined] == [e["token"] for e in content]
    assert [e["logprob"] for e in joined] == pytest.approx(
        [e["logprob"] for e in content], abs=ATOL
    )
    only = post(client, "/v1/chat/completions", {**body, "top_logprobs": None})["choices"][0]
    assert [e["top_logprobs"] for e in only["logprobs"]["content"]] == [[]] * 5
    values = [e["logprob"] for e in content]
    assert [e["logprob"] for e in only["logprobs"]["content"]] == pytest.approx(values, abs=ATOL)


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": -1}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "logprobs": "2"}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "echo": 1}, "echo"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0, "logprobs": 1}, "max_tokens"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 99},
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "logprobs": 1},
            "logprobs",
        ),
    ],
)
def test_bad_logprob_fields_are_400_naming_them(served, path, fields, param) -> None:
    client, engine = served
    response = client.post(path, json={**GREEDY, **fields})
    assert response.status_code == 400, response.text
    err = response.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error"
    assert engine.planner.open_requests == 0
