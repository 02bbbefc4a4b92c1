"""Hermes-style tool calls (Qwen2.5 / Qwen3, Hermes, our presets' template): a JSON object
`{"name": ..., "arguments": {...}}` between `<tool_call>\n` and `\n</tool_call>`, calls
separated by a newline."""

from __future__ import annotations

import json
from collections.abc import Sequence

from marconi_ray.serve.ingress.tools.call import ParsedCall
from marconi_ray.serve.ingress.tools.fields import FunctionDef
from marconi_ray.serve.ingress.tools.parser import (
    ToolParser,
    arguments_text,
    json_rule,
    lark_string,
)


class HermesParser(ToolParser):
    name = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"

    def parse_block(self, body: str) -> ParsedCall | None:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        arguments = obj.get("arguments", obj.get("parameters", {}))
        return ParsedCall(obj["name"], arguments_text(arguments))

    def grammar(self, tools: Sequence[FunctionDef], parallel: bool) -> str | None:
        rules = ["start: calls", 'calls: call ("\\n" call)*' if parallel else "calls: call"]
        rules.append("call: " + " | ".join(f"call_{i}" for i in range(len(tools))))
        for i, tool in enumerate(tools):
            head = lark_string(f'<tool_call>\n{{"name": "{tool.name}", "arguments": ')
            rules.append(f'call_{i}: {head} args_{i} "}}\\n</tool_call>"')
            rules.append(f"args_{i}: {json_rule(tool.argument_schema())}")
        return "\n".join(rules)
