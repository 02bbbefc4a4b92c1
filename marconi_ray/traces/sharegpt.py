"""ShareGPT chat traces (``ShareGPT_V3_unfiltered_cleaned_split``), two ways.

``artifact`` (Marconi-faithful): one session per record of the ge10rounds file, first N
records. Messages are paired by position, whatever their role: turn k sends the history
plus ``conversations[2k]`` and gets ``conversations[2k + 1]`` back; a trailing unpaired
message is dropped. (This is what reproduces the published 1,238 requests / mean 1,162 /
max 5,671 input tokens for 100 sessions; role-aware pairing gives other counts.)
Session i starts at ``i / sessions_per_second``; each later turn arrives after the
previous one plus the typing delay of its own user message (spaces / 1.5 s).

``rejoined`` (more realistic): records of the head4000 file are grouped by
``id.rsplit('_', 1)[0]`` and their conversations concatenated in file order. A request is
made for each user message (``human``/``user``) directly followed by a reply
(``gpt``/``chatgpt``/``bing``/``bard``/``assistant``); every other message just joins
the history. Only sessions with >= 2 requests are kept; session starts
form a seeded Poisson process; think time is the typing delay as above.

Every message is tokenized once as ``json.dumps(message_dict)`` with BOS. A session stops
before its first request whose input exceeds ``max_tokens``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from marconi_ray.traces.paths import default_data_dir, require_file
from marconi_ray.traces.sessions import (
    Turn,
    check_rate,
    poisson_starts,
    prefix_session,
    typing_delay,
)
from marconi_ray.traces.tokenizer import Tokenizer, load_tokenizer
from marconi_ray.traces.trace import Request, Trace

MODES = ("artifact", "rejoined")
ARTIFACT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.ge10rounds_from_first17671.json"
REJOINED_FILE = "ShareGPT_V3_unfiltered_cleaned_split.head4000.json"
USER_ROLES = frozenset({"human", "user"})
REPLY_ROLES = frozenset({"gpt", "chatgpt", "bing", "bard", "assistant"})
Message = dict[str, Any]


def default_path(mode: str = "artifact", data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The ShareGPT file a mode reads by default, under ``data_dir`` (default data folder)."""
    _check_mode(mode)
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    return base / "sharegpt" / (ARTIFACT_FILE if mode == "artifact" else REJOINED_FILE)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown ShareGPT mode {mode!r}; choose one of {', '.join(MODES)}")


def load_records(path: Path) -> list[tuple[str, list[Message]]]:
    """``(id, conversations)`` of every record; ValueError naming the path if malformed."""
    with open(require_file(path), encoding="utf-8") as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of records")
    out: list[tuple[str, list[Message]]] = []
    for i, rec in enumerate(data):
        conv = rec.get("conversations") if isinstance(rec, dict) else None
        if not isinstance(conv, list) or not all(
            isinstance(m, dict) and isinstance(m.get("value"), str) for m in conv
        ):
            raise ValueError(f"{path}: record {i} has no valid 'conversations' list")
        out.append((str(rec.get("id", i)), conv))
    return out


def _encoder(tok: Tokenizer, messages: list[Message]) -> Callable[[int], list[int]]:
    def encode(i: int) -> list[int]:
        return tok.encode(json.dumps(messages[i]), True)

    return encode


def _timed_turns(messages: list[Message], user_idx: list[int], start: float) -> list[Turn]:
    turns: list[Turn] = []
    ts = start
    for k, u in enumerate(user_idx):
        if k:
            ts += typing_delay(messages[u]["value"])
        turns.append(Turn(u + 1, ts))
    return turns


def _rejoined_sessions(records: list[tuple[str, list[Message]]]) -> Iterator[list[Message]]:
    groups: dict[str, list[Message]] = {}
    for rec_id, conv in records:
        groups.setdefault(rec_id.rsplit("_", 1)[0], []).extend(conv)
    return (conv for conv in groups.values() if conv)


def _role_user_turns(messages: list[Message]) -> list[int]:
    return [
        i
        for i in range(len(messages) - 1)
        if messages[i].get("from") in USER_ROLES and messages[i + 1].get("from") in REPLY_ROLES
    ]


def build_sharegpt(
    path: str | os.PathLike[str] | None = None,
    n_sessions: int = 100,
    sessions_per_second: float = 1.0,
    mode: str = "artifact",
    tokenizer: Tokenizer | None = None,
    max_tokens: int = 32768,
    seed: int = 0,
) -> Trace:
    """Build a ShareGPT trace of ``n_sessions`` sessions (see the module docstring).

    ``path`` defaults to :func:`default_path` for ``mode``; ``tokenizer`` to Llama-2;
    ``seed`` drives the Poisson session starts of ``rejoined`` mode. Raises ValueError if
    the file holds fewer usable sessions than ``n_sessions``.
    """
    _check_mode(mode)
    if n_sessions < 0:
        raise ValueError(f"n_sessions must be >= 0, got {n_sessions}")
    sps = check_rate("sessions_per_second", sessions_per_second)
    src = Path(path) if path is not None else default_path(mode)
    tok = tokenizer if tokenizer is not None else load_tokenizer(None)
    records = load_records(src)
    requests: list[Request] = []
    if mode == "artifact":
        if n_sessions > len(records):
            raise ValueError(f"n_sessions={n_sessions} but {src} has {len(records)} records")
        for sid, (_, conv) in enumerate(tqdm(records[:n_sessions], disable=None, leave=False)):
            turns = _timed_turns(conv, list(range(0, len(conv) - 1, 2)), sid / sps)
            requests += prefix_session(sid, _encoder(tok, conv), turns, max_tokens)
        return Trace.from_requests("sharegpt", requests)
    starts = poisson_starts(n_sessions, sps, np.random.default_rng(seed))
    bar = tqdm(total=n_sessions, disable=None, leave=False)
    n_done = 0
    for conv in _rejoined_sessions(records):
        if n_done >= n_sessions:
            break
        turns = _timed_turns(conv, _role_user_turns(conv), starts[n_done])
        if len(turns) < 2:
            continue
        reqs = prefix_session(n_done, _encoder(tok, conv), turns, max_tokens)
        if len(reqs) >= 2:
            requests += reqs
            n_done += 1
            bar.update(1)
    bar.close()
    if n_done < n_sessions:
        raise ValueError(
            f"n_sessions={n_sessions} but {src} has only {n_done} rejoined sessions with "
            ">= 2 requests"
        )
    return Trace.from_requests("sharegpt-rejoined", requests)
