"""`marconi-loadgen`: the load generator's command line.

Subcommands live in modules ``loadgen.<name>`` for each name in ``SUBCOMMANDS``; each
exposes ``add_parser(subparsers)`` registering a parser with ``func(args) -> int``. A
subcommand whose module is missing is skipped. Bad arguments, unknown traces and missing
data exit with code 2 and a one-line error naming the value.

The load generator speaks HTTP only (import-linter contract "loadgen speaks HTTP only"):
``compare``, which deploys our service once per caching system, forwards its arguments to
``benchmarks/compare_systems.py`` in a child process (``loadgen.compare``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

PROG = "marconi-loadgen"
SUBCOMMANDS = ["run", "compare", "agent"]


def build_parser(subcommands: Sequence[str] = SUBCOMMANDS) -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Replay real multi-turn sessions against an OpenAI-compatible server "
        "and measure TTFT, TPOT, ITL, E2EL, throughput, goodput and cache hits.",
    )
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in subcommands:
        module_name = f"loadgen.{name}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        module.add_parser(subs)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: sys.argv[1:]), run the subcommand, return its exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
