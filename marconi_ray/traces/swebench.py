"""SWE-bench agent traces from mini-swe-agent trajectories (``*.traj.json``).

Each trajectory (files sorted by name) is one session; each assistant message k is one
request whose input is ``messages[:idx_k]`` and whose output is that message. Every
message is tokenized once as ``json.dumps({"role": ..., "content": ...})`` with BOS.

Arrival times: session starts form a seeded Poisson process at ``sessions_per_second``
(first at 0). Within a session, ``gaps="recorded"`` uses the deltas of the assistant
messages' ``extra.response.created`` (an exponential draw with mean ``mean_gap_s`` where
a timestamp is missing or goes backwards); ``gaps="poisson"`` draws every gap.

``drop_old_observations=True`` mimics Marconi: the history is a list of rounds
(observation, reply); round 0's observation is the system prompt + task and is always
kept; once a reply is appended and more than 5 rounds exist, the observation of the round
5th from the end is dropped. So each input holds the task, the current observation and
those of the last 4 rounds, and a drop breaks the shared prefix at the dropped message.
A session stops before its first request over ``max_tokens`` or after ``max_turns``.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from marconi_ray.traces.paths import default_data_dir, require_dir
from marconi_ray.traces.sessions import Turn, check_rate, poisson_starts, prefix_session
from marconi_ray.traces.tokenizer import Tokenizer, load_tokenizer
from marconi_ray.traces.trace import Request, Trace

GAP_MODES = ("recorded", "poisson")
KEEP_ROUNDS = 5
TRAJ_DIR = Path("swebench_agent_trajectories") / "mini_swe_agent_gemini3pro_swebench_verified"
Message = dict[str, Any]


def default_path(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The folder of ``*.traj.json`` files under ``data_dir`` (default data folder)."""
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    return base / TRAJ_DIR / "trajs"


def trajectory_files(path: str | os.PathLike[str]) -> list[Path]:
    """Sorted ``*.traj.json`` files in ``path`` (or in ``path/trajs``, searched recursively)."""
    root = require_dir(path)
    if (root / "trajs").is_dir():
        root = root / "trajs"
    files = sorted(root.rglob("*.traj.json"), key=lambda p: p.name)
    if not files:
        raise FileNotFoundError(f"no *.traj.json files under {root}")
    return files


def load_messages(path: Path) -> list[Message]:
    """The ``messages`` list of one trajectory; ValueError naming the file if malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from exc
    msgs = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(msgs, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in msgs
    ):
        raise ValueError(f"{path}: no valid 'messages' list of {{role, content}} objects")
    return msgs


def _created(message: Message) -> float | None:
    try:
        value = message["extra"]["response"]["created"]
    except (KeyError, TypeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def _arrivals(
    msgs: list[Message],
    asst: list[int],
    start: float,
    gaps: str,
    mean_gap: float,
    rng: np.random.Generator,
) -> list[float]:
    times = [start]
    for prev, cur in itertools.pairwise(asst):
        a, b = _created(msgs[prev]), _created(msgs[cur])
        recorded = gaps == "recorded" and a is not None and b is not None and b >= a
        gap = (b - a) if recorded and a is not None and b is not None else None
        times.append(times[-1] + (gap if gap is not None else float(rng.exponential(mean_gap))))
    return times


def _dropping_session(
    sid: int,
    encode: Callable[[int], list[int]],
    asst: list[int],
    times: list[float],
    max_tokens: int,
    max_turns: int | None,
) -> list[Request]:
    rounds: list[list[np.ndarray]] = []  # [observation tokens, reply tokens] per round
    out: list[Request] = []
    prev_end = 0
    empty = np.zeros(0, np.int32)
    for k, (idx, ts) in enumerate(zip(asst, times, strict=True)):
        if max_turns is not None and k >= max_turns:
            break
        obs = np.array([t for i in range(prev_end, idx) for t in encode(i)], np.int32)
        inp = np.concatenate([*(part for rnd in rounds for part in rnd), obs])
        if inp.size > max_tokens:
            break
        reply = np.array(encode(idx), np.int32)
        out.append(Request(sid, k, ts, inp, reply))
        rounds.append([obs, reply])
        if len(rounds) > KEEP_ROUNDS:
            rounds[-KEEP_ROUNDS][0] = empty
        prev_end = idx + 1
    return out


def _message_encoder(tok: Tokenizer, msgs: list[Message]) -> Callable[[int], list[int]]:
    def encode(i: int) -> list[int]:
        m = msgs[i]
        return tok.encode(json.dumps({"role": m["role"], "content": m["content"]}), True)

    return encode


def build_swebench(
    path: str | os.PathLike[str] | None = None,
    n_sessions: int = 50,
    sessions_per_second: float = 0.25,
    gaps: str = "recorded",
    mean_gap_s: float = 7.0,
    drop_old_observations: bool = False,
    max_tokens: int = 32768,
    max_turns: int | None = None,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
) -> Trace:
    """Build an agent trace of the first ``n_sessions`` trajectories (module docstring).

    ``path`` defaults to :func:`default_path`; ``tokenizer`` to Llama-2. Raises ValueError
    for a bad argument or when fewer than ``n_sessions`` trajectories exist.
    """
    if gaps not in GAP_MODES:
        raise ValueError(f"unknown gaps {gaps!r}; choose one of {', '.join(GAP_MODES)}")
    mean_gap = check_rate("mean_gap_s", mean_gap_s)
    if n_sessions < 0:
        raise ValueError(f"n_sessions must be >= 0, got {n_sessions}")
    files = trajectory_files(path if path is not None else default_path())
    if n_sessions > len(files):
        raise ValueError(f"n_sessions={n_sessions} but only {len(files)} trajectories exist")
    tok = tokenizer if tokenizer is not None else load_tokenizer(None)
    starts = poisson_starts(n_sessions, sessions_per_second, np.random.default_rng([seed, 0]))
    requests: list[Request] = []
    for sid, file in enumerate(tqdm(files[:n_sessions], disable=None, leave=False)):
        msgs = load_messages(file)
        asst = [i for i, m in enumerate(msgs) if m["role"] == "assistant" and i > 0]
        rng = np.random.default_rng([seed, 1, sid])
        times = _arrivals(msgs, asst, starts[sid], gaps, mean_gap, rng)
        encode = _message_encoder(tok, msgs)
        if drop_old_observations:
            requests += _dropping_session(sid, encode, asst, times, max_tokens, max_turns)
        else:
            turns = [Turn(i, ts) for i, ts in zip(asst, times, strict=True)]
            requests += prefix_session(sid, encode, turns, max_tokens, max_turns)
    return Trace.from_requests("swebench", requests)
