"""`CallSplitter`: a growing output split into content and tool calls as it streams.

Contract: feeding the output in any pieces, then `finish`, gives the same content and
calls as feeding it whole (`ToolParser.parse` is exactly that), so a streamed answer and a
whole one agree. Content is the text outside the call blocks, less the whitespace next to
a block (the separators a template writes around calls); text that may still become a
`start` marker, and trailing whitespace, are held until the next piece tells.
"""

from __future__ import annotations

from typing import Protocol

from marconi_ray.serve.ingress.tools.call import ParsedCall


class CallFormat(Protocol):
    """What the splitter needs of a parser (`parser.ToolParser`): its markers and how it
    reads a block, or a whole output for a format without markers."""

    @property
    def start(self) -> str | None: ...

    @property
    def end(self) -> str: ...

    def parse_block(self, body: str) -> ParsedCall | None: ...

    def parse_all(self, text: str) -> list[ParsedCall]: ...


def _held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of `text` that `marker` starts with (and is shorter)."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class CallSplitter:
    def __init__(self, parser: CallFormat) -> None:
        self.parser = parser
        self.calls: list[ParsedCall] = []
        self._buffer = ""
        self._in_call = False
        self._after_call = False
        self._space = ""  # whitespace held before the next content

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        """(content released now, calls completed now) after `text`."""
        self._buffer += text
        start, end = self.parser.start, self.parser.end
        if start is None:
            return "", []
        out, calls = "", []
        while True:
            if not self._in_call:
                at = self._buffer.find(start)
                if at < 0:
                    keep = _held_prefix(self._buffer, start)
                    out += self._content(self._buffer[: len(self._buffer) - keep])
                    self._buffer = self._buffer[len(self._buffer) - keep :]
                    break
                out += self._content(self._buffer[:at])
                self._buffer, self._in_call = self._buffer[at:], True
            close = self._buffer.find(end, len(start))
            if close < 0:
                break
            block = self._buffer[: close + len(end)]
            self._buffer, self._in_call = self._buffer[close + len(end) :], False
            call = self.parser.parse_block(block[len(start) : -len(end)])
            if call is None:
                out += self._content(block)
            else:
                calls.append(call)
                self._after_call, self._space = True, ""
        self.calls += calls
        return out, calls

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """(the rest of the content, the calls still completing): an unclosed block is
        content; a parser without markers reads the whole output now."""
        rest, self._buffer = self._buffer, ""
        if self.parser.start is None:
            calls = self.parser.parse_all(rest)
            self.calls += calls
            return ("" if calls else rest), calls
        out = self._content(rest)
        if not self._after_call:
            out += self._space
        self._space = ""
        return out, []

    def _content(self, text: str) -> str:
        """Release `text` as content: whitespace right after a call is dropped, and
        trailing whitespace is held (a call may follow it)."""
        if self._after_call:
            text = text.lstrip()
            if not text:
                return ""
            self._after_call = False
        body = text.rstrip()
        if not body:
            self._space += text
            return ""
        out = self._space + body
        self._space = text[len(body) :]
        return out
