"""Fuzzing the two POST endpoints of the OpenAI app over a real tiny model (`LocalBackend`,
no Ray): random JSON documents (any shape, big and negative numbers, NaN/Infinity, unicode
with lone surrogates, deep nesting, strings up to and past the body limit), valid requests
with one field mutated or dropped, and random raw bytes. Whatever comes in, the status is
never 5xx, every error is OpenAI's error JSON, and every 200 is a well-formed answer (a
stream never carries an error event).

Generation is capped at a few tokens by the backend wrapper (`CappedBackend`) so the run
stays fast; validation, planning and streaming are the real ones.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.messages import Dispatch

torch.set_num_threads(1)

NAME = "tiny-hybrid"
LIMIT = 65_536
MAX_NEW = 3
PATHS = ("/v1/completions", "/v1/chat/completions")
FIELDS = (
    "model",
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "user",
    "ignore_eos",
    "return_token_ids",
    "stop_token_ids",
)
EXAMPLES = int(os.environ.get("MARCONI_FUZZ_EXAMPLES", "150"))  # raise it for a long run
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class CappedBackend(LocalBackend):
    """`LocalBackend` that generates at most `MAX_NEW` tokens per request."""

    async def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float
    ) -> Dispatch:
        capped = dataclasses.replace(params, max_tokens=min(params.max_tokens, MAX_NEW))
        return await super().plan(prompt, capped, submitted)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    model_dir = make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("fuzz") / "tiny")
    engine = Engine(model_dir, system="marconi", cache_bytes=20_000_000)
    app = build_app(CappedBackend(engine), ServedModel.load(model_dir, NAME), max_body_bytes=LIMIT)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


# ---------------------------------------------------------------------- strategies
# Unicode including lone surrogates (category Cs), which json.dumps escapes as \udXXX.
any_text = st.one_of(
    st.text(st.characters(codec=None, exclude_categories=()), max_size=40),
    st.sampled_from(["\ud800", "a\udfffb", "\ud83d\ude00", "\ufeff", "\x00", "\u202e"]),
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(2**200), max_value=2**200),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e308, 5e-324, float("nan"), float("inf"), float("-inf")]),
)
nan_like = st.sampled_from(["NaN", "nan", "Infinity", "-Infinity", "inf", "1e999", "", "null"])
scalars = st.one_of(st.none(), st.booleans(), numbers, any_text, nan_like)
json_values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.one_of(st.sampled_from(FIELDS), any_text), children, max_size=5),
    ),
    max_leaves=20,
)
big_strings = st.builds(
    lambda char, n: char * n,
    st.sampled_from(["x", "\u00e9", "\U0001f600", "\\", '"', "\x00"]),
    st.integers(min_value=0, max_value=LIMIT + 100),
)


def valid_request(path: str) -> st.SearchStrategy[dict[str, Any]]:
    """A valid request for `path` (a few tokens, maybe streamed, maybe with extras)."""
    base = st.fixed_dictionaries(
        {"model": st.just(NAME), "max_tokens": st.integers(1, MAX_NEW)},
        optional={
            "temperature": st.sampled_from([0, 0.7, 2]),
            "top_p": st.sampled_from([0.5, 1]),
            "top_k": st.sampled_from([-1, 0, 1, 5, 10**6]),
            "seed": st.sampled_from([0, 7, 2**31, 2**63, 2**64 - 1]),
            "stream": st.booleans(),
            "stop": st.one_of(st.text(min_size=1, max_size=3), st.just(["a", "b"])),
            "ignore_eos": st.booleans(),
            "return_token_ids": st.booleans(),
            "stop_token_ids": st.lists(st.integers(0, 300), max_size=3),
            "user": any_text,
        },
    )
    if path == "/v1/completions":
        prompt = st.one_of(
            st.text(min_size=1, max_size=60),  # valid Unicode (no lone surrogates)
            st.lists(st.integers(0, 255), min_size=1, max_size=30),
        )
        extra: dict[str, Any] = {"prompt": prompt}
    else:
        message = st.fixed_dictionaries(
            {
                "role": st.sampled_from(["system", "developer", "user", "assistant"]),
                "content": st.one_of(
                    st.text(max_size=40),
                    st.lists(st.builds(lambda t: {"type": "text", "text": t}, st.text())),
                ),
            }
        )
        extra = {"messages": st.lists(message, min_size=1, max_size=3)}
    return st.builds(lambda a, b: {**a, **b}, base, st.fixed_dictionaries(extra))


def mutated(path: str) -> st.SearchStrategy[dict[str, Any]]:
    """A valid request with one field replaced by anything, dropped, or one extra added."""

    def mutate(body: dict[str, Any], how: str, key: str, value: Any) -> dict[str, Any]:
        out = dict(body)
        if how == "drop":
            out.pop(key, None)
        else:
            out[key] = value
        return out

    keys = st.one_of(st.sampled_from(FIELDS), any_text)
    return st.builds(
        mutate,
        valid_request(path),
        st.sampled_from(["drop", "set"]),
        keys,
        st.one_of(json_values, big_strings),
    )


def encode(value: Any, ascii_only: bool) -> bytes:
    text = json.dumps(value, allow_nan=True, ensure_ascii=ascii_only)
    return text.encode("utf-8", "surrogatepass")  # a lone surrogate: invalid UTF-8 bytes


deep = st.builds(
    lambda n, open_, close: (open_ * n + close * n).encode(),
    st.integers(min_value=1, max_value=LIMIT // 2),
    st.sampled_from(["[", '{"a":']),
    st.just("]"),
)
bodies = st.one_of(
    st.builds(encode, json_values, st.booleans()),
    st.builds(encode, st.dictionaries(st.sampled_from(FIELDS), json_values), st.booleans()),
    st.builds(encode, st.sampled_from(PATHS).flatmap(mutated), st.booleans()),
    st.builds(encode, st.sampled_from(PATHS).flatmap(valid_request), st.just(True)),
    st.builds(encode, big_strings, st.just(True)),
    st.builds(lambda b: b, st.binary(max_size=300)),
    deep.map(lambda b: b.replace(b'{"a":]', b'{"a":1}')),
    deep,
)
content_types = st.sampled_from(
    ["application/json", "text/plain", "application/octet-stream", "", "application/json; x=y"]
)


# ---------------------------------------------------------------------- checks
def check_error(response: Any) -> None:
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error", err
    assert err["param"] is None or isinstance(err["param"], str)
    assert err["code"] is None or isinstance(err["code"], str)


def check_answer(path: str, response: Any) -> None:
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [e for e in response.text.split("\n\n") if e]
        assert events and events[-1] == "data: [DONE]", response.text[-500:]
        for event in events[:-1]:
            assert event.startswith("data: ")
            chunk = json.loads(event.removeprefix("data: "))
            assert "error" not in chunk, chunk  # a 500 in disguise
            assert chunk["model"] == NAME
        return
    body = response.json()
    assert body["object"] == ("text_completion" if path == PATHS[0] else "chat.completion")
    assert 1 <= body["usage"]["completion_tokens"] <= MAX_NEW
    assert len(body["choices"]) == 1


def check(client: TestClient, path: str, content: bytes, content_type: str) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    response = client.post(path, content=content, headers=headers)
    if currently_in_test_context():
        event(f"status {response.status_code}")  # see --hypothesis-show-statistics
    assert response.status_code < 500, (response.status_code, response.text[:500], content[:200])
    if response.status_code == 200:
        check_answer(path, response)
    else:
        check_error(response)
        if len(content) > LIMIT:
            assert response.status_code == 413


@FUZZ
@given(path=st.sampled_from(PATHS), content=bodies, content_type=content_types)
def test_fuzz_bodies(client: TestClient, path: str, content: bytes, content_type: str) -> None:
    check(client, path, content, content_type)


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_requests(client: TestClient, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(PATHS))
    body = data.draw(mutated(path))
    check(client, path, encode(body, data.draw(st.booleans())), "application/json")


@settings(max_examples=max(30, EXAMPLES // 5), deadline=None, database=None)
@given(data=st.data())
def test_fuzz_valid_requests_succeed(client: TestClient, data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(PATHS))
    body = data.draw(valid_request(path))
    content = encode(body, ascii_only=True)
    response = client.post(path, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, (response.text, body)
    check_answer(path, response)


@pytest.mark.parametrize("path", PATHS)
def test_known_nasty_bodies(client: TestClient, path: str) -> None:
    """Regressions: each once found (or feared) to give a 5xx."""
    nasty = [
        b"[" * 30_000 + b"]" * 30_000,  # deep nesting: RecursionError in json.loads
        b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
        b'{"model": "' + NAME.encode() + b'", "prompt": "\\ud800", "max_tokens": 1}',
        b'{"model": "' + NAME.encode() + b'", "messages": [{"role": "user", "content": '
        b'"\\udfff"}], "max_tokens": 1}',
        b'{"model": "' + NAME.encode() + b'", "prompt": "x", "seed": 18446744073709551617}',
        b'{"model": "' + NAME.encode() + b'", "prompt": "x", "top_k": 100000000}',
        b'{"model": "' + NAME.encode() + b'", "prompt": "x", "temperature": NaN}',
        b'{"model": "' + NAME.encode() + b'", "prompt": [1e400]}',
        b"\xed\xa0\x80",
        b"",
    ]
    for content in nasty:
        check(client, path, content, "application/json")
