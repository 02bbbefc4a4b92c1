"""What a chat request's tools and `response_format` make of its output: the grammar that
constrains it (llguidance's serialized form, carried by `SamplingParams.grammar`) and the
parser that reads tool calls out of it.

- `response_format` `json_object`: any JSON object; `json_schema`: a value satisfying
  the schema (always strict).
- `tool_choice` `required`: one call or more (one without `parallel_tool_calls`) of the
  tools; a named function: one call of it. In the parser's own format when it has a
  grammar (so the next turn's template renders the call back to the tokens generated),
  else as a JSON list (`json_list`).
- `auto` (the default with tools): free output, parsed for calls; `none`: free output,
  not parsed (the tools are still in the prompt, so a conversation's earlier turns render
  the same whatever each turn's choice).

A schema the grammar compiler refuses (unsatisfiable, an unknown type or format, a
keyword it does not implement) is a 400 naming the field, before anything is planned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llguidance import LLMatcher

from marconi_ray.serve.ingress.tools.fields import (
    FunctionDef,
    NamedToolChoice,
    ResponseFormat,
    ToolChoice,
    ToolDef,
)
from marconi_ray.serve.ingress.tools.json_list import JsonListParser
from marconi_ray.serve.ingress.tools.parser import JSON_STYLE, ToolParser, json_rule


class OutputError(ValueError):
    """Bad tools or `response_format`: the message, and the request field at fault
    (`param`); the API answers it with a 400 naming that field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class OutputPlan:
    """How a request's output is constrained (`grammar`, None: free) and read (`parser`,
    None: the text is all content)."""

    grammar: str | None = None
    parser: ToolParser | None = None


def _checked(grammar: str, param: str) -> str:
    failed, messages = LLMatcher.validate_grammar_with_warnings(grammar)
    if failed:
        detail = messages[0].split("\n")[0] if messages else "invalid"
        raise OutputError(f"{param}: {detail}", param)
    return grammar


def _check_schemas(tools: Sequence[ToolDef], names: Sequence[str]) -> None:
    for i, tool in enumerate(tools):
        if tool.function.name in names:
            schema = tool.function.argument_schema()
            _checked(
                LLMatcher.grammar_from_lark(f"start: {json_rule(schema)}"),
                f"tools[{i}].function.parameters",
            )


def response_grammar(response_format: ResponseFormat) -> str | None:
    """The grammar of a `response_format` (None for `text`); OutputError naming the
    schema when the compiler refuses it."""
    if response_format.type == "text":
        return None
    schema: dict[str, Any] = {"type": "object"}
    if response_format.json_schema is not None:
        schema = response_format.json_schema.schema_
    grammar = LLMatcher.grammar_from_json_schema(schema, overrides=JSON_STYLE)  # type: ignore[arg-type]
    return _checked(grammar, "response_format.json_schema.schema")


def tool_names(tools: Sequence[ToolDef]) -> list[str]:
    return [t.function.name for t in tools]


def plan_output(
    tools: Sequence[ToolDef] | None,
    choice: ToolChoice | None,
    parallel: bool,
    response_format: ResponseFormat | None,
    parser: ToolParser,
) -> OutputPlan:
    """The `OutputPlan` of a chat request (see the module docstring); OutputError naming
    the field for a choice without tools, a named function that is not among them, or a
    schema the compiler refuses."""
    if not tools:
        if choice not in (None, "none"):
            raise OutputError("tool_choice is only allowed when tools are given", "tool_choice")
        grammar = None if response_format is None else response_grammar(response_format)
        return OutputPlan(grammar, None)
    names = tool_names(tools)
    if len(set(names)) != len(names):
        raise OutputError("tools: function names must be distinct", "tools")
    if choice == "none":
        return OutputPlan(None if response_format is None else response_grammar(response_format))
    if choice is None or choice == "auto":
        if response_format is not None and response_format.type != "text":
            return OutputPlan(response_grammar(response_format), None)
        return OutputPlan(None, parser)
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in names:
            raise OutputError(
                f"tool_choice: function {name!r} is not among the tools ({', '.join(names)})",
                "tool_choice",
            )
        forced: list[FunctionDef] = [tools[names.index(name)].function]
        parallel = False
    else:
        forced = [t.function for t in tools]
    _check_schemas(tools, [f.name for f in forced])
    fmt = parser
    lark = parser.grammar(forced, parallel)
    if lark is None:
        fmt = JsonListParser()
        lark = fmt.grammar(forced, parallel)
    assert lark is not None
    return OutputPlan(_checked(LLMatcher.grammar_from_lark(lark), "tools"), fmt)
