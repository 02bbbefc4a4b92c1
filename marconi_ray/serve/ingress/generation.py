"""From a planned request's event stream to pieces of output: the `Backend` contract the
ingress calls, incremental detokenisation with stop strings, and `run_request`, whose
`Piece`s the response formats (`formats`) turn into OpenAI objects, streamed or whole.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from marconi_ray.protocol.orders import TokenEvent
from marconi_ray.protocol.results import Logprob, Usage
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.ingress.metrics import IngressMetrics
from marconi_ray.serve.messages import Completed, Dispatch, ReplicaStats

REPLACEMENT = "\ufffd"


class EventStream(Protocol):
    """A request's events: a `TokenEvent` per sampled token, then one `Completed`.
    `ready()` says whether the next event is already here (reading it will not wait);
    `cancel()` stops the request early (the stream then ends or raises)."""

    def __aiter__(self) -> AsyncIterator[TokenEvent | Completed]: ...

    def ready(self) -> bool: ...

    def cancel(self) -> None: ...


class Backend(Protocol):
    """What the ingress needs from the serving side (Ray actors, or an in-process engine).

    `plan` validates and plans a request, raising ValueError naming a bad value (nothing
    is planned then); every planned request must then be started with `generate`, whose
    stream the ingress iterates to the end or cancels. `stream=False` says the client
    wants the whole answer at once: a backend may then deliver the events in one piece.
    """

    async def plan(
        self, prompt: npt.NDArray[np.int32], params: SamplingParams, submitted: float
    ) -> Dispatch: ...

    def generate(self, dispatch: Dispatch, stream: bool = True) -> EventStream: ...

    async def stats(self) -> list[ReplicaStats]: ...

    async def tuner_runs(self) -> int: ...

    async def health(self) -> dict[str, Any]:
        """`replicas` that can serve now, `registered` ones, `journal` health (a dict, or
        None without a journal); see `CacheCoordinator.health`."""
        ...


class Detokenizer:
    """Text of a growing output, released incrementally.

    Contract: the text released by `add`/`add_many` plus `finish` is the tokenizer's decode
    of all the ids (`skip_special_tokens=True`) whenever that decode is prefix-stable (the
    decode of each prefix of the ids, less a trailing U+FFFD, starts the decode of the
    whole); with stop strings it is that decode cut before the first stop string, found
    at the same token as a whole decode after every id would find it.

    Each `add` decodes only a window of the output: a context (ids already decoded), then
    the ids not yet decoded for good. What the window's text shows after the context's own
    decode extends the text. A decode treats the first token it shows apart (SentencePiece
    drops the leading space of its first piece, whatever skipped special ids precede it),
    so the context must show text by itself: it is the previous addition when that does,
    else the context before it with the previous addition appended, less its skipped
    special ids (they change no decode, and a run of them must not grow the window). A
    window whose text does not start with its context's decode (a tokenizer whose decode
    is not prefix-stable there) has the whole output decoded instead; the text of the ids
    decoded for good stays as it was (a decode that ends inside a character may show
    earlier bytes as U+FFFD too: Llama-2's byte fallback turns each byte of a run that is
    no UTF-8 yet into one). A long output costs O(new ids) per `add`, not O(all ids).

    The text is released up to a trailing U+FFFD (an incomplete UTF-8 sequence: the
    window then stays where it is until the sequence completes) and, before that, up to
    the longest suffix that could still become the start of a stop string. When a stop
    string appears, the text is cut before it and `add` reports the stop. `finish`
    releases the rest.
    """

    def __init__(self, tokenizer: Any, stops: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self._read = 0  # ids[:_read] are decoded for good, into _done
        self._done = ""
        self._context: list[int] = []  # the window: _context + ids[_read:]
        self._known = ""  # decode(_context)
        self._skipped: dict[int, bool] = {}  # id -> whether a decode drops it

    def add(self, token: int) -> tuple[str, bool]:
        """(newly released text, whether a stop string ended the output)."""
        text, stopped, _ = self.add_many([token])
        return text, stopped

    def add_many(self, tokens: list[int]) -> tuple[str, bool, int]:
        """`add` for several tokens: (newly released text, whether a stop string ended
        the output, how many of `tokens` it took: all of them, or up to the one that
        completed the stop). Without stop strings the output is decoded once for all."""
        if not self.stops:
            return *self._add(tokens), len(tokens)
        text = ""
        for n, token in enumerate(tokens, 1):
            piece, stopped = self._add([token])
            text += piece
            if stopped:
                return text, True, n
        return text, False, len(tokens)

    def _add(self, tokens: list[int]) -> tuple[str, bool]:
        self.ids.extend(tokens)
        self._decode()
        # a stop found now ends in the new text, so it starts `hold` before `sent` at most
        begin = max(0, self.sent - self.hold)
        cuts = [i for i in (self.text.find(s, begin) for s in self.stops) if i >= 0]
        if cuts:
            self.text = self.text[: min(cuts)]
            return self._take(len(self.text)), True
        return self._take(self._releasable()), False

    def _releasable(self) -> int:
        """How much of `text` may go out: not a trailing U+FFFD (a character whose bytes
        are still arriving), nor the longest suffix of the text before it that a stop
        string starts with (the next characters may complete that stop)."""
        end = len(self.text.rstrip(REPLACEMENT))
        for start in range(max(0, end - self.hold), end):
            tail = self.text[start:end]
            if any(stop.startswith(tail) for stop in self.stops):
                return start
        return end

    def _decode(self) -> None:
        """`text` = the decode of `ids`, from the window; then the window moves on, unless
        the text ends inside a character."""
        window = self._decoded(self._context + self.ids[self._read :])
        if window.startswith(self._known):
            self.text = self._done + window[len(self._known) :]
        else:
            self.text = self._decoded(self.ids)
        if not self.text.endswith(REPLACEMENT):
            self._move_window()

    def _move_window(self) -> None:
        """Decode the ids so far for good and make the next window's context of them:
        the ids since the last move when they show text by themselves, else the context
        so far followed by those ids less the skipped ones (so that no window's decode
        shows a new id as its first)."""
        new = self.ids[self._read :]
        known = self._decoded(new)
        if known:
            self._context = new
        else:
            self._context = self._context + [t for t in new if not self._is_skipped(t)]
            known = self._decoded(self._context)
        self._read, self._done, self._known = len(self.ids), self.text, known

    def _is_skipped(self, token: int) -> bool:
        """Whether `token` is a special id that the decode skips: alone, it decodes to
        other text when special ids are kept."""
        if token not in self._skipped:
            kept = self.tokenizer.decode([token], skip_special_tokens=False)
            self._skipped[token] = self._decoded([token]) != kept
        return self._skipped[token]

    def _decoded(self, ids: list[int]) -> str:
        """The tokenizer's decode of `ids`, special ids skipped."""
        text: str = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text

    def finish(self) -> str:
        """Everything not yet released, a trailing U+FFFD included: an output that ends
        inside (or on an invalid) UTF-8 sequence shows it, so the whole text is always the
        tokenizer's decode of the ids rather than silently losing tokens."""
        return self._take(len(self.text))

    def _take(self, end: int) -> str:
        if end <= self.sent:
            return ""
        out, self.sent = self.text[self.sent : end], end
        return out


@dataclass(frozen=True)
class Piece:
    """A stretch of output text; the last one has the finish reason and the usage.

    Attributes:
        token_ids: the tokens whose text this piece releases (a token's text may come in
            a later piece, when it ends inside a character or may start a stop string).
        logprobs: one per `token_ids` entry when the request asked for `logprobs`.
        prompt_logprobs: on the first piece, when the request asked for prompt
            log-probabilities: one per prompt token, None for the first.
    """

    text: str
    finish_reason: str | None = None
    usage: Usage | None = None
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[Logprob, ...] = ()
    prompt_logprobs: tuple[Logprob | None, ...] = ()


async def run_request(
    stream: EventStream,
    dispatch: Dispatch,
    detok: Detokenizer,
    arrival: float,
    metrics: IngressMetrics,
    interval: int = 1,
) -> AsyncGenerator[Piece, None]:
    """The pieces of one started request, observing TTFT and end-to-end latency.

    A piece carries every token that is ready: the tokens read while the stream had more
    waiting go out together (a consumer that is behind gets fewer, larger pieces), and
    nothing is held once the stream has to wait. Each piece but the last carries at least
    `interval` tokens (a streamed response's `stream_interval`) and released text; the last
    carries what is left, the finish reason and the usage. A stop string cancels the
    stream (usage then counts the tokens up to the one completing it and the planned hit).
    If the consumer stops early, the stream is cancelled. RuntimeError when the stream ends
    without `Completed`.
    """
    order = dispatch.order
    count = 0  # tokens taken into the output
    finished = False
    new: list[int] = []  # tokens read, not yet detokenized
    new_lps: list[Logprob] = []  # their log-probabilities (when asked)
    ids: list[int] = []  # tokens not yet handed out in a piece
    lps: list[Logprob] = []
    prompt_lps: tuple[Logprob | None, ...] | None = None  # not yet handed out
    held = ""  # their released text

    def piece(text: str, reason: str | None = None, usage: Usage | None = None) -> Piece:
        nonlocal prompt_lps
        prompt, prompt_lps = prompt_lps or (), ()
        out = Piece(text, reason, usage, tuple(ids), tuple(lps), prompt)
        return _counted(out, metrics)

    try:
        async for event in stream:
            if isinstance(event, TokenEvent):
                if count == 0 and not new:
                    metrics.ttft.observe(time.perf_counter() - arrival)
                if prompt_lps is None:  # the first attempt's (a re-plan's cover more)
                    prompt_lps = event.prompt_logprobs
                new.append(event.token)
                if event.logprob is not None:
                    new_lps.append(event.logprob)
                if stream.ready():
                    continue
            if new:
                text, stopped, used = detok.add_many(new)
                ids.extend(new[:used])
                lps.extend(new_lps[:used])
                count += used
                held += text
                new, new_lps = [], []
                if stopped:
                    stream.cancel()
                    finished = True
                    metrics.e2e.observe(time.perf_counter() - arrival)
                    usage = Usage(len(order.prompt), count, order.hit_len)
                    yield piece(held, "stop", usage)
                    return
            if isinstance(event, Completed):
                finished = True
                metrics.e2e.observe(time.perf_counter() - arrival)
                metrics.count_spec(event.spec)
                yield piece(held + detok.finish(), event.finish_reason, event.usage)
                return
            if held and len(ids) >= interval:
                yield piece(held)
                ids, lps, held = [], [], ""
        finished = True
        raise RuntimeError(f"request {order.request_id}: the stream ended without completing")
    finally:
        if not finished:
            stream.cancel()


def _counted(piece: Piece, metrics: IngressMetrics) -> Piece:
    metrics.pieces.inc()
    metrics.output_tokens.inc(len(piece.token_ids))
    return piece
