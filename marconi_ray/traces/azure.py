"""The Azure LLM inference traces (Azure/AzurePublicDataset, 2023 and 2024): CSV files of
`TIMESTAMP,ContextTokens,GeneratedTokens`, one row per request, timestamps like
`2023-11-16 18:15:46.6805900` (fractions past microseconds are dropped).

The trace gives lengths and arrival times, not content: every request is a session of
one turn, its prompt `ContextTokens` pseudo-random ids and its output `GeneratedTokens`
(`mooncake_tokens.prompt_tokens` / `output_tokens` of its row index), arriving at its
offset from the first row's time. No two prompts share a prefix, so a replay measures
arrivals and lengths as production saw them, not cache hits.
"""

from __future__ import annotations

import csv
import os
from datetime import datetime
from pathlib import Path

from marconi_ray.traces.mooncake_tokens import DEFAULT_VOCAB, output_tokens, prompt_tokens
from marconi_ray.traces.trace import Request, Trace, TraceFormatError, with_session_rate

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def _time(text: str) -> datetime:
    head, dot, fraction = text.strip().partition(".")
    return datetime.fromisoformat(head + (dot + fraction[:6] if dot else ""))


def read_azure(
    path: str | os.PathLike[str],
    n_sessions: int | None = None,
    sessions_per_second: float | None = None,
    seed: int = 0,
    vocab_size: int = DEFAULT_VOCAB,
) -> Trace:
    """The trace of an Azure CSV at `path` (module docstring): its first `n_sessions`
    rows (None: all), re-timed to `sessions_per_second` when given. FileNotFoundError
    for a missing file; TraceFormatError (`path:line: why`) for a header without the
    three columns, an unreadable time or count, a ContextTokens below 1, or a row
    earlier than the first."""
    src = Path(path)
    if n_sessions is not None and n_sessions < 0:
        raise ValueError(f"n_sessions must be >= 0, got {n_sessions}")
    requests: list[Request] = []
    with src.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
        if missing:
            raise TraceFormatError(f"{src}:1: missing column(s) {', '.join(missing)}")
        origin: datetime | None = None
        for index, row in enumerate(reader):
            if n_sessions is not None and index >= n_sessions:
                break
            line = index + 2
            try:
                at = _time(row["TIMESTAMP"])
                context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (TypeError, ValueError) as exc:
                raise TraceFormatError(f"{src}:{line}: {exc}") from None
            if context < 1 or generated < 0:
                raise TraceFormatError(
                    f"{src}:{line}: ContextTokens must be >= 1 and GeneratedTokens >= 0, "
                    f"got {context}, {generated}"
                )
            origin = at if origin is None else origin
            offset = (at - origin).total_seconds()
            if offset < 0:
                raise TraceFormatError(
                    f"{src}:{line}: TIMESTAMP {row['TIMESTAMP']} is before the first row's"
                )
            inp = prompt_tokens(index, context, seed, vocab_size)
            out = output_tokens(index, generated, seed, vocab_size)
            requests.append(Request(index, 0, offset, inp, out))
    trace = Trace.from_requests(f"azure:{src.stem}", requests)
    if sessions_per_second is not None:
        trace = with_session_rate(trace, sessions_per_second)
    return trace
