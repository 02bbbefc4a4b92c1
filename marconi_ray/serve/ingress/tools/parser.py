"""The tool-call parser contract: from a model's output text to its content and
`ParsedCall`s, and (where the format allows) the grammar of forced calls in that format.

A call is a block between a `start` and an `end` marker (a parser whose `start` is None
reads the whole output as its calls, `json_list`). A block its parser cannot read stays in
the content as written: nothing the model wrote is lost (`stream.CallSplitter`).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from marconi_ray.serve.ingress.tools.call import ParsedCall
from marconi_ray.serve.ingress.tools.fields import FunctionDef
from marconi_ray.serve.ingress.tools.stream import CallSplitter

JSON_STYLE = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "json_allowed_escapes": '"\\nrtbf',
}
"""How a constrained JSON value is written: Python's `json.dumps` spacing and the escapes
it writes, so a chat template's `tojson` renders parsed arguments back to the same text
(and the next turn's prompt extends the cached tokens)."""


def json_rule(schema: dict[str, Any]) -> str:
    """A Lark rule body (llguidance's `%json`) for a JSON value satisfying `schema`,
    written in `JSON_STYLE`."""
    return "%json " + json.dumps({**schema, "x-guidance": JSON_STYLE})


def lark_string(text: str) -> str:
    """`text` as a Lark string literal."""
    return json.dumps(text)


def arguments_text(value: Any) -> str:
    """Arguments as OpenAI's JSON string, written like `tojson` writes them."""
    return json.dumps(value, ensure_ascii=False)


class ToolParser(ABC):
    """Reads one tool-call format (a family's or a chat template's)."""

    name: ClassVar[str]
    start: ClassVar[str | None]
    end: ClassVar[str] = ""
    separator: ClassVar[str] = "\n"
    """What the template writes between the content and a call, and between calls."""

    @abstractmethod
    def parse_block(self, body: str) -> ParsedCall | None:
        """The call in the text between the markers (None: not a call of this format)."""

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(content: the text outside the calls, None when empty; the calls in order), as
        `stream.CallSplitter` gives them for the whole text."""
        splitter = CallSplitter(self)
        content, calls = splitter.feed(text)
        rest, more = splitter.finish()
        return (content + rest) or None, calls + more

    def parse_all(self, text: str) -> list[ParsedCall]:
        """The calls of a whole output (parsers without markers)."""
        raise NotImplementedError

    def grammar(self, tools: Sequence[FunctionDef], parallel: bool) -> str | None:
        """A Lark grammar whose sentences are one call (or, with `parallel`, one or more)
        of `tools` in this format, each satisfying its function's schema; None when this
        format has none (forced calls then use `json_list`)."""
        return None
