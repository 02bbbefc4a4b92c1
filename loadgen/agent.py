"""`marconi-loadgen agent`: SWE-bench agent trajectories replayed as agents send them,
through the official `openai` client's chat API: as tool-calling conversations (the
`bash` tool, assistant `tool_calls`, `tool` results) and, next to them in the same run,
as the recorded text (the flattened form today's trace replay sends), with the cached
tokens of every turn.

Each session replays its trajectory's turns in order, at temperature 0 with
`--max-output` tokens. With `--history live` (the default) the model's own replies take
the recorded ones' place, as in a running agent: in the `tools` form every turn forces a
call of the `bash` tool (`tool_choice` named, constrained decoding), and the recorded
observation answers it; with `trace` every turn sends the recorded messages. A session
stops at its first turn the server refuses (a prompt over the context limit among them)
or whose reply cannot be continued (a forced call cut by the token budget). The forms
are kept apart in the cache by a first line naming the form in the system message, so
neither hits the other's prefixes.

Writes `agent_requests.jsonl` (one record per turn), `agent_summary.json` (per form: the
token hit rate and, per turn, mean prompt and cached tokens), `agent_turns.md` (the table)
and `agent_cached_by_turn.png` into `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import openai
from openai import AsyncOpenAI
from tqdm import tqdm

from loadgen.agent_conversations import BASH_TOOL, FORMS, HISTORIES, Conversation, conversation
from loadgen.hosts import check_url
from loadgen.plots import plot_by_turn
from marconi_ray.traces.swebench import default_path, load_messages, trajectory_files


@dataclass(frozen=True)
class AgentRecord:
    """One replayed turn as the client saw it (`error`: None, or the API's message)."""

    form: str
    session_id: int
    turn: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = 0
    e2el_ms: float = 0.0
    error: str | None = None


def _marked(conv: Conversation) -> list[dict[str, Any]]:
    """`conv`'s messages with the form named on the first message's first line."""
    messages = [dict(m) for m in conv.messages]
    messages[0]["content"] = f"[replay: {conv.form}]\n{messages[0]['content']}"
    return messages


async def _session(
    client: AsyncOpenAI,
    model: str,
    conv: Conversation,
    max_output: int,
    history: str,
    bar: tqdm[Any],
) -> list[AgentRecord]:
    marked = Conversation(conv.session_id, conv.form, tuple(_marked(conv)), conv.turns)
    out: list[AgentRecord] = []
    extra: dict[str, Any] = {}
    if conv.form == "tools":
        extra["tools"] = [BASH_TOOL]
        if history == "live":
            extra["tool_choice"] = {"type": "function", "function": {"name": "bash"}}
    sent = marked.request(0)
    for k in range(len(conv.turns)):
        if k and history == "trace":
            sent = marked.request(k)
        t0 = time.perf_counter()
        try:
            reply = await client.chat.completions.create(
                model=model,
                messages=sent,  # type: ignore[arg-type]
                max_tokens=max_output,
                temperature=0.0,
                **extra,
            )
        except openai.APIStatusError as exc:
            out.append(AgentRecord(conv.form, conv.session_id, k, error=str(exc.message)))
            bar.update(len(conv.turns) - k)
            return out
        usage = reply.usage
        details = usage.prompt_tokens_details if usage is not None else None
        out.append(
            AgentRecord(
                conv.form,
                conv.session_id,
                k,
                usage.prompt_tokens if usage is not None else 0,
                (details.cached_tokens or 0) if details is not None else 0,
                usage.completion_tokens if usage is not None else 0,
                len(reply.choices[0].message.tool_calls or ()),
                (time.perf_counter() - t0) * 1e3,
            )
        )
        bar.update(1)
        if history == "live" and k + 1 < len(conv.turns):
            message = reply.choices[0].message.model_dump(exclude_none=True)
            try:
                sent = marked.next_request(sent, k, message)
            except ValueError as exc:
                out[-1] = dataclasses.replace(out[-1], error=str(exc))
                bar.update(len(conv.turns) - k - 1)
                return out
    return out


async def replay(
    url: str,
    model: str,
    conversations: Sequence[Conversation],
    max_output: int = 128,
    history: str = "live",
    concurrency: int = 4,
    api_key: str = "unused",
    http_client: Any = None,
    progress: bool = True,
) -> list[AgentRecord]:
    """Replay `conversations` against the server at `url` with `history` (`live` or
    `trace`), `concurrency` sessions at a time; records in (form, session, turn)
    order. `http_client` (an `httpx.AsyncClient`) replaces the client's own transport
    (tests serve the app in process)."""
    client = AsyncOpenAI(
        base_url=f"{url.rstrip('/')}/v1", api_key=api_key, http_client=http_client, max_retries=0
    )
    gate = asyncio.Semaphore(concurrency)
    total = sum(len(c.turns) for c in conversations)
    with tqdm(total=total, disable=not progress, unit="turn", desc="agent replay") as bar:

        async def gated(conv: Conversation) -> list[AgentRecord]:
            async with gate:
                return await _session(client, model, conv, max_output, history, bar)

        done = await asyncio.gather(*(gated(c) for c in conversations))
    records = [r for batch in done for r in batch]
    return sorted(records, key=lambda r: (r.form, r.session_id, r.turn))


def summarize(records: Sequence[AgentRecord]) -> dict[str, Any]:
    """Per form: turns served, errors, the token hit rate (cached over prompt tokens of
    the turns served) and per turn index the mean prompt and cached tokens, and the mean
    share of the previous turn (its prompt and reply) that was found cached (1.0: all of
    it; with `trace` history a recorded reply is not what the model generated, so about
    the previous prompt's share)."""
    out: dict[str, Any] = {}
    for form in sorted({r.form for r in records}):
        mine = [r for r in records if r.form == form]
        served = [r for r in mine if r.error is None]
        by_turn: dict[int, list[AgentRecord]] = defaultdict(list)
        for r in served:
            by_turn[r.turn].append(r)
        previous = {(r.session_id, r.turn): r.prompt_tokens + r.completion_tokens for r in served}
        turns = {}
        for k, rs in sorted(by_turn.items()):
            shares = [
                r.cached_tokens / previous[(r.session_id, k - 1)]
                for r in rs
                if previous.get((r.session_id, k - 1))
            ]
            turns[str(k)] = {
                "sessions": len(rs),
                "prompt_tokens": sum(r.prompt_tokens for r in rs) / len(rs),
                "cached_tokens": sum(r.cached_tokens for r in rs) / len(rs),
                "previous_turn_cached": sum(shares) / len(shares) if shares else None,
            }
        prompt = sum(r.prompt_tokens for r in served)
        out[form] = {
            "turns_served": len(served),
            "errors": len(mine) - len(served),
            "tool_calls": sum(r.tool_calls for r in served),
            "token_hit_rate": sum(r.cached_tokens for r in served) / prompt if prompt else 0.0,
            "by_turn": turns,
        }
    return out


def turns_table(summary: dict[str, Any]) -> str:
    """Markdown: per turn, each form's mean prompt and cached tokens side by side."""
    forms = list(summary)
    head = "| turn | " + " | ".join(
        f"{f}: prompt / cached (share of the previous turn cached)" for f in forms
    )
    lines = [head + " |", "| --- |" + " --- |" * len(forms)]
    turns = sorted({int(k) for f in forms for k in summary[f]["by_turn"]})
    for k in turns:
        cells = []
        for f in forms:
            t = summary[f]["by_turn"].get(str(k))
            if t is None:
                cells.append("-")
                continue
            share = t["previous_turn_cached"]
            shown = "-" if share is None else f"{share:.2f}"
            cells.append(f"{t['prompt_tokens']:,.0f} / {t['cached_tokens']:,.0f} ({shown})")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    rates = ", ".join(f"{f} {summary[f]['token_hit_rate']:.3f}" for f in forms)
    return "\n".join(lines) + f"\n\nToken hit rate: {rates}\n"


def write_agent_run(records: Sequence[AgentRecord], out: Path) -> dict[str, Any]:
    """Write the run's files (module docstring) into `out`; returns the summary."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "agent_requests.jsonl", "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(asdict(r)) + "\n")
    summary = summarize(records)
    (out / "agent_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "agent_turns.md").write_text(turns_table(summary))
    series = {
        f: {k: t["cached_tokens"] for k, t in s["by_turn"].items()} for f, s in summary.items()
    }
    plot_by_turn(
        series,
        out / "agent_cached_by_turn.png",
        "mean cached tokens",
        "Cached tokens by agent turn",
    )
    return summary


def load_conversations(
    folder: Path, sessions: int, forms: Sequence[str], max_chars: int | None
) -> list[Conversation]:
    """The first `sessions` trajectories of `folder` in each of `forms`."""
    files = trajectory_files(folder)[:sessions]
    return [
        conversation(i, load_messages(path), form, max_chars)
        for form in forms
        for i, path in enumerate(files)
    ]


def add_parser(subparsers: Any) -> None:
    """Register the `agent` subcommand."""
    p = subparsers.add_parser(
        "agent",
        help="replay SWE-bench agent trajectories as tool-calling conversations",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name sent (default: the first listed)")
    p.add_argument(
        "--trajectories",
        type=Path,
        default=None,
        help="folder of mini-swe-agent *.traj.json files (default: the data folder's "
        "swebench_agent_trajectories/mini_swe_agent_gemini3pro_swebench_verified)",
    )
    p.add_argument("--sessions", type=int, default=8, help="trajectories to replay [%(default)s]")
    p.add_argument(
        "--forms",
        default="tools,flat",
        help="forms to replay, comma-separated: tools (tool calls and tool results), "
        "flat (the recorded text) [%(default)s]",
    )
    p.add_argument(
        "--max-chars",
        type=int,
        default=1000,
        help="cut every message to this many characters, so sessions fit a small "
        "model's context (0: no cut) [%(default)s]",
    )
    p.add_argument(
        "--history",
        choices=HISTORIES,
        default="live",
        help="live: the model's replies take the recorded ones' place (tools: every turn "
        "forces a bash call, which the recorded observation answers); trace: every turn "
        "sends the recorded messages [%(default)s]",
    )
    p.add_argument(
        "--max-output",
        type=int,
        default=128,
        help="tokens per turn (a forced bash call needs about 100) [%(default)s]",
    )
    p.add_argument("--concurrency", type=int, default=4, help="sessions at once [%(default)s]")
    p.add_argument("--api-key", default="unused", help="bearer token, if the server has one")
    p.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                   help="allow a non-loopback host (repeatable)")  # fmt: skip
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    """Replay, write the files, print the table; 0 (refused turns are reported)."""
    check_url(args.url, args.allow_host)
    forms = [f for f in args.forms.split(",") if f]
    bad = [f for f in forms if f not in FORMS]
    if bad or not forms:
        raise ValueError(f"--forms: {bad or args.forms!r} not among {', '.join(FORMS)}")
    for name in ("sessions", "max_output", "concurrency"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.max_chars < 0:
        raise ValueError(f"--max-chars must be >= 0, got {args.max_chars}")
    folder = args.trajectories if args.trajectories is not None else default_path()
    convs = load_conversations(folder, args.sessions, forms, args.max_chars or None)
    model = args.model or _first_model(args.url, args.api_key)
    records = asyncio.run(
        replay(args.url, model, convs, args.max_output, args.history, args.concurrency,
               args.api_key, progress=not args.no_progress)
    )  # fmt: skip
    summary = write_agent_run(records, args.out)
    print(turns_table(summary))
    print(f"wrote {args.out}/agent_requests.jsonl, agent_summary.json, agent_turns.md, "
          "agent_cached_by_turn.png")  # fmt: skip
    return 0


def _first_model(url: str, api_key: str) -> str:
    client = openai.OpenAI(base_url=f"{url.rstrip('/')}/v1", api_key=api_key, max_retries=0)
    return str(client.models.list().data[0].id)
