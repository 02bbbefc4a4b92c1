"""The `marconi-loadgen run` subcommand: arguments -> LoadConfig -> run -> files + table.

Subcommand modules expose ``add_parser(subparsers)``, which registers a parser whose
defaults carry ``func(args) -> int`` (the exit code).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.config import LoadConfig
from loadgen.options import add_load_options, load_kwargs
from loadgen.output import write_run
from loadgen.runner import run_load
from loadgen.table import format_summary


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``run`` on ``subparsers``."""
    p = subparsers.add_parser(
        "run",
        help="replay multi-turn sessions against an OpenAI-compatible server",
        description="Replay the sessions of a trace as streaming /v1/completions requests, "
        "record TTFT/TPOT/ITL/E2EL per request, and write requests.jsonl, summary.json "
        "and TTFT plots to --out.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name sent (default: first of /v1/models)")
    p.add_argument(
        "--prompt-mode",
        choices=("tokens", "text"),
        default="tokens",
        help="tokens: token-id prompts (map with --vocab-size); text: prompts detokenized "
        "with the Llama-2 tokenizer of the data folder (for mooncake traces, whose ids are "
        "pseudo-random, that text is gibberish that re-tokenizes to other ids and lengths, "
        "so prefix reuse is not what the trace says: use tokens)",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="model vocabulary for tokens mode: ids map to id %% (V-8) + 7 (needed for "
        "marconi-ray's byte-level models; default: send trace ids unchanged)",
    )
    add_load_options(p, rate_default=None)
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST",
        help="allow a non-loopback host (repeatable)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> LoadConfig:
    """The LoadConfig of parsed ``run`` arguments (validated later by `run_load`)."""
    kwargs = load_kwargs(args)
    if kwargs["session_rate"] is None and args.concurrency is None:
        kwargs["session_rate"] = 1.0
    return LoadConfig(
        url=args.url,
        model=args.model,
        prompt_mode=args.prompt_mode,
        vocab_size=args.vocab_size,
        allow_hosts=tuple(args.allow_host),
        timeout_s=args.timeout,
        **kwargs,
    )


def main(args: argparse.Namespace) -> int:
    """Run, write the files, print the table; 0 (failed requests are reported, not fatal)."""
    result = run_load(config_from_args(args), progress=not args.no_progress)
    write_run(result, args.out)
    print(format_summary(result.summary))
    print(f"wrote {args.out}/requests.jsonl, summary.json, ttft_cdf.png, ttft_by_turn.png")
    return 0
