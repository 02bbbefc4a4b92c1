"""Trace -> sessions of turns, and the prompt of each turn.

A trace request carries its full input (history + new user message) and its recorded
reply. In the artifact-faithful ShareGPT trace, input_{k+1} = input_k + output_k + a new
user segment; ``build_sessions`` checks this per turn and, where a turn does not extend its
predecessor, treats its whole input as the new segment (counted in
``SessionSet.non_extending_turns``).

Prompts (``next_prompt``): in ``trace`` history mode a turn sends the trace's input; in
``live`` mode it sends the previous prompt + the model's actual reply + the new segment.
In ``tokens`` prompt mode trace ids are mapped into the model's vocabulary by
``map_ids``; in ``text`` mode they are detokenized with the trace's tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from marconi_ray.traces.trace import Trace

HISTORY_MODES = ("live", "trace")
PROMPT_MODES = ("tokens", "text")
RESERVED_IDS = 7  # the model's byte tokenizer keeps ids 0..6 for special tokens


@dataclass(frozen=True)
class Turn:
    """One turn: the trace's ``input_ids`` and recorded ``output_ids``, the ``new_ids``
    appended after the previous turn's reply (all of ``input_ids`` for a first or a
    non-extending turn), and ``think_s``, the trace gap before it (ts difference to the
    previous turn, >= 0; 0 for the first turn)."""

    turn_id: int
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]
    new_ids: tuple[int, ...]
    think_s: float
    extends: bool


@dataclass(frozen=True)
class Session:
    """A conversation: its turns in order (at least one), and `start_s`, its first
    request's arrival in the trace's clock."""

    session_id: int
    turns: tuple[Turn, ...]
    start_s: float = 0.0


@dataclass(frozen=True)
class SessionSet:
    """The sessions of a run and how many turns did not extend their predecessor."""

    sessions: tuple[Session, ...]
    non_extending_turns: int

    @property
    def n_turns(self) -> int:
        """Total turns over all sessions."""
        return sum(len(s.turns) for s in self.sessions)


def build_sessions(trace: Trace, n_sessions: int | None = None) -> SessionSet:
    """The first ``n_sessions`` sessions of ``trace`` (None: all), by first arrival."""
    if n_sessions is not None and n_sessions < 0:
        raise ValueError(f"sessions must be >= 0, got {n_sessions}")
    grouped = list(trace.sessions().items())
    if n_sessions is not None:
        grouped = grouped[:n_sessions]
    sessions: list[Session] = []
    non_extending = 0
    for sid, reqs in grouped:
        turns: list[Turn] = []
        prev_full: tuple[int, ...] = ()
        prev_ts = reqs[0].ts if reqs else 0.0
        for i, req in enumerate(reqs):
            inp = tuple(int(t) for t in req.input_tokens)
            out = tuple(int(t) for t in req.output_tokens)
            extends = i > 0 and len(inp) > len(prev_full) and inp[: len(prev_full)] == prev_full
            if i > 0 and not extends:
                non_extending += 1
            new = inp[len(prev_full) :] if extends else inp
            turns.append(Turn(i, inp, out, new, max(0.0, req.ts - prev_ts) if i else 0.0, extends))
            prev_full, prev_ts = inp + out, req.ts
        if turns:
            sessions.append(Session(sid, tuple(turns), reqs[0].ts))
    return SessionSet(tuple(sessions), non_extending)


def map_ids(ids: Sequence[int], vocab_size: int | None) -> list[int]:
    """Map trace ids into a model vocabulary: ``id % (vocab_size - 8) + 7`` (ids 7 ..
    vocab_size - 2, skipping the reserved specials); ``vocab_size`` None keeps ids as is."""
    if vocab_size is None:
        return list(ids)
    if vocab_size < 9:
        raise ValueError(f"vocab_size must be >= 9 to map token ids, got {vocab_size}")
    span = vocab_size - 8
    return [int(t) % span + RESERVED_IDS for t in ids]


@dataclass(frozen=True)
class PromptSpec:
    """How prompts are built: ``history`` (live|trace), ``prompt_mode`` (tokens|text),
    ``vocab_size`` (tokens mode remapping) and ``detokenize`` (required in text mode)."""

    history: str
    prompt_mode: str
    vocab_size: int | None = None
    detokenize: Callable[[Sequence[int]], str] | None = None

    def __post_init__(self) -> None:
        if self.history not in HISTORY_MODES:
            raise ValueError(f"history {self.history!r} is not one of {', '.join(HISTORY_MODES)}")
        if self.prompt_mode not in PROMPT_MODES:
            raise ValueError(
                f"prompt mode {self.prompt_mode!r} is not one of {', '.join(PROMPT_MODES)}"
            )
        if self.prompt_mode == "text" and self.detokenize is None:
            raise ValueError("prompt mode 'text' needs a detokenizer")


@dataclass(frozen=True)
class Prompt:
    """A prompt to send: ``ids`` (tokens mode) or ``text`` (text mode); ``n_tokens`` is
    exact in tokens mode and counted in trace-tokenizer tokens in text mode."""

    ids: tuple[int, ...] | None
    text: str | None
    n_tokens: int


@dataclass(frozen=True)
class Reply:
    """What the previous turn generated: its ids (empty when the server did not return
    them), its text, and its token count."""

    ids: tuple[int, ...] = ()
    text: str = ""
    n_tokens: int = 0


def _fresh(ids: Sequence[int], spec: PromptSpec) -> Prompt:
    if spec.prompt_mode == "tokens":
        mapped = tuple(map_ids(ids, spec.vocab_size))
        return Prompt(mapped, None, len(mapped))
    assert spec.detokenize is not None  # checked by PromptSpec
    return Prompt(None, spec.detokenize(ids), len(ids))


def next_prompt(turn: Turn, prev: Prompt | None, reply: Reply | None, spec: PromptSpec) -> Prompt:
    """The prompt of ``turn`` given the previous turn's prompt and reply (None for the
    first turn, or in ``trace`` history mode where the trace's input is sent)."""
    if spec.history == "trace" or prev is None or reply is None:
        return _fresh(turn.input_ids, spec)
    new = _fresh(turn.new_ids, spec)
    if spec.prompt_mode == "tokens":
        assert prev.ids is not None and new.ids is not None
        ids = prev.ids + reply.ids + new.ids
        return Prompt(ids, None, len(ids))
    text = (prev.text or "") + reply.text + (new.text or "")
    return Prompt(None, text, prev.n_tokens + reply.n_tokens + new.n_tokens)


def max_tokens(turn: Turn, max_output: int) -> int:
    """Tokens to decode for ``turn``: its recorded output length capped by ``max_output``
    (at least 1)."""
    return max(1, min(len(turn.output_ids), max_output))
