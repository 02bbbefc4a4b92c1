"""OpenAI's log-probability objects from the engine's `Logprob`s: the legacy completions'
`{tokens, token_logprobs, top_logprobs, text_offset}` and chat's `{content: [{token,
logprob, bytes, top_logprobs}]}`.

A token's text is the tokenizer's decode of it alone (special tokens kept), as vLLM shows
it: a byte-fallback piece of a multi-byte character shows as U+FFFD, and `text_offset` is
the running length of those texts (equal to the offset in the whole text whenever the
tokens decode alone as they do together). Log-probabilities below -9999 (an underflow to
-inf, which JSON cannot carry) are sent as -9999.0, as vLLM does.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from marconi_ray.protocol.results import Logprob
from marconi_ray.serve.ingress.responses import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    TopLogprob,
)

FLOOR = -9999.0


def _value(logprob: float) -> float:
    return FLOOR if math.isnan(logprob) else max(logprob, FLOOR)


class TokenTexts:
    """Token id -> its text (see the module docstring), decoded once per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        if token not in self._texts:
            self._texts[token] = str(self.tokenizer.decode([token], skip_special_tokens=False))
        return self._texts[token]


class CompletionLogprobWriter:
    """Builds a completion's `CompletionLogprobs` piece by piece, keeping `text_offset`
    running across the pieces of one choice."""

    def __init__(self, texts: TokenTexts) -> None:
        self.texts = texts
        self.offset = 0

    def write(self, ids: Sequence[int], entries: Sequence[Logprob | None]) -> CompletionLogprobs:
        """The object for tokens `ids` with their `entries` (None: no log-probability,
        the prompt's first token)."""
        out = CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
        for token, entry in zip(ids, entries, strict=True):
            text = self.texts(token)
            out.tokens.append(text)
            out.text_offset.append(self.offset)
            self.offset += len(text)
            if entry is None:
                out.token_logprobs.append(None)
                out.top_logprobs.append(None)
                continue
            out.token_logprobs.append(_value(entry.logprob))
            top: dict[str, float] = {}
            for alt, logprob in entry.top:  # two ids with one text: the likelier shows
                top.setdefault(self.texts(alt), _value(logprob))
            out.top_logprobs.append(top)
        return out


def chat_logprobs(texts: TokenTexts, entries: Sequence[Logprob]) -> ChatLogprobs:
    """Chat's `logprobs` object for generated tokens' `entries`."""

    def top(token: int, logprob: float) -> TopLogprob:
        text = texts(token)
        return TopLogprob(token=text, logprob=_value(logprob), bytes=list(text.encode()))

    content = [
        ChatTokenLogprob(
            **top(e.token, e.logprob).model_dump(),
            top_logprobs=[top(alt, logprob) for alt, logprob in e.top],
        )
        for e in entries
    ]
    return ChatLogprobs(content=content)
