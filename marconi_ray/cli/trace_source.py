"""The trace options shared by `replay` and `trace build`, and loading the trace they name."""

from __future__ import annotations

import argparse
from pathlib import Path

from marconi_ray.cli import values
from marconi_ray.traces.paths import default_data_dir
from marconi_ray.traces.registry import BUILDERS, MOONCAKE_KINDS, load_trace, mooncake_spec
from marconi_ray.traces.tokenizer import LLAMA2_RELPATH
from marconi_ray.traces.trace import Trace

TRACE_NAMES = (*BUILDERS, "sample", *MOONCAKE_KINDS)
MOONCAKE_HELP = (
    "mooncake:FILE / mooncake-chained:FILE, a Mooncake-format JSONL[.gz] of prefix-block "
    "hash ids turned into pseudo-random token ids (512 per block), each request its own "
    "session or, chained, each request joined to the earlier one whose input + output it "
    "extends (bare mooncake / mooncake-chained: the data folder's "
    "mooncake/synthetic_trace.jsonl)"
)
_FILE_SUFFIXES = (".jsonl", ".jsonl.gz")


def default_trace(data_dir: str | None = None) -> str:
    """`sharegpt` when the data folder exists, else the packaged `sample`."""
    folder = Path(data_dir) if data_dir is not None else default_data_dir()
    return "sharegpt" if folder.is_dir() else "sample"


def add_source_options(parser: argparse.ArgumentParser) -> None:
    """Options that shape the trace: session count and rate, data folder, tokenizer."""
    parser.add_argument(
        "--sessions",
        type=values.positive_int,
        metavar="N",
        help="keep only the first N sessions (default: the builder's default, 100 for "
        "sharegpt, 50 for swebench; every session of `sample`, of files and of mooncake "
        "traces, where an unchained request is a session of its own)",
    )
    parser.add_argument(
        "--sessions-per-second",
        type=values.positive_float,
        metavar="X",
        help="session start rate: one every 1/X s for sharegpt, `sample`, files and "
        "mooncake traces (gaps within a session kept), a Poisson rate for "
        "sharegpt-rejoined and swebench (default: the builder's default; recorded "
        "timestamps for `sample`, files and mooncake traces, timestamp/1000 s)",
    )
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help=f"folder with the raw ShareGPT/SWE-bench data, the tokenizers and "
        f"mooncake/synthetic_trace.jsonl, read by a bare `mooncake` or `mooncake-chained` "
        f"(default: $MARCONI_DATA_DIR or {default_data_dir()})",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="SentencePiece .model file or folder with tokenizer.json used to tokenize "
        "built traces (default: the Llama-2 tokenizer in the data folder; not used by "
        "`sample`, files and mooncake traces, which hold token ids already)",
    )


def add_trace_option(parser: argparse.ArgumentParser) -> None:
    """`--trace NAME|FILE`, defaulting as `default_trace`."""
    parser.add_argument(
        "--trace",
        metavar="NAME|FILE",
        help=f"trace to use: one of {', '.join(TRACE_NAMES)}, an artifact JSONL file "
        f"(.jsonl or .jsonl.gz), or {MOONCAKE_HELP}; default: sharegpt when the data "
        "folder exists, else sample",
    )


def _tokenizer(args: argparse.Namespace) -> str | None:
    if args.tokenizer is not None:
        return str(args.tokenizer)
    if args.data_dir is not None:
        return str(Path(args.data_dir) / LLAMA2_RELPATH)
    return None


def load_from_args(spec: str | None, args: argparse.Namespace) -> Trace:
    """The trace `spec` (None: the default) shaped by the source options in `args`.

    Raises ValueError / FileNotFoundError naming the bad spec, file, line or option.
    """
    if spec is None:
        spec = default_trace(args.data_dir)
    if spec not in TRACE_NAMES and mooncake_spec(spec) is None and not Path(spec).is_file():
        if spec.endswith(_FILE_SUFFIXES) or "/" in spec:
            raise FileNotFoundError(f"trace file not found: {spec}")
        raise ValueError(
            f"unknown trace {spec!r}; choose one of {', '.join(TRACE_NAMES)}, "
            "give a .jsonl[.gz] file, or mooncake:FILE / mooncake-chained:FILE"
        )
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        raise FileNotFoundError(f"data folder not found: {args.data_dir}")
    trace = load_trace(
        spec,
        n_sessions=args.sessions,
        sessions_per_second=args.sessions_per_second,
        data_dir=args.data_dir,
        tokenizer=_tokenizer(args) if spec in BUILDERS else None,
    )
    if len(trace) == 0:
        raise ValueError(f"trace {spec!r} has no requests")
    return trace


def trace_stats(trace: Trace) -> dict[str, float | str]:
    """Trace.stats() plus the trace name and its duration in seconds."""
    stats: dict[str, float | str] = {"name": trace.name}
    stats.update(trace.stats())
    ts = [r.ts for r in trace.requests]
    stats["duration_s"] = (max(ts) - min(ts)) if ts else 0.0
    return stats


def format_stats(stats: dict[str, float | str]) -> str:
    """One `key: value` line per stat; integral floats print as ints, others with 2
    decimals, or 4 when below 1 (fractions)."""
    lines = []
    for key, value in stats.items():
        if isinstance(value, float):
            if value.is_integer():
                text = str(int(value))
            else:
                text = f"{value:.4f}" if abs(value) < 1 else f"{value:.2f}"
        else:
            text = value
        lines.append(f"{key}: {text}")
    return "\n".join(lines)
