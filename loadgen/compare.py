"""`marconi-loadgen compare`: forwards to the end-to-end comparison of the caching systems,
`benchmarks/compare_systems.py`.

The comparison deploys our service (a local Ray, one Serve app per caching system, each
cache's cost model read from its coordinator), and the load generator speaks HTTP only
(import-linter contract "loadgen speaks HTTP only": nothing under `loadgen/` imports
`marconi_ray.serve`, `marconi_ray.cli`, `marconi_ray.engine`, `ray`, `torch` or
`marconi_kernels`). So the deployment lives in `benchmarks/compare_systems.py`, and this
subcommand runs it as a child process with the same interpreter:

    marconi-loadgen compare ARGS   ==   python benchmarks/compare_systems.py ARGS

same options (`marconi-loadgen compare --help` lists them), same outputs
(`OUT/<system>/`, `OUT/compare.json`, `OUT/compare.md`, `OUT/ttft_cdf.png`,
`OUT/ttft_by_turn.png`), same exit code; usage and errors name `marconi-loadgen compare`.
The script is looked up in the marconi-ray checkout this package was installed from
(`pip install -e .`); a wheel install has no `benchmarks/`, and then `compare` exits 2
saying where to get it. Ctrl-C reaches the child too (same process group), which tears
its deployment down; this process waits for it.

What the load generator keeps of the comparison is the analysis,
`loadgen.compare_report` (the simulator's requests, the table, `write_report`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

NAME = "compare"
PROG = f"marconi-loadgen {NAME}"
# The comparison's script in the checkout next to this package.
SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_systems.py"
# Tells the script which name to show in usage and errors (compare_systems.PROG_ENV).
PROG_ENV = "MARCONI_COMPARE_PROG"
EXIT_USAGE = 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `compare` on the `marconi-loadgen` subcommands: every argument after it,
    `--help` included, goes to the script unparsed (`func=run`)."""
    p = subparsers.add_parser(
        NAME,
        help="deploy our service once per caching system, run the same load against each, "
        "compare TTFT and hit rates (measured vs simulated); runs "
        "benchmarks/compare_systems.py (--help: its options)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,  # `--help` is the script's
        prefix_chars="+",  # so that no `-`/`--` argument is taken as ours
    )
    p.add_argument("args", nargs=argparse.REMAINDER, help="benchmarks/compare_systems.py's")
    p.set_defaults(func=run)


def command(args: Sequence[str], script: Path = SCRIPT) -> list[str]:
    """The child's command line: this interpreter, the script, `args` unchanged."""
    return [sys.executable, str(script), *args]


def missing_message(script: Path) -> str:
    return (
        f"{script} not found: the comparison deploys our service, which the load generator "
        "(HTTP only) does not do; it lives in benchmarks/compare_systems.py of a marconi-ray "
        "checkout. Run `python benchmarks/compare_systems.py --help` there, or install the "
        "checkout with `pip install -e .` to have `marconi-loadgen compare` forward to it."
    )


def forward(args: Sequence[str], script: Path = SCRIPT) -> int:
    """Run the comparison script with `args` and return its exit code (128 + N when
    signal N ended it); 2 with a one-line error when the script is not there."""
    if not script.is_file():
        print(f"{PROG}: error: {missing_message(script)}", file=sys.stderr)
        return EXIT_USAGE
    env = {**os.environ, PROG_ENV: PROG}
    proc = subprocess.Popen(command(args, script), env=env)
    while True:
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            continue  # the child got the same SIGINT and is shutting its deployment down
        return code if code >= 0 else 128 - code


def run(args: argparse.Namespace) -> int:
    """The `compare` subcommand: `forward` its arguments."""
    return forward(args.args)
