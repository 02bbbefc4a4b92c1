"""SWE-bench agent trajectories replayed as tool-calling conversations next to their
flattened text, through the official `openai` client, side by side in one run.

For each caching system of `--systems` and each history of `--histories`, a fresh
in-process server (the app over a `LocalBackend` engine on the packaged `chat` model,
its cache empty) gets `marconi-loadgen agent`'s replay (`loadgen.agent.replay`) of the
first `--sessions` trajectories of the shared data folder in both forms (`tools`,
`flat`), `--max-chars` characters per message so that sessions fit the model's 4,096
positions. Writes each run's files under `OUT/<system>-<history>/` and the tables of all
of them to `OUT/agent_replay.md`.

Example: python benchmarks/agent_replay.py --sessions 6
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import httpx
import torch

from loadgen.agent import load_conversations, replay, turns_table, write_agent_run
from marconi_ray.engine.engine import Engine
from marconi_ray.serve.ingress.api import build_app
from marconi_ray.serve.ingress.local_backend import LocalBackend
from marconi_ray.serve.ingress.prepare import ServedModel
from marconi_ray.serve.model_source import resolve_model
from marconi_ray.traces.swebench import default_path


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--systems", default="marconi,vllm+", help="caching systems, comma-separated")
    p.add_argument("--histories", default="live,trace", help="live and/or trace")
    p.add_argument("--sessions", type=int, default=6, help="trajectories replayed")
    p.add_argument("--max-chars", type=int, default=600, help="characters per message at most")
    p.add_argument("--max-output", type=int, default=128, help="tokens per turn")
    p.add_argument("--cache-bytes", type=int, default=400_000_000, help="cache budget")
    p.add_argument("--concurrency", type=int, default=3, help="sessions at once")
    p.add_argument("--out", default="benchmarks/results/agent_replay", help="output folder")
    return p.parse_args()


async def one_run(system: str, history: str, args: argparse.Namespace) -> list[Any]:
    model_dir = resolve_model("chat")
    engine = Engine(model_dir, system=system, cache_bytes=args.cache_bytes, max_batch=8)
    app = build_app(LocalBackend(engine), ServedModel.load(model_dir, "chat"))
    convs = load_conversations(default_path(), args.sessions, ("tools", "flat"), args.max_chars)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://replay") as http:
        return await replay(
            "http://replay", "chat", convs, args.max_output, history, args.concurrency,
            http_client=http,
        )  # fmt: skip


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    sections = []
    for system in args.systems.split(","):
        for history in args.histories.split(","):
            records = asyncio.run(one_run(system, history, args))
            summary = write_agent_run(records, out / f"{system}-{history}")
            errors = {form: s["errors"] for form, s in summary.items()}
            sections.append(
                f"## {system}, {history} history (sessions ended early: {errors})\n\n"
                + turns_table(summary)
            )
    text = "\n".join(sections)
    (out / "agent_replay.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
