"""Tool-call parsers and their streaming: Hermes JSON blocks, Qwen3-Coder XML blocks and
JSON lists read into calls; the content outside them kept; fed in any pieces, the
splitter gives exactly what the whole text gives; the grammars of forced calls accept
the text the template renders and nothing else; the chat format turns a reply with calls
into `tool_calls`, whole and streamed alike."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from functools import partial

import llguidance.hf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from llguidance import LLMatcher, LLTokenizer

from marconi_ray.engine.presets.byte_tokenizer import save_tokenizer
from marconi_ray.protocol.model_files import load_tokenizer
from marconi_ray.protocol.results import Usage
from marconi_ray.serve.ingress.formats import ChatFormat
from marconi_ray.serve.ingress.generation import Piece
from marconi_ray.serve.ingress.openai_protocol import ChatCompletionRequest
from marconi_ray.serve.ingress.tools.call import ParsedCall
from marconi_ray.serve.ingress.tools.fields import FunctionDef
from marconi_ray.serve.ingress.tools.hermes import HermesParser
from marconi_ray.serve.ingress.tools.json_list import JsonListParser
from marconi_ray.serve.ingress.tools.parser import ToolParser
from marconi_ray.serve.ingress.tools.qwen3_coder import Qwen3CoderParser
from marconi_ray.serve.ingress.tools.registry import SETTINGS, parser_for
from marconi_ray.serve.ingress.tools.stream import CallSplitter
from marconi_ray.serve.settings import TOOL_CALL_PARSERS

CALL = (
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>'
)
OTHER = '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>'
WEATHER = ParsedCall("get_weather", '{"city": "Paris", "days": 2}')


def test_hermes_reads_calls_and_keeps_the_content() -> None:
    parser = HermesParser()
    assert parser.parse(f"Let me look.\n{CALL}\n{OTHER}") == (
        "Let me look.",
        [WEATHER, ParsedCall("now", "{}")],
    )
    assert parser.parse(CALL) == (None, [WEATHER])
    assert parser.parse("no call here ") == ("no call here ", [])
    # a block that is not a call of the format stays in the content as written
    assert parser.parse("a <tool_call>not json</tool_call> b") == (
        "a <tool_call>not json</tool_call> b",
        [],
    )
    # an unclosed block is content (the reply was cut)
    assert parser.parse('x <tool_call>\n{"name"') == ('x <tool_call>\n{"name"', [])
    # `parameters` (Llama-style) is read as the arguments
    legacy = '<tool_call>{"name": "f", "parameters": {"a": "é"}}</tool_call>'
    assert parser.parse(legacy) == (None, [ParsedCall("f", '{"a": "é"}')])


def test_qwen3_coder_reads_xml_calls_with_typed_values() -> None:
    text = (
        "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Jose\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=opts>\n"
        '{"units": "C"}\n</parameter>\n</function>\n</tool_call>'
    )
    content, calls = Qwen3CoderParser().parse(text)
    assert content == "Checking."
    assert [c.name for c in calls] == ["get_weather"]
    assert json.loads(calls[0].arguments) == {"city": "San Jose", "days": 3, "opts": {"units": "C"}}
    assert Qwen3CoderParser().parse("<tool_call>{json}</tool_call>")[1] == []


def test_json_list_reads_a_whole_list_or_nothing() -> None:
    parser = JsonListParser()
    text = '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]'
    assert parser.parse(text) == (None, [ParsedCall("a", '{"x": 1}'), ParsedCall("b", "{}")])
    assert parser.parse('[{"name": 3}]') == ('[{"name": 3}]', [])
    assert parser.parse("[1, 2") == ("[1, 2", [])


def _streamed(parser: ToolParser, text: str, cuts: list[int]) -> tuple[str | None, list]:
    splitter = CallSplitter(parser)
    content, calls, at = "", [], 0
    for cut in [*sorted(cuts), len(text)]:
        out, done = splitter.feed(text[at:cut])
        content, calls, at = content + out, calls + done, cut
    out, done = splitter.finish()
    return (content + out) or None, calls + done


TEXTS = [
    f"Let me look.\n{CALL}\n{OTHER}",
    f"  {CALL}  trailing  ",
    f"a <tool_call>bad</tool_call> b {CALL}",
    "plain <tool_c text with a marker's start <tool_call",
    "",
]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(TEXTS), st.lists(st.integers(0, 200), max_size=12))
def test_streaming_in_any_pieces_equals_the_whole(text: str, cuts: list[int]) -> None:
    cuts = [c for c in cuts if c <= len(text)]
    for parser in (HermesParser(), Qwen3CoderParser(), JsonListParser()):
        assert _streamed(parser, text, cuts) == parser.parse(text)


def test_registry_picks_by_template_and_refuses_unknown_names() -> None:
    assert isinstance(parser_for("auto", "{{ '<function=' }}"), Qwen3CoderParser)
    assert isinstance(parser_for("auto", "{{ '<tool_call>' }}"), HermesParser)
    assert isinstance(parser_for("auto", None), HermesParser)
    assert isinstance(parser_for("json_list", None), JsonListParser)
    with pytest.raises(ValueError, match="'llama9'"):
        parser_for("llama9", None)
    assert SETTINGS == TOOL_CALL_PARSERS


WEATHER_DEF = FunctionDef(
    name="get_weather",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
)
NOW_DEF = FunctionDef(name="now")


@pytest.fixture(scope="module")
def byte_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> LLTokenizer:
    folder = save_tokenizer(tmp_path_factory.mktemp("bytes"))
    return llguidance.hf.from_tokenizer(load_tokenizer(folder))


def _accepts(tokenizer: LLTokenizer, grammar: str, text: str) -> bool:
    """Whether `text` is a whole sentence of the Lark `grammar`."""
    matcher = LLMatcher(tokenizer, LLMatcher.grammar_from_lark(grammar), log_level=0)
    return matcher.consume_tokens(tokenizer.tokenize_str(text)) and matcher.is_accepting()


def test_hermes_grammar_takes_exactly_the_rendered_calls(byte_tokenizer: LLTokenizer) -> None:
    accepts = partial(_accepts, byte_tokenizer)
    one = HermesParser().grammar([WEATHER_DEF, NOW_DEF], parallel=False)
    many = HermesParser().grammar([WEATHER_DEF, NOW_DEF], parallel=True)
    assert one is not None and many is not None
    assert accepts(one, CALL) and accepts(one, OTHER)
    assert not accepts(one, f"{CALL}\n{OTHER}")
    assert accepts(many, f"{CALL}\n{OTHER}")
    # the template's spacing, not another
    assert not accepts(one, CALL.replace('"city": ', '"city":'))
    # the schema: a missing required key or a wrong type is refused
    assert not accepts(one, CALL.replace(', "days": 2', ""))
    assert not accepts(one, CALL.replace("2}", '"2"}'))


def test_json_list_grammar_bounds_the_calls(byte_tokenizer: LLTokenizer) -> None:
    accepts = partial(_accepts, byte_tokenizer)
    one = JsonListParser().grammar([WEATHER_DEF], parallel=False)
    assert one is not None
    call = '{"name": "get_weather", "arguments": {"city": "P", "days": 1}}'
    assert accepts(one, f"[{call}]")
    assert not accepts(one, f"[{call}, {call}]")
    assert not accepts(one, "[]")


def _pieces(text: str, size: int) -> list[Piece]:
    parts = [text[i : i + size] for i in range(0, len(text), size)]
    usage = Usage(10, len(parts), 0)
    return [Piece(p) for p in parts[:-1]] + [Piece(parts[-1], "stop", usage)]


async def _aiter(pieces: list[Piece]) -> AsyncIterator[Piece]:
    for piece in pieces:
        yield piece


def _chat_format(parser: ToolParser | None) -> ChatFormat:
    fmt = ChatFormat()
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "q"}]}
    )
    fmt.configure(request, [1, 2, 3], tokenizer=None, cached=0, parser=parser)
    return fmt


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_an_auto_reply_with_calls_is_read_into_tool_calls_whole_and_streamed(size: int) -> None:
    text = f"Let me look.\n{CALL}\n{OTHER}"
    whole = _chat_format(HermesParser()).whole("m", 0, _pieces(text, size)).model_dump()
    (choice,) = whole["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Let me look."
    calls = choice["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (WEATHER.name, WEATHER.arguments),
        ("now", "{}"),
    ]
    assert len({c["id"] for c in calls}) == 2

    async def streamed() -> list[dict]:
        fmt = _chat_format(HermesParser())
        return [
            c.model_dump() async for c in fmt.chunks("m", 0, _aiter(_pieces(text, size)), False)
        ]

    chunks = asyncio.run(streamed())
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Let me look."
    got = [t for d in deltas for t in d.get("tool_calls") or ()]
    assert [t["index"] for t in got] == [0, 1]
    assert [t["function"] for t in got] == [c["function"] for c in calls]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(d for d in deltas[1:-1])  # no empty chunk while a call is being written


def test_a_reply_without_a_parser_or_calls_keeps_its_text() -> None:
    text = f"free text {CALL}"
    plain = _chat_format(None).whole("m", 0, _pieces(text, 4)).model_dump()["choices"][0]
    assert plain["message"] == {"role": "assistant", "content": text}
    assert plain["finish_reason"] == "stop"
    none = _chat_format(HermesParser()).whole("m", 0, _pieces("just text ", 4)).model_dump()
    assert none["choices"][0]["message"] == {"role": "assistant", "content": "just text "}
