"""The load options `run` and the comparison (`benchmarks/compare_systems.py`, what
`marconi-loadgen compare` runs) share: one table of flags and their mapping onto
`LoadConfig` fields, so both commands spell, default and document them the same way."""

from __future__ import annotations

import argparse
from typing import Any

from marconi_ray.traces.registry import CHOICES


def session_rate(text: str) -> float | None:
    """`--session-rate`: a rate, or `none` (fixed users, with `--concurrency`)."""
    return None if text.lower() == "none" else float(text)


# (flag, type, default, help): the flag's dest is the LoadConfig field it sets.
LOAD_OPTIONS: tuple[tuple[str, Any, Any, str], ...] = (
    (
        "--trace",
        str,
        "sharegpt",
        f"trace: {', '.join(CHOICES)}; mooncake[-chained]:FILE reads a Mooncake-format "
        "JSONL of block hash ids as pseudo-random token ids in [0, 32000) (chained: "
        "conversations rebuilt; bare names: the data folder's shared file, whose inputs "
        "average 15k tokens, so raise --max-prompt; send them in tokens mode)",
    ),
    ("--sessions", int, 30, "sessions to run (the trace's first N)"),
    ("--burstiness", float, 1.0, "gamma shape of session inter-arrivals (1 = Poisson)"),
    (
        "--arrivals",
        str,
        "rate",
        "rate: sessions start at --session-rate; trace: each at its first request's time "
        "in the trace (Mooncake's timestamp, the Azure trace's TIMESTAMP, ShareGPT's ts), "
        "scaled by --time-scale",
    ),
    ("--time-scale", float, 1.0, "with --arrivals trace: factor on the trace's clock"),
    ("--concurrency", int, None, "most sessions in flight; with --session-rate none: fixed users"),
    ("--think", str, "fixed:0", "pause between turns: 'trace', 'fixed:S' or 'exp:MEAN' seconds"),
    ("--history", str, "live", "live (resend the model's replies) or trace (recorded replies)"),
    ("--max-output", int, 32, "decoded tokens per turn, at most"),
    ("--max-prompt", int, 2048, "a session stops at its first prompt longer than this"),
    ("--warmup", int, 0, "first N requests left out of the statistics"),
    ("--max-requests", int, None, "start no request after this many"),
    ("--max-seconds", float, None, "start no request after this many seconds"),
    ("--slo-ttft-ms", float, None, "goodput: TTFT bound in ms"),
    ("--slo-tpot-ms", float, None, "goodput: TPOT bound in ms"),
    ("--slo-e2el-ms", float, None, "goodput: end-to-end latency bound in ms"),
    ("--seed", int, 0, "seed of arrivals and think times"),
)
LOAD_FIELDS = ("session_rate", *(flag[2:].replace("-", "_") for flag, *_ in LOAD_OPTIONS))


def add_load_options(parser: argparse.ArgumentParser, rate_default: float | None) -> None:
    """Add every shared load option (defaults shown in the help)."""
    rate_help = "new sessions per second (Poisson, or gamma with --burstiness); 'none': fixed users"
    parser.add_argument(
        "--session-rate", type=session_rate, default=rate_default, help=f"{rate_help} [%(default)s]"
    )
    add_options(parser, LOAD_OPTIONS)


def add_options(
    parser: argparse.ArgumentParser, rows: tuple[tuple[str, Any, Any, str], ...]
) -> None:
    """Add (flag, type, default, help) rows; a default is shown in its help."""
    for flag, kind, default, text in rows:
        shown = "" if default is None else " [%(default)s]"
        parser.add_argument(flag, type=kind, default=default, help=text + shown)


def load_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The shared options as `LoadConfig` keyword arguments."""
    return {name: getattr(args, name) for name in LOAD_FIELDS}
