"""The two response formats, text completions and chat completions, streamed or whole,
built from `run_request`'s `Piece`s (streamed and whole answers come from the same pieces,
so their texts are equal), with the log-probabilities the request asked for.

A format instance serves one request: `configure` it with the request first.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from marconi_ray.protocol.results import Logprob, Usage
from marconi_ray.serve.ingress.generation import Piece
from marconi_ray.serve.ingress.logprob_format import (
    CompletionLogprobWriter,
    TokenTexts,
    chat_logprobs,
)
from marconi_ray.serve.ingress.openai_protocol import CompletionRequest, SamplingRequest
from marconi_ray.serve.ingress.responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatLogprobs,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    FunctionCall,
    FunctionDelta,
    ToolCall,
    ToolCallDelta,
    UsageInfo,
)
from marconi_ray.serve.ingress.tools.call import ParsedCall
from marconi_ray.serve.ingress.tools.parser import ToolParser
from marconi_ray.serve.ingress.tools.stream import CallSplitter

Prompt = Sequence[int] | npt.NDArray[np.int32]


def _usage(usage: Usage) -> UsageInfo:
    return UsageInfo.of(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)


def _joined(pieces: list[Piece]) -> Piece:
    """The pieces of a whole answer as one (the last one's finish reason and usage)."""
    last = pieces[-1] if pieces else Piece("")
    return Piece(
        "".join(p.text for p in pieces),
        last.finish_reason,
        last.usage,
        tuple(t for p in pieces for t in p.token_ids),
        tuple(lp for p in pieces for lp in p.logprobs),
        pieces[0].prompt_logprobs if pieces else (),
    )


class RunningUsage:
    """The usage so far of a streamed answer (`continuous_usage_stats`): the prompt's and
    cached tokens, and the tokens the pieces so far handed out (the last piece's own
    usage when it has one)."""

    def __init__(self, prompt_tokens: int, cached_tokens: int, hide_output: bool) -> None:
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = cached_tokens
        self.hide_output = hide_output
        self.completion_tokens = 0

    def after(self, piece: Piece | None) -> UsageInfo:
        """The usage once `piece` (None: nothing yet) is out."""
        if piece is not None:
            self.completion_tokens += len(piece.token_ids)
            if piece.usage is not None:
                self.completion_tokens = piece.usage.completion_tokens
        done = 0 if self.hide_output else self.completion_tokens
        return UsageInfo.of(self.prompt_tokens, done, self.cached_tokens)


class Formatter(Protocol):
    """Builds one endpoint's OpenAI objects from pieces."""

    def configure(
        self,
        req: SamplingRequest,
        prompt: Prompt,
        tokenizer: Any,
        cached: int = 0,
        parser: ToolParser | None = None,
    ) -> None:
        """Take the request's output options (token ids, log-probabilities, echo, usage on
        every chunk: `cached` is the planned hit's tokens; `parser`: read tool calls out
        of a chat reply)."""
        ...

    def whole(self, model: str, created: int, pieces: list[Piece]) -> BaseModel: ...

    def chunks(
        self, model: str, created: int, pieces: AsyncIterator[Piece], usage: bool
    ) -> AsyncGenerator[BaseModel, None]: ...


class _Format:
    """What both formats take from a request: `token_ids` (an extension) and the usage
    on every chunk (`continuous_usage_stats`)."""

    prefix = ""

    def __init__(self) -> None:
        self.id = f"{self.prefix}-{uuid.uuid4().hex}"
        self.token_ids = False
        self._running: RunningUsage | None = None

    def _configure(
        self, req: SamplingRequest, prompt: Prompt, cached: int, hide_output: bool
    ) -> None:
        self.token_ids = req.return_token_ids
        if req.continuous_usage:
            self._running = RunningUsage(len(prompt), cached, hide_output)


class CompletionFormat(_Format):
    """`text_completion` objects: `token_ids` on each choice when asked (an extension),
    `logprobs` with `logprobs`; `echo` puts the prompt's text (and with `logprobs`, its
    tokens' entries, the first null) before the output, in the first chunk when
    streamed; `max_tokens` 0 (with `echo`) leaves the generated token out (text, ids,
    log-probabilities and `completion_tokens`)."""

    prefix = "cmpl"

    def __init__(self) -> None:
        super().__init__()
        self._writer: CompletionLogprobWriter | None = None
        self._echo: str | None = None
        self._prompt: list[int] = []
        self._hide_output = False

    def configure(
        self,
        req: SamplingRequest,
        prompt: Prompt,
        tokenizer: Any,
        cached: int = 0,
        parser: ToolParser | None = None,
    ) -> None:
        if req.logprob_counts()[0] is not None:
            self._writer = CompletionLogprobWriter(TokenTexts(tokenizer))
        if isinstance(req, CompletionRequest) and req.echo:
            self._prompt = [int(t) for t in prompt]
            text = req.prompt
            self._echo = text if isinstance(text, str) else str(tokenizer.decode(self._prompt))
            self._hide_output = req.max_tokens == 0
        self._configure(req, prompt, cached, self._hide_output)

    def whole(self, model: str, created: int, pieces: list[Piece]) -> Completion:
        whole = _joined(pieces)
        choice = self._choice(whole, first=True)
        usage = None if whole.usage is None else _usage(self._shown_usage(whole.usage))
        return Completion(id=self.id, created=created, model=model, choices=[choice], usage=usage)

    async def chunks(
        self, model: str, created: int, pieces: AsyncIterator[Piece], usage: bool
    ) -> AsyncGenerator[BaseModel, None]:
        last, first = Piece(""), True
        async for last in pieces:
            choice = self._choice(last, first)
            first = False
            info = None if self._running is None else self._running.after(last)
            yield Completion(id=self.id, created=created, model=model, choices=[choice], usage=info)
        if usage and last.usage is not None:
            info = _usage(self._shown_usage(last.usage))
            yield Completion(id=self.id, created=created, model=model, choices=[], usage=info)

    def _shown_usage(self, usage: Usage) -> Usage:
        if not self._hide_output:
            return usage
        return Usage(usage.prompt_tokens, 0, usage.cached_tokens)

    def _choice(self, piece: Piece, first: bool) -> CompletionChoice:
        text, ids, lps = piece.text, list(piece.token_ids), list(piece.logprobs)
        if self._hide_output:
            text, ids, lps = "", [], []
        echo = first and self._echo is not None
        logprobs = None
        if self._writer is not None:
            logprobs = CompletionLogprobs(
                tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[]
            )
            if echo:
                logprobs = self._writer.write(self._prompt, self._prompt_entries(piece))
            tail = self._writer.write(ids, lps)
            for name in CompletionLogprobs.model_fields:
                getattr(logprobs, name).extend(getattr(tail, name))
        return CompletionChoice(
            text=(self._echo or "") + text if echo else text,
            finish_reason=piece.finish_reason,
            logprobs=logprobs,
            token_ids=ids if self.token_ids else None,
        )

    def _prompt_entries(self, piece: Piece) -> list[Logprob | None]:
        if len(piece.prompt_logprobs) != len(self._prompt):
            raise RuntimeError(
                f"expected {len(self._prompt)} prompt log-probabilities, "
                f"got {len(piece.prompt_logprobs)}"
            )
        return list(piece.prompt_logprobs)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _reason(reason: str | None, calls: int) -> str | None:
    """`tool_calls` for a reply that stopped after making calls."""
    return "tool_calls" if calls and reason == "stop" else reason


class ChatFormat(_Format):
    """`chat.completion` and `chat.completion.chunk` objects: `token_ids` when asked (an
    extension), `logprobs` (with `top_logprobs` alternatives) when asked; with a tool
    parser, the reply's tool calls as `tool_calls` (content null when there is none
    besides them; streamed, each call whole in the chunk that completes it) and
    `finish_reason` `tool_calls`."""

    prefix = "chatcmpl"

    def __init__(self) -> None:
        super().__init__()
        self._texts: TokenTexts | None = None
        self._parser: ToolParser | None = None

    def configure(
        self,
        req: SamplingRequest,
        prompt: Prompt,
        tokenizer: Any,
        cached: int = 0,
        parser: ToolParser | None = None,
    ) -> None:
        if req.logprob_counts()[0] is not None:
            self._texts = TokenTexts(tokenizer)
        self._parser = parser
        self._configure(req, prompt, cached, hide_output=False)

    def whole(self, model: str, created: int, pieces: list[Piece]) -> ChatCompletion:
        whole = _joined(pieces)
        assert whole.usage is not None, "the last piece carries the usage"
        content: str | None = whole.text
        calls: list[ParsedCall] = []
        if self._parser is not None:
            parsed, calls = self._parser.parse(whole.text)
            content = parsed if calls else whole.text
        tool_calls = [
            ToolCall(id=_call_id(), function=FunctionCall(name=c.name, arguments=c.arguments))
            for c in calls
        ]
        choice = ChatChoice(
            message=AssistantMessage(content=content, tool_calls=tool_calls or None),
            finish_reason=_reason(whole.finish_reason, len(calls)),
            logprobs=self._logprobs(whole.logprobs),
            token_ids=list(whole.token_ids) if self.token_ids else None,
        )
        return ChatCompletion(
            id=self.id, created=created, model=model, choices=[choice], usage=_usage(whole.usage)
        )

    async def chunks(
        self, model: str, created: int, pieces: AsyncIterator[Piece], usage: bool
    ) -> AsyncGenerator[BaseModel, None]:
        opening = ChatChunkChoice(delta=ChatDelta(role="assistant", content=""))
        yield self._chunk(model, created, opening, None)
        splitter = None if self._parser is None else CallSplitter(self._parser)
        made = 0
        last = Piece("")
        async for last in pieces:
            text, deltas = last.text, []
            if splitter is not None:
                text, calls = splitter.feed(last.text)
                if last.finish_reason is not None:
                    rest, more = splitter.finish()
                    text, calls = text + rest, calls + more
                for call in calls:
                    function = FunctionDelta(name=call.name, arguments=call.arguments)
                    deltas.append(ToolCallDelta(index=made, id=_call_id(), function=function))
                    made += 1
            if not (text or deltas or last.finish_reason or self._carries_more()):
                continue  # all of it held inside a call: nothing to send yet
            choice = ChatChunkChoice(
                delta=ChatDelta(content=text or None, tool_calls=deltas or None),
                finish_reason=_reason(last.finish_reason, made),
                logprobs=self._logprobs(last.logprobs),
                token_ids=list(last.token_ids) if self.token_ids else None,
            )
            yield self._chunk(model, created, choice, last)
        if usage and last.usage is not None:
            yield ChatCompletionChunk(
                id=self.id, created=created, model=model, choices=[], usage=_usage(last.usage)
            )

    def _logprobs(self, entries: Sequence[Logprob]) -> ChatLogprobs | None:
        return None if self._texts is None else chat_logprobs(self._texts, entries)

    def _carries_more(self) -> bool:
        """Whether every chunk carries more than its delta (token ids, log-probabilities
        or the usage so far), so none may be left out."""
        return self.token_ids or self._texts is not None or self._running is not None

    def _chunk(
        self, model: str, created: int, choice: ChatChunkChoice, piece: Piece | None
    ) -> ChatCompletionChunk:
        """A chunk of `choice`, with the usage so far once `piece` is out when asked."""
        usage = None if self._running is None else self._running.after(piece)
        return ChatCompletionChunk(
            id=self.id, created=created, model=model, choices=[choice], usage=usage
        )
