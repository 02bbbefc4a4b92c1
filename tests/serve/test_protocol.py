"""OpenAI request models -> SamplingParams, or a 400 naming the bad parameter."""

from __future__ import annotations

import pytest

from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress.openai_protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    ErrorResponse,
    error_type,
    parse_request,
    resolve_max_tokens,
    to_sampling_params,
)
from marconi_ray.serve.ingress.responses import ChatChunkChoice, ChatCompletionChunk, ChatDelta

BASE = {"model": "m", "prompt": "hi"}


def completion(**fields: object) -> CompletionRequest:
    return parse_request(CompletionRequest, {**BASE, **fields})


def bad(model: type, body: object) -> APIError:
    with pytest.raises(APIError) as info:
        parse_request(model, body)
    assert info.value.status == 400
    return info.value


def test_defaults_map_to_sampling_params() -> None:
    req = completion()
    assert req.max_tokens == 16 and not req.stream and req.stop_strings() == ()
    params = to_sampling_params(req, resolve_max_tokens(req.max_tokens, 16, 4096))
    assert params == SamplingParams(max_tokens=16, temperature=1.0, top_p=1.0)


def test_all_fields_map() -> None:
    req = completion(
        prompt=[1, 2, 3],
        max_tokens=7,
        temperature=0,
        top_p=0.5,
        top_k=4,
        seed=3,
        stop=["a", "bc"],
        stop_token_ids=[9],
        ignore_eos=True,
        stream=True,
        stream_options={"include_usage": True},
        user="u",
        logit_bias={"1": 2},  # unknown fields are ignored
    )
    params = to_sampling_params(req, 7, extra_stop_ids=(6, 9))
    assert params == SamplingParams(
        max_tokens=7,
        temperature=0.0,
        top_p=0.5,
        top_k=4,
        seed=3,
        stop_token_ids=(9, 6),
        ignore_eos=True,
    )
    assert req.stop_strings() == ("a", "bc") and req.include_usage
    assert completion(stop="x").stop_strings() == ("x",)


@pytest.mark.parametrize(
    ("fields", "param", "needle"),
    [
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"max_tokens": -5}, "max_tokens", "-5"),
        ({"max_tokens": "16"}, "max_tokens", "valid integer"),
        ({"max_tokens": 1.5}, "max_tokens", "valid integer"),
        ({"temperature": 2.5}, "temperature", "2.5"),
        ({"temperature": -1}, "temperature", "-1"),
        ({"temperature": True}, "temperature", "True"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"top_p": 1.5}, "top_p", "1.5"),
        ({"top_k": -2}, "top_k", "-2"),
        ({"n": 2}, "n", "only n=1"),
        ({"seed": -1}, "seed", "-1"),
        ({"stream": 1}, "stream", "valid boolean"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
        ({"stop": [""]}, "stop", "non-empty"),
        ({"stop_token_ids": [-1]}, "stop_token_ids[0]", "-1"),
        ({"stream_options": {"include_usage": True}}, None, "stream_options"),
        ({"prompt": ["a", "b"]}, "prompt", "only one prompt per request"),
        ({"prompt": [[1, 2], [3]]}, "prompt", "only one prompt per request"),
        ({"prompt": ""}, "prompt", "empty"),
        ({"prompt": []}, "prompt", "empty"),
        ({"prompt": [1.5]}, "prompt", "prompt"),
        ({"prompt": 12}, "prompt", "prompt"),
        ({"model": 3}, "model", "valid string"),
    ],
)
def test_bad_completion_fields_name_the_param(
    fields: dict[str, object], param: str | None, needle: str
) -> None:
    err = bad(CompletionRequest, {**BASE, **fields})
    assert err.param == param
    assert needle in err.message
    if param:
        assert param.split("[")[0] in err.message


def test_missing_fields_and_non_object_bodies() -> None:
    assert bad(CompletionRequest, {"model": "m"}).param == "prompt"
    assert bad(CompletionRequest, {"prompt": "x"}).param == "model"
    assert "JSON object" in bad(CompletionRequest, [1, 2]).message


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([], "messages"),
        ([{"role": "function", "content": "x"}], "messages[0].role"),
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
        ([{"role": "user"}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ("hello", "messages"),
    ],
)
def test_bad_chat_messages(messages: object, param: str) -> None:
    err = bad(ChatCompletionRequest, {"model": "m", "messages": messages})
    assert err.param is not None and err.param.startswith(param)


def test_chat_messages_and_token_limits() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    req = parse_request(
        ChatCompletionRequest,
        {
            "model": "m",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": parts},
            ],
            "max_tokens": 5,
            "max_completion_tokens": 3,
        },
    )
    assert [m.as_template_dict() for m in req.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "ab"},
    ]
    assert req.max_completion_tokens == 3 and req.max_tokens == 5


def test_resolve_max_tokens() -> None:
    assert resolve_max_tokens(None, 16, 100) == 16
    assert resolve_max_tokens(100, 16, 100) == 100
    with pytest.raises(APIError, match="max_tokens must be <= the context limit 100, got 101") as e:
        resolve_max_tokens(101, 16, 100)
    assert e.value.param == "max_tokens" and e.value.status == 400


def test_error_shape() -> None:
    body = APIError(404, "no such model", "model", "model_not_found").body()
    assert body == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    ErrorResponse.model_validate(body)
    assert error_type(500) == "server_error" and error_type(503) == "service_unavailable"


def test_chat_delta_omits_unset_fields() -> None:
    chunk = ChatCompletionChunk(
        id="chatcmpl-1",
        created=0,
        model="m",
        choices=[ChatChunkChoice(delta=ChatDelta(content="x"))],
    )
    choice = chunk.model_dump()["choices"][0]
    assert choice["delta"] == {"content": "x"} and choice["finish_reason"] is None
