"""Forced calls as a JSON list (what vLLM constrains `tool_choice: required` to):
`[{"name": ..., "arguments": {...}}, ...]` as the whole output. Used for a forced call in
a format that offers no grammar of its own."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from marconi_ray.serve.ingress.tools.call import ParsedCall
from marconi_ray.serve.ingress.tools.fields import FunctionDef
from marconi_ray.serve.ingress.tools.parser import (
    ToolParser,
    arguments_text,
    json_rule,
)


class JsonListParser(ToolParser):
    name = "json_list"
    start = None

    def parse_block(self, body: str) -> ParsedCall | None:
        return None

    def parse_all(self, text: str) -> list[ParsedCall]:
        try:
            items = json.loads(text)
        except ValueError:
            return []
        if not isinstance(items, list):
            return []
        calls = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return []
            calls.append(ParsedCall(item["name"], arguments_text(item.get("arguments", {}))))
        return calls

    def grammar(self, tools: Sequence[FunctionDef], parallel: bool) -> str | None:
        one_of: list[dict[str, Any]] = [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.argument_schema()},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
        schema: dict[str, Any] = {"type": "array", "items": {"anyOf": one_of}, "minItems": 1}
        if not parallel:
            schema["maxItems"] = 1
        return f"start: {json_rule(schema)}"
