"""`marconi-ray trace build|stats`: export a trace as artifact JSONL, or print its stats.

`stats` adds the reuse classes of the trace (:mod:`marconi_ray.core.sim.reuse`): the oracle
hit of each request, split by where it ends (continuation, branch, inside_input).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from marconi_ray.cli.trace_source import (
    MOONCAKE_HELP,
    TRACE_NAMES,
    add_source_options,
    add_trace_option,
    default_trace,
    format_stats,
    load_from_args,
    trace_stats,
)
from marconi_ray.core.sim.reuse import reuse_stats
from marconi_ray.traces.trace import write_jsonl

_OUT_SUFFIXES = (".jsonl", ".jsonl.gz")


def add_parser(subparsers: Any) -> None:
    """Register `trace` with its `build` and `stats` subcommands."""
    p = subparsers.add_parser(
        "trace",
        help="build, export and inspect request traces",
        description="Build a trace and export it as artifact JSONL, or print trace stats.",
    )
    sub = p.add_subparsers(dest="trace_command", metavar="{build,stats}", required=True)

    build = sub.add_parser(
        "build",
        help="build a trace and write it as artifact JSONL",
        description="Build (or load) a trace and write it as artifact JSONL (gzip when the "
        "name ends in .gz), then print its stats.",
    )
    add_trace_option(build)
    add_source_options(build)
    build.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="output file, ending in .jsonl or .jsonl.gz (folders are created)",
    )
    build.set_defaults(func=run_build)

    stats = sub.add_parser(
        "stats",
        help="print the stats of a trace",
        description="Print request, session and token counts of a trace (chain counts "
        "for mooncake-chained), then its reuse classes: each request's oracle hit (the "
        "longest input prefix an earlier request's input + output started with) split by "
        "where it ends: continuation (where an earlier input + output ended), branch "
        "(where earlier sequences part, or an earlier input ended; branch_input_end: only "
        "the latter), inside_input (strictly inside an earlier sequence, where Marconi "
        "keeps no state); reuse_*_tokens and reuse_*_fraction weigh by tokens, "
        "reuse_*_requests count requests (miss: nothing reused).",
    )
    stats.add_argument(
        "spec",
        metavar="FILE_OR_NAME",
        help=f"a trace name ({', '.join(TRACE_NAMES)}), an artifact JSONL file, or {MOONCAKE_HELP}",
    )
    add_source_options(stats)
    stats.set_defaults(func=run_stats)


def run_build(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Export the trace to `--out` and print its stats; 0 on success."""
    out = Path(args.out)
    if not out.name.endswith(_OUT_SUFFIXES):
        raise ValueError(f"--out {out} must end in .jsonl or .jsonl.gz")
    if out.is_dir():
        raise ValueError(f"--out {out} is a folder")
    spec = args.trace if args.trace is not None else default_trace(args.data_dir)
    trace = load_from_args(spec, args)
    write_jsonl(trace, out)
    print(format_stats(trace_stats(trace)))
    print(f"wrote {out}")
    return 0


def run_stats(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Print the stats and reuse classes of the trace named by the positional spec; 0 on
    success."""
    trace = load_from_args(args.spec, args)
    stats = trace_stats(trace)
    stats.update(reuse_stats(trace.requests).as_dict())
    print(format_stats(stats))
    return 0
