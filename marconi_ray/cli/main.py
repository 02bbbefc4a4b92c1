"""`marconi-ray`: the command-line entry point (argument parsing, dispatch, error exits).

Bad input (an unknown value, a missing or malformed file) ends the command with one line
`marconi-ray: error: ...` on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from marconi_ray import __version__
from marconi_ray.cli import explain, generate, make_model, models, replay, serve, trace_cmd

PROG = "marconi-ray"
EXIT_USAGE = 2


class UsageError(ValueError):
    """Bad command-line input, reported by `main` as a one-line error."""


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise `UsageError` instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> CliParser:
    """The full parser with every subcommand."""
    parser = CliParser(
        prog=PROG,
        description="Prefix caching for hybrid Attention+SSM LLMs (Marconi): replay "
        "traces through caching systems, build traces, make random-weight models, serve "
        "them (OpenAI API on Ray Serve), and list the model families the engine serves.",
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {__version__}", help="print version"
    )
    sub = parser.add_subparsers(
        dest="command",
        metavar="{replay,trace,make-model,generate,serve,models,explain}",
        required=True,
    )
    replay.add_parser(sub)
    trace_cmd.add_parser(sub)
    make_model.add_parser(sub)
    generate.add_parser(sub)
    serve.add_parser(sub)
    models.add_parser(sub)
    explain.add_parser(sub)
    return parser


def _one_line(text: str) -> str:
    return " ".join(text.splitlines())


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in `argv` (default: sys.argv[1:]); return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(args_list)
        code: int = args.func(args, args_list)
    except SystemExit as exc:  # --help and --version
        return exc.code if isinstance(exc.code, int) else 0
    except (ValueError, FileNotFoundError) as exc:
        sys.stderr.write(f"{PROG}: error: {_one_line(str(exc))}\n")
        return EXIT_USAGE
    return code


if __name__ == "__main__":
    sys.exit(main())
