"""Tool-call parsers by name, and the one a chat template implies.

`auto` (the default setting) picks by the template: Qwen3-Coder's XML calls when it
writes `<function=`, Hermes JSON when it writes `<tool_call>`, else Hermes (the format our
presets' template and most open checkpoints use)."""

from __future__ import annotations

from marconi_ray.serve.ingress.tools.hermes import HermesParser
from marconi_ray.serve.ingress.tools.json_list import JsonListParser
from marconi_ray.serve.ingress.tools.parser import ToolParser
from marconi_ray.serve.ingress.tools.qwen3_coder import Qwen3CoderParser

PARSERS: dict[str, type[ToolParser]] = {
    p.name: p for p in (HermesParser, Qwen3CoderParser, JsonListParser)
}
SETTINGS = ("auto", *PARSERS)
"""Values of the `tool_call_parser` setting (`serve.settings.TOOL_CALL_PARSERS`)."""


def parser_for(setting: str, chat_template: str | None) -> ToolParser:
    """The parser `setting` names (`auto`: the template's, see the module docstring);
    ValueError naming the setting when it is none of `SETTINGS`."""
    if setting not in SETTINGS:
        raise ValueError(f"tool_call_parser must be one of {', '.join(SETTINGS)}; got {setting!r}")
    if setting != "auto":
        return PARSERS[setting]()
    template = chat_template or ""
    if "<function=" in template:
        return Qwen3CoderParser()
    return HermesParser()
