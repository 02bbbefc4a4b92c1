"""Build the packaged sample trace: the first 20 sessions of the artifact-mode ShareGPT trace.

Usage: ``python scripts/make_sample_trace.py [--data-dir DIR] [--out FILE]``. Writes
``marconi_ray/data/sharegpt_sample.jsonl.gz`` by default (gzip, deterministic bytes) and
fails if the result is 2 MB or more.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from marconi_ray.traces.sharegpt import build_sharegpt, default_path
from marconi_ray.traces.trace import write_jsonl

N_SESSIONS = 20
MAX_BYTES = 2_000_000
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "marconi_ray" / "data" / "sharegpt_sample.jsonl.gz"


def main(argv: list[str] | None = None) -> int:
    """Build and write the sample; returns the process exit code."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data-dir", type=Path, default=None, help="shared data folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output .jsonl.gz file")
    args = ap.parse_args(argv)
    trace = build_sharegpt(default_path("artifact", args.data_dir), n_sessions=N_SESSIONS)
    out = write_jsonl(trace, args.out)
    size = out.stat().st_size
    if size >= MAX_BYTES:
        out.unlink()
        raise SystemExit(f"sample {out} is {size} bytes, over the {MAX_BYTES} byte limit")
    sys.stdout.write(
        f"wrote {out}: {len(trace)} requests, {trace.n_sessions} sessions, {size} bytes\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
