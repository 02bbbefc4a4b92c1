"""Qwen3-Coder XML tool calls (Qwen3.5, Qwen3-Next, Qwen3-Coder checkpoints' templates):

    <tool_call>
    <function=NAME>
    <parameter=KEY>
    VALUE
    </parameter>
    </function>
    </tool_call>

A value is JSON when it parses as JSON, else the text as written (a string)."""

from __future__ import annotations

import json
import re
from typing import Any

from marconi_ray.serve.ingress.tools.call import ParsedCall
from marconi_ray.serve.ingress.tools.parser import ToolParser, arguments_text

_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class Qwen3CoderParser(ToolParser):
    name = "qwen3_coder"
    start = "<tool_call>"
    end = "</tool_call>"

    def parse_block(self, body: str) -> ParsedCall | None:
        match = _FUNCTION.match(body)
        if match is None:
            return None
        arguments = {key: _value(value) for key, value in _PARAMETER.findall(match.group(2))}
        return ParsedCall(match.group(1).strip(), arguments_text(arguments))
