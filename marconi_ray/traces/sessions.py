"""Turning a tokenized message list into the requests of one session, plus arrival helpers.

A session is a list of chat messages. Turn k sends ``messages[:input_end_k]`` and gets
``messages[input_end_k]`` back, so when ``input_end`` grows turn by turn, each input is
the previous input + output (+ the new messages): a prefix extension. The requests of one
session share a single token buffer (their arrays are views into it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from marconi_ray.traces.trace import Request


@dataclass(frozen=True)
class Turn:
    """One request of a session: input is ``messages[:input_end]``, the output is
    ``messages[input_end]``; ``ts`` is its arrival time in seconds."""

    input_end: int
    ts: float

    def __post_init__(self) -> None:
        if self.input_end < 1:
            raise ValueError(f"input_end must be >= 1, got {self.input_end}")


def prefix_session(
    session_id: int,
    encode_message: Callable[[int], list[int]],
    turns: Sequence[Turn],
    max_tokens: int,
    max_turns: int | None = None,
) -> list[Request]:
    """Requests for ``turns`` (increasing ``input_end``), stopping before the first turn
    whose input exceeds ``max_tokens`` and after ``max_turns`` turns (None: no limit).

    ``encode_message(i)`` returns the token ids of message i; it is called once per message,
    in order, and only for messages that are needed.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if max_turns is not None and max_turns < 0:
        raise ValueError(f"max_turns must be >= 0 or None, got {max_turns}")
    pieces: list[list[int]] = []
    offsets = [0]

    def upto(n_messages: int) -> int:
        while len(pieces) < n_messages:
            pieces.append(encode_message(len(pieces)))
            offsets.append(offsets[-1] + len(pieces[-1]))
        return offsets[n_messages]

    kept: list[Turn] = []
    last_end = 0
    for turn in turns:
        if max_turns is not None and len(kept) >= max_turns:
            break
        if turn.input_end <= last_end:
            raise ValueError(f"turn input_end {turn.input_end} does not grow past {last_end}")
        if upto(turn.input_end) > max_tokens:
            break
        upto(turn.input_end + 1)
        kept.append(turn)
        last_end = turn.input_end
    if not kept:
        return []
    n_msgs = kept[-1].input_end + 1
    buf = np.fromiter(
        (t for piece in pieces[:n_msgs] for t in piece), dtype=np.int32, count=offsets[n_msgs]
    )
    return [
        Request(
            session_id,
            k,
            t.ts,
            buf[: offsets[t.input_end]],
            buf[offsets[t.input_end] : offsets[t.input_end + 1]],
        )
        for k, t in enumerate(kept)
    ]


def typing_delay(text: str, words_per_second: float = 1.5) -> float:
    """Seconds to type ``text`` at 90 words/minute, counting words as spaces (Marconi)."""
    return text.count(" ") / words_per_second


def check_rate(name: str, value: float) -> float:
    """``value`` as a float if finite and > 0, else ValueError naming ``name``."""
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be finite and > 0, got {value!r}")
    return v


def poisson_starts(n: int, sessions_per_second: float, rng: np.random.Generator) -> list[float]:
    """``n`` session start times of a Poisson process at ``sessions_per_second``; the first
    session starts at 0 and the gaps are exponential with mean ``1 / sessions_per_second``."""
    rate = check_rate("sessions_per_second", sessions_per_second)
    if n <= 0:
        return []
    gaps = rng.exponential(1.0 / rate, size=n - 1)
    return [0.0, *np.cumsum(gaps).tolist()]
