"""Tool calling and structured outputs through the official `openai` client, in process
(the app over a `LocalBackend` engine; the client's HTTP goes through Starlette's test
client), on the random-weight `tiny` preset and the packaged `chat` model:

- a named `tool_choice` and a `json_schema` reply validate against their schemas in 100
  of 100 requests sampled at temperature 1;
- a 3-turn tool-calling conversation's turns 2 and 3 find the whole previous turn
  (prompt and reply) cached, as a plain chat's do;
- `required` calls stream as `tool_calls` deltas equal to the whole reply's calls;
- bad tool and schema input is a 400 naming the value, and plans nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
import torch
from fastapi.testclient import TestClient
from openai import OpenAI

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.model_source import resolve_model

torch.set_num_threads(1)

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
        "units": {"enum": ["C", "F"]},
    },
    "required": ["city", "days", "units"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ANSWER = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 16},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
    },
    "required": ["answer", "score", "tags"],
    "additionalProperties": False,
}
SAMPLED = 100


class Served:
    def __init__(self, model_dir: Path, name: str) -> None:
        self.engine = Engine(model_dir, system="marconi", cache_bytes=100_000_000, max_batch=16)
        self.name = name
        self.http = TestClient(
            build_app(LocalBackend(self.engine), ServedModel.load(model_dir, name))
        )
        self.client = OpenAI(
            base_url="http://testserver/v1", api_key="unused", http_client=self.http, max_retries=0
        )

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        return self.client.chat.completions.create(model=self.name, messages=messages, **kwargs)


@pytest.fixture(scope="module", params=["tiny", "chat"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    if request.param == "tiny":
        model_dir = make_model("tiny", "nemotron_h", tmp_path_factory.mktemp("tools") / "tiny")
    else:
        model_dir = resolve_model("chat")
    served = Served(model_dir, request.param)
    with served.http:
        yield served


def _question(i: int) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"What is the weather in city number {i}?"}]


def _sampled(served: Served, **kwargs: Any) -> list[Any]:
    """`SAMPLED` replies at temperature 1 (seeds 0, 1, ...), 16 requests at a time (so
    the engine decodes constrained rows in batches)."""

    def one(i: int) -> Any:
        return served.chat(_question(i), temperature=1.0, seed=i, max_tokens=200, **kwargs)

    with ThreadPoolExecutor(16) as pool:
        return list(pool.map(one, range(SAMPLED)))


def test_a_named_tool_choice_validates_in_every_sampled_request(served: Served) -> None:
    valid = 0
    for reply in _sampled(served, tools=TOOLS, tool_choice=NAMED):
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls"
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather"
        assert call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), WEATHER)
        valid += 1
    assert valid == SAMPLED


def test_a_json_schema_reply_validates_in_every_sampled_request(served: Served) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER, "strict": True},
    }
    for reply in _sampled(served, response_format=fmt):
        assert reply.choices[0].finish_reason == "stop"
        assert reply.choices[0].message.tool_calls is None
        jsonschema.validate(json.loads(reply.choices[0].message.content), ANSWER)


def test_json_object_replies_are_objects(served: Served) -> None:
    stopped = 0
    for i in range(10):
        reply = served.chat(
            _question(i),
            response_format={"type": "json_object"},
            temperature=1.0,
            seed=i,
            max_tokens=64,
        )
        if reply.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(reply.choices[0].message.content), dict)
            stopped += 1
        else:  # cut by max_tokens: still an object's beginning
            assert reply.choices[0].message.content.startswith("{")
    assert stopped > 0


def test_a_tool_conversation_hits_the_cache_like_a_chat(served: Served) -> None:
    messages = _question(5000)
    seen = 0
    for turn in range(3):
        reply = served.chat(
            messages, tools=TOOLS, tool_choice=NAMED, temperature=0.0, max_tokens=200
        )
        usage = reply.usage
        if turn:
            # the whole previous turn, its prompt and its reply, is served from the cache
            assert usage.prompt_tokens_details.cached_tokens == seen
        seen = usage.prompt_tokens + usage.completion_tokens
        (call,) = reply.choices[0].message.tool_calls
        messages = [
            *messages,
            reply.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": f"sunny, {turn + 20} degrees"},
        ]


def test_required_calls_stream_as_the_whole_reply(served: Served) -> None:
    kwargs = dict(tools=TOOLS, tool_choice="required", temperature=1.0, seed=7, max_tokens=300)
    whole = served.chat(_question(9), **kwargs).choices[0]
    chunks = list(served.chat(_question(9), stream=True, **kwargs))
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for delta in chunk.choices[0].delta.tool_calls or ():
            entry = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            entry["name"] += delta.function.name or ""
            entry["arguments"] += delta.function.arguments or ""
    want = [
        {"name": c.function.name, "arguments": c.function.arguments}
        for c in whole.message.tool_calls or ()
    ]
    assert [calls[i] for i in sorted(calls)] == want
    assert chunks[-1].choices[0].finish_reason == whole.finish_reason
    if whole.finish_reason == "tool_calls":
        assert want and all(c["name"] in ("get_weather", "get_time") for c in want)


def _status(served: Served, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    response = served.http.post("/v1/chat/completions", json={"model": served.name, **body})
    return response.status_code, response.json()


BAD = [
    (
        {"messages": [{"role": "tool", "content": "x"}]},
        "messages[0]",
        "tool_call_id",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "call_2", "content": "r"},
            ]
        },
        "messages[2].tool_call_id",
        "'call_2'",
    ),
    ({"messages": [{"role": "user", "content": None}]}, "messages[0]", "content is required"),
    ({"messages": _question(0), "tool_choice": "required"}, "tool_choice", "only allowed"),
    (
        {
            "messages": _question(0),
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "nope"}},
        },
        "tool_choice",
        "'nope'",
    ),
    (
        {
            "messages": _question(0),
            "tools": [{"type": "function", "function": {"name": "bad name"}}],
        },
        "tools[0].function.name",
        "bad name",
    ),
    (
        {
            "messages": _question(0),
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "integer", "minimum": 5, "maximum": 1},
                },
            },
        },
        "response_format.json_schema.schema",
        "Unsatisfiable",
    ),
    (
        {
            "messages": _question(0),
            "tools": [
                {"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}
            ],
            "tool_choice": "required",
        },
        "tools[0].function.parameters",
        "strin",
    ),
    (
        {
            "messages": _question(0),
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"enum": ["v" * 40_000]}},
            },
        },
        "response_format.json_schema.schema",
        "at most 32768",
    ),
    (
        {"messages": _question(0), "response_format": {"type": "json_schema"}},
        "response_format",
        "needs a json_schema",
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
            ]
        },
        "messages[0].content",
        "",
    ),
]


@pytest.mark.parametrize(
    ("body", "param", "named"), BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)]
)
def test_bad_tool_input_is_a_400_naming_it_and_plans_nothing(
    served: Served, body: dict[str, Any], param: str, named: str
) -> None:
    before = served.engine.cache.stats.requests
    status, error = _status(served, body)
    assert status == 400, error
    assert error["error"]["type"] == "invalid_request_error"
    assert (error["error"]["param"] or "").startswith(param), error
    assert named in error["error"]["message"]
    assert served.engine.cache.stats.requests == before


def test_the_client_raises_bad_request_for_a_bad_tool_message(served: Served) -> None:
    with pytest.raises(openai.BadRequestError, match="tool_call_id"):
        served.chat([{"role": "tool", "tool_call_id": "call_x", "content": "r"}], max_tokens=2)
