"""Request traces: tokenized multi-turn sessions with arrival times, and their JSONL format.

A trace is what the replay simulator and the load generator consume. Each request carries
its full input token ids (history + the new user message) and the output token ids it
produced, so a prefix cache can be replayed without a model.

The artifact JSONL format (one JSON object per line) matches the Marconi artifact:
``session_id, turn_id, ts, num_input_tokens, num_output_tokens, input_tokens,
output_tokens``. Files ending in ``.gz`` are gzip-compressed.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

TokenArray = npt.NDArray[np.int32]

_INT32_MAX = int(np.iinfo(np.int32).max)
_KEYS = (
    "session_id",
    "turn_id",
    "ts",
    "num_input_tokens",
    "num_output_tokens",
    "input_tokens",
    "output_tokens",
)


class TraceFormatError(ValueError):
    """A malformed trace file line; the message starts with ``path:line:``."""


def _as_tokens(value: Any, what: str) -> TokenArray:
    """Return a read-only 1-D int32 view of ``value``; ValueError naming ``what`` if invalid."""
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must hold integers, got dtype {arr.dtype}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > _INT32_MAX):
        bad = int(arr.min()) if int(arr.min()) < 0 else int(arr.max())
        raise ValueError(f"{what} holds token id {bad} outside [0, {_INT32_MAX}]")
    out: TokenArray = arr.astype(np.int32, copy=False).view()
    out.flags.writeable = False
    return out


@dataclass(frozen=True, eq=False)
class Request:
    """One LLM call: ``input_tokens`` (history + new message) and the ``output_tokens`` reply.

    Contract: ``input_tokens`` is non-empty, both arrays are 1-D int32 with ids >= 0 (they
    are stored as read-only views), ``ts`` (arrival, seconds) is finite and >= 0, and
    ``session_id``/``turn_id`` are ints >= 0. Equality is identity (numpy fields).
    """

    session_id: int
    turn_id: int
    ts: float
    input_tokens: TokenArray
    output_tokens: TokenArray = field(default_factory=lambda: np.zeros(0, np.int32))

    def __post_init__(self) -> None:
        for name in ("session_id", "turn_id"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, np.integer)) or val < 0:
                raise ValueError(f"{name} must be an int >= 0, got {val!r}")
            object.__setattr__(self, name, int(val))
        ts = self.ts
        if isinstance(ts, bool) or not isinstance(ts, (int, float, np.number)):
            raise ValueError(f"ts must be a number, got {ts!r}")
        if not math.isfinite(float(ts)) or float(ts) < 0:
            raise ValueError(f"ts must be finite and >= 0, got {ts!r}")
        object.__setattr__(self, "ts", float(ts))
        inp = _as_tokens(self.input_tokens, "input_tokens")
        if inp.size == 0:
            raise ValueError(
                f"input_tokens must be non-empty (session {self.session_id}, turn {self.turn_id})"
            )
        object.__setattr__(self, "input_tokens", inp)
        object.__setattr__(self, "output_tokens", _as_tokens(self.output_tokens, "output_tokens"))

    @property
    def n_input(self) -> int:
        """Number of input tokens."""
        return int(self.input_tokens.size)

    @property
    def n_output(self) -> int:
        """Number of output tokens."""
        return int(self.output_tokens.size)

    @property
    def tokens(self) -> TokenArray:
        """Input followed by output (a new int32 array)."""
        out: TokenArray = np.concatenate([self.input_tokens, self.output_tokens])
        return out


def _order_key(r: Request) -> tuple[float, int, int]:
    return (r.ts, r.session_id, r.turn_id)


@dataclass(frozen=True, eq=False)
class Trace:
    """A named, time-ordered sequence of requests.

    Contract: ``requests`` is stored as a tuple sorted by ``(ts, session_id, turn_id)``
    (any iterable is accepted and sorted); ``(session_id, turn_id)`` pairs are unique.
    """

    name: str
    requests: tuple[Request, ...]

    def __post_init__(self) -> None:
        reqs = tuple(sorted(self.requests, key=_order_key))
        seen: set[tuple[int, int]] = set()
        for r in reqs:
            if not isinstance(r, Request):
                raise ValueError(f"trace {self.name!r}: not a Request: {r!r}")
            if (r.session_id, r.turn_id) in seen:
                raise ValueError(
                    f"trace {self.name!r}: duplicate (session_id, turn_id) = "
                    f"({r.session_id}, {r.turn_id})"
                )
            seen.add((r.session_id, r.turn_id))
        object.__setattr__(self, "requests", reqs)

    @classmethod
    def from_requests(cls, name: str, requests: Iterable[Request]) -> Trace:
        """Build a trace from requests in any order."""
        return cls(name, tuple(requests))

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    def session_ids(self) -> list[int]:
        """Session ids in order of their first request's arrival."""
        return list(dict.fromkeys(r.session_id for r in self.requests))

    def sessions(self) -> dict[int, list[Request]]:
        """Requests grouped by session (in first-arrival order), each list by turn id."""
        out: dict[int, list[Request]] = {sid: [] for sid in self.session_ids()}
        for r in self.requests:
            out[r.session_id].append(r)
        for reqs in out.values():
            reqs.sort(key=lambda r: r.turn_id)
        return out

    @property
    def n_sessions(self) -> int:
        """Number of distinct sessions."""
        return len({r.session_id for r in self.requests})

    def head(self, n_requests: int) -> Trace:
        """The first ``n_requests`` requests in arrival order (n_requests >= 0)."""
        if n_requests < 0:
            raise ValueError(f"n_requests must be >= 0, got {n_requests}")
        return Trace(self.name, self.requests[:n_requests])

    def first_sessions(self, n: int) -> Trace:
        """All requests of the first ``n`` sessions (by first arrival; n >= 0)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        keep = set(self.session_ids()[:n])
        return Trace(self.name, tuple(r for r in self.requests if r.session_id in keep))

    def stats(self) -> dict[str, float]:
        """Summary numbers: requests, sessions, mean/max/total input, mean output tokens."""
        n_in = np.array([r.n_input for r in self.requests], dtype=np.int64)
        n_out = np.array([r.n_output for r in self.requests], dtype=np.int64)
        empty = len(self.requests) == 0
        return {
            "requests": float(len(self.requests)),
            "sessions": float(self.n_sessions),
            "mean_input_tokens": 0.0 if empty else float(n_in.mean()),
            "max_input_tokens": 0.0 if empty else float(n_in.max()),
            "mean_output_tokens": 0.0 if empty else float(n_out.mean()),
            "total_input_tokens": float(n_in.sum()),
        }


def with_session_rate(trace: Trace, sessions_per_second: float) -> Trace:
    """Re-time sessions so the i-th (by first arrival) starts at ``i / sessions_per_second``.

    Gaps between the requests of one session are kept unchanged.
    """
    sps = float(sessions_per_second)
    if not math.isfinite(sps) or sps <= 0:
        raise ValueError(f"sessions_per_second must be finite and > 0, got {sessions_per_second}")
    firsts: dict[int, float] = {}
    for r in trace.requests:
        firsts.setdefault(r.session_id, r.ts)
    start = {sid: i / sps for i, sid in enumerate(firsts)}
    return Trace(
        trace.name,
        tuple(
            Request(
                r.session_id,
                r.turn_id,
                start[r.session_id] + (r.ts - firsts[r.session_id]),
                r.input_tokens,
                r.output_tokens,
            )
            for r in trace.requests
        ),
    )


def _open_text(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _check_int(obj: dict[str, Any], key: str) -> int:
    val = obj[key]
    if isinstance(val, bool) or not isinstance(val, int):
        raise ValueError(f"{key} must be an int, got {val!r}")
    return val


def _check_tokens(obj: dict[str, Any], key: str, num_key: str) -> TokenArray:
    val = obj[key]
    if not isinstance(val, list):
        raise ValueError(f"{key} must be a list of ints, got {type(val).__name__}")
    raw = np.array(val) if val else np.zeros(0, np.int64)
    if raw.ndim != 1 or raw.dtype.kind not in "iu":
        bad = next((v for v in val if isinstance(v, bool) or not isinstance(v, int)), val)
        raise ValueError(f"{key} must hold ints, got {bad!r:.60}")
    arr = _as_tokens(raw, key)
    num = _check_int(obj, num_key)
    if num != arr.size:
        raise ValueError(f"{num_key}={num} but len({key})={arr.size}")
    return arr


def json_object(text: str, keys: Sequence[str]) -> dict[str, Any]:
    """One JSON line that must be an object holding `keys`; ValueError naming what is
    wrong (the caller adds where)."""
    obj = json.loads(text)
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(missing)}")
    return obj


def _parse_line(text: str) -> Request:
    obj = json_object(text, _KEYS)
    ts = obj["ts"]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise ValueError(f"ts must be a number, got {ts!r}")
    return Request(
        _check_int(obj, "session_id"),
        _check_int(obj, "turn_id"),
        float(ts),
        _check_tokens(obj, "input_tokens", "num_input_tokens"),
        _check_tokens(obj, "output_tokens", "num_output_tokens"),
    )


def read_jsonl(path: str | os.PathLike[str], name: str | None = None) -> Trace:
    """Read an artifact JSONL trace (``.gz`` by suffix); blank lines are skipped.

    Raises FileNotFoundError naming the path, or TraceFormatError (``path:line: why``).
    The trace name defaults to the file name without ``.jsonl``/``.gz``.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"trace file not found: {p}")
    requests: list[Request] = []
    seen: dict[tuple[int, int], int] = {}
    with _open_text(p) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                req = _parse_line(line)
                ident = (req.session_id, req.turn_id)
                if ident in seen:
                    raise ValueError(
                        f"duplicate (session_id, turn_id) {ident}, first on line {seen[ident]}"
                    )
            except (ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
                raise TraceFormatError(f"{p}:{lineno}: {exc}") from exc
            seen[ident] = lineno
            requests.append(req)
    default = p.name.removesuffix(".gz").removesuffix(".jsonl")
    return Trace(name if name is not None else default, tuple(requests))


def write_jsonl(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write ``trace`` as artifact JSONL (gzip if the name ends in ``.gz``), atomically.

    The file appears complete or not at all (temp file in the same folder + rename);
    gzip output is byte-for-byte deterministic. Returns the path.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            gz = (
                gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="")
                if p.suffix == ".gz"
                else None
            )
            write = raw.write if gz is None else gz.write
            for r in trace.requests:
                obj = {
                    "session_id": r.session_id,
                    "turn_id": r.turn_id,
                    "ts": r.ts,
                    "num_input_tokens": r.n_input,
                    "num_output_tokens": r.n_output,
                    "input_tokens": r.input_tokens.tolist(),
                    "output_tokens": r.output_tokens.tolist(),
                }
                write(json.dumps(obj, separators=(",", ":")).encode() + b"\n")
            if gz is not None:
                gz.close()
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p
