"""Mooncake traces (prefix-block hash ids, no text) as token traces, optionally chained.

Tokens (:mod:`.mooncake_tokens`): each hash id stands for ``block_size`` pseudo-random
token ids, a function of ``(seed, id)``; a request's input is its blocks' tokens
concatenated, the last block cut to ``input_length``; its output is ``output_length``
pseudo-random ids, a function of ``(seed, request index)``. Arrival ``ts`` =
``timestamp / 1000`` seconds.

``chained=False``: every request is its own session (turn 0).

``chained=True`` (conversations made whole again): requests are processed in file
(arrival) order. A request R is chained to an earlier request P when P has >= 1 full
block, P's full blocks (``hash_ids[:input_length // block_size]``: P's partial last
block has its own id, which on the shared file never recurs as a full block, so R's
block at that position has another id) are a prefix of R's hash ids, and
``R.input_length >= P.input_length + P.output_length``. Among such P the one sharing
the most blocks wins, then the most recent. R's tokens at positions
``[0, len(P.input) + len(P.output))`` then equal P's input followed by P's output.

Invariant, chained or not: within a trace, a block id always stands for the same tokens.
A table maps each id to its ``block_size`` tokens, fixed when the id is first used: a
first use inside a chained R takes, at the positions P's input + output covers, P's
tokens, elsewhere the id's pseudo-random ones. When a block R reuses was fixed earlier
with tokens that differ from P's over those positions, chaining R to P would break
either the invariant or the prefix, so the next candidate is tried; when none fits, R is
not chained (it keeps the table's tokens and opens a session) and is counted in
``ChainStats.inexact``. (On the shared file these are repeats of an earlier request Q
whose partial last block was fixed before R's candidate P arrived.)

Sessions: a chained R joins P's session as its next turn when P is that session's last
turn so far; when P already has a continuation (a fork: two requests extend P), R opens
a new session (turn 0) with the same chained tokens, counted in ``ChainStats.forks``.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from marconi_ray.traces.mooncake_format import BLOCK_SIZE, MooncakeRow, read_rows
from marconi_ray.traces.mooncake_tokens import DEFAULT_VOCAB, block_tokens, output_tokens
from marconi_ray.traces.paths import default_data_dir
from marconi_ray.traces.trace import Request, TokenArray, Trace, with_session_rate

DATA_RELPATH = Path("mooncake") / "synthetic_trace.jsonl"


def default_path(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The shared Mooncake synthetic trace under ``data_dir`` (default data folder)."""
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    return base / DATA_RELPATH


@dataclass(frozen=True)
class ChainStats:
    """How chaining went over a whole file (also when a trace keeps only some sessions).

    ``chained``: requests linked to an earlier one (exact prefix), forks included;
    ``forks``: chained requests whose parent already had a continuation (new session);
    ``inexact``: requests left unchained although they had parent candidates, because
    for each an already-fixed block disagrees with the candidate's tokens;
    ``too_short``: requests whose hash ids extend an earlier request's full blocks, but
    only earlier requests longer than ``input_length`` allows
    (``P.input_length + P.output_length > R.input_length``).
    """

    requests: int = 0
    chained: int = 0
    forks: int = 0
    inexact: int = 0
    too_short: int = 0

    def as_dict(self) -> dict[str, float]:
        """The counts under ``chain_*`` keys, as floats (the shape of ``Trace.stats``)."""
        return {f"chain_{k}": float(v) for k, v in self.__dict__.items() if k != "requests"}


@dataclass(frozen=True, eq=False)
class MooncakeTrace(Trace):
    """A Trace built from a Mooncake file; ``chains`` is None when built unchained."""

    chains: ChainStats | None = field(default=None)

    def stats(self) -> dict[str, float]:
        """``Trace.stats`` plus the chain counts of a chained build."""
        out = super().stats()
        if self.chains is not None:
            out.update(self.chains.as_dict())
        return out


class _Chainer:
    """Finds R's parent candidates: earlier requests whose full blocks R extends."""

    def __init__(self, rows: list[MooncakeRow], block_size: int) -> None:
        self.rows = rows
        self.block = block_size
        self.by_last_full: dict[int, list[int]] = defaultdict(list)
        self.too_short = False
        """Whether the last `candidates` call met a prefix match that R is too short for."""

    def candidates(self, row: MooncakeRow) -> Iterator[int]:
        """Indices of the earlier requests R may chain to, best first: most shared blocks,
        then most recent."""
        self.too_short = False
        ids = row.hash_ids
        for j in range(len(ids) - 1, -1, -1):
            for p in reversed(self.by_last_full.get(ids[j], ())):
                cand = self.rows[p]
                if cand.hash_ids[: j + 1] != ids[: j + 1]:
                    continue
                if cand.input_length + cand.output_length <= row.input_length:
                    yield p
                else:
                    self.too_short = True

    def add(self, row: MooncakeRow) -> None:
        """Make ``row`` a candidate parent of later requests (if it has a full block)."""
        n_full = row.n_full_blocks(self.block)
        if n_full:
            self.by_last_full[row.hash_ids[n_full - 1]].append(row.index)


def _chain_fill(
    table: TokenArray, used: np.ndarray, slots: np.ndarray, prev: TokenArray, block: int
) -> bool:
    """Fix R's unused blocks over ``prev``'s span from ``prev``; False (nothing changed)
    when a used block disagrees with ``prev`` there."""
    spans = []
    for j, slot in enumerate(slots.tolist()):
        start = j * block
        if start >= len(prev):
            break
        part = prev[start : start + block]
        if used[slot]:
            if not np.array_equal(table[slot, : len(part)], part):
                return False
        else:
            spans.append((slot, part))
    for slot, part in spans:
        table[slot, : len(part)] = part
    return True


def build_mooncake(
    path: str | os.PathLike[str] | None = None,
    chained: bool = False,
    n_sessions: int | None = None,
    sessions_per_second: float | None = None,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
    block_size: int = BLOCK_SIZE,
    name: str | None = None,
) -> MooncakeTrace:
    """The trace of a Mooncake file (module docstring); ``path`` defaults to the shared one.

    ``n_sessions`` keeps the first sessions (None: all); ``sessions_per_second`` re-times
    session starts (:func:`with_session_rate`; None: the recorded timestamps). The name
    defaults to ``mooncake[-chained]:<file stem>``. Raises FileNotFoundError or
    TraceFormatError (``path:line: why``) for a bad file, ValueError for a bad argument.
    """
    if n_sessions is not None and n_sessions < 0:
        raise ValueError(f"n_sessions must be >= 0, got {n_sessions}")
    src = Path(path) if path is not None else default_path()
    rows = read_rows(src, block_size)
    counts = [len(r.hash_ids) for r in rows]
    all_ids = np.fromiter((h for r in rows for h in r.hash_ids), np.int64, sum(counts))
    uniq, inverse = np.unique(all_ids, return_inverse=True)
    table = block_tokens(uniq, block_size, seed, vocab_size)
    offsets = np.concatenate([[0], np.cumsum(counts)])
    used = np.zeros(len(uniq), dtype=bool)
    chainer = _Chainer(rows, block_size)
    stats = {"chained": 0, "forks": 0, "inexact": 0, "too_short": 0}
    session: list[tuple[int, int]] = []  # (session id, turn id) per request
    last_turn: dict[int, int] = {}  # session id -> index of its last request
    requests: list[Request] = []
    for row in rows:
        slots = inverse[offsets[row.index] : offsets[row.index + 1]]
        parent, prev, tried = -1, None, 0
        for cand in chainer.candidates(row) if chained else ():
            tried += 1
            tokens = requests[cand].tokens
            if _chain_fill(table, used, slots, tokens, block_size):
                parent, prev = cand, tokens
                break
        if parent < 0 and tried:
            stats["inexact"] += 1
        elif parent < 0 and chainer.too_short:
            stats["too_short"] += 1
        used[slots] = True
        inp: TokenArray = table[slots].reshape(-1)[: row.input_length]
        out = output_tokens(row.index, row.output_length, seed, vocab_size)
        if prev is not None:
            stats["chained"] += 1
            assert np.array_equal(inp[: len(prev)], prev)
            sid, turn = session[parent]
            if last_turn[sid] != parent:
                stats["forks"] += 1
                sid, turn = len(last_turn), -1
        else:
            sid, turn = len(last_turn), -1
        session.append((sid, turn + 1))
        last_turn[sid] = row.index
        if chained:
            chainer.add(row)
        requests.append(Request(sid, turn + 1, row.timestamp_ms / 1000.0, inp, out))
    kind = "mooncake-chained" if chained else "mooncake"
    trace = Trace(name if name is not None else f"{kind}:{src.name.split('.')[0]}", tuple(requests))
    if n_sessions is not None:
        trace = trace.first_sessions(n_sessions)
    if sessions_per_second is not None:
        trace = with_session_rate(trace, sessions_per_second)
    chains = ChainStats(len(rows), **stats) if chained else None
    return MooncakeTrace(trace.name, trace.requests, chains)
