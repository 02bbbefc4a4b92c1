"""The `marconi-loadgen run` subcommand: arguments -> LoadConfig -> run -> files + table.

Subcommand modules expose ``add_parser(subparsers)``, which registers a parser whose
defaults carry ``func(args) -> int`` (the exit code).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from loadgen.config import LoadConfig
from loadgen.output import write_run
from loadgen.runner import run_load
from loadgen.table import format_summary
from marconi_ray.traces.registry import CHOICES


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
    p.add_argument("--trace", default="sharegpt", help=f"trace: {', '.join(CHOICES)}")
    p.add_argument("--sessions", type=int, default=30, help="sessions to run (the trace's first N)")
    p.add_argument(
        "--session-rate",
        type=float,
        default=None,
        help="new sessions per second (default 1.0 unless --concurrency is given alone)",
    )
    p.add_argument(
        "--burstiness", type=float, default=1.0, help="gamma shape of session gaps (1 = Poisson)"
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="most sessions in flight; without --session-rate: that many fixed users",
    )
    p.add_argument(
        "--think",
        default="fixed:0",
        help="pause between turns: 'trace' (the trace's gaps), 'fixed:S' or 'exp:MEAN' seconds",
    )
    p.add_argument(
        "--history",
        choices=("live", "trace"),
        default="live",
        help="live: resend the model's actual replies; trace: the recorded replies",
    )
    p.add_argument(
        "--prompt-mode",
        choices=("tokens", "text"),
        default="tokens",
        help="tokens: token-id prompts (map with --vocab-size); text: detokenized prompts",
    )
    p.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="model vocabulary for tokens mode: ids map to id %% (V-8) + 7 (needed for "
        "marconi-ray's byte-level models; default: send trace ids unchanged)",
    )
    p.add_argument("--max-output", type=int, default=32, help="cap on decoded tokens per turn")
    p.add_argument(
        "--max-prompt", type=int, default=2048, help="a session stops before a longer prompt"
    )
    p.add_argument("--warmup", type=int, default=0, help="first N requests left out of stats")
    p.add_argument("--max-requests", type=int, default=None, help="launch at most N requests")
    p.add_argument(
        "--max-seconds", type=float, default=None, help="launch no request after S seconds"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout, seconds")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="goodput TTFT threshold")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="goodput TPOT threshold")
    p.add_argument("--slo-e2el-ms", type=float, default=None, help="goodput E2EL threshold")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and think times")
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
    rate = args.session_rate
    if rate is None and args.concurrency is None:
        rate = 1.0
    return LoadConfig(
        url=args.url,
        trace=args.trace,
        model=args.model,
        sessions=args.sessions,
        session_rate=rate,
        burstiness=args.burstiness,
        concurrency=args.concurrency,
        think=args.think,
        history=args.history,
        prompt_mode=args.prompt_mode,
        vocab_size=args.vocab_size,
        max_output=args.max_output,
        max_prompt=args.max_prompt,
        warmup=args.warmup,
        max_requests=args.max_requests,
        max_seconds=args.max_seconds,
        slo_ttft_ms=args.slo_ttft_ms,
        slo_tpot_ms=args.slo_tpot_ms,
        slo_e2el_ms=args.slo_e2el_ms,
        seed=args.seed,
        allow_hosts=tuple(args.allow_host),
        timeout_s=args.timeout,
    )


def main(args: argparse.Namespace) -> int:
    """Run, write the files, print the table; 0 (failed requests are reported, not fatal)."""
    result = run_load(config_from_args(args), progress=not args.no_progress)
    write_run(result, args.out)
    print(format_summary(result.summary))
    print(f"wrote {args.out}/requests.jsonl, summary.json, ttft_cdf.png, ttft_by_turn.png")
    return 0
