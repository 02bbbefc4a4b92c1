"""The exactly-once fuzzer, longer than `make test` runs it.

Each case is one random interleaving (seeded) of plans, submissions (some misrouted),
steps, client departures, channel breaks, abandons, lease expiries, heartbeats, drains,
coordinator stalls and restarts across two in-process replicas with the host tier on,
checked after every event against a reference of which ids each store holds and in
which tier (`tests/serve/exactly_once_fuzz.py`, whose module docstring lists the
checks). A failing case prints its seed: `--seed-from SEED --cases 1` replays it.

Writes a JSON summary (cases, events, checks, event counts, seconds) to `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "serve"))

from exactly_once_fuzz import run_case

from marconi_ray.engine.presets.factory import make_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=50, help="random cases to run (default 50)")
    parser.add_argument("--events", type=int, default=400, help="events per case (default 400)")
    parser.add_argument("--seed-from", type=int, default=1000, help="seed of the first case")
    parser.add_argument(
        "--moves",
        action="store_true",
        help="draw moves of entries between the replicas and cache resets among the events",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("benchmarks/results/fuzz_exactly_once.json"),
        help="where the JSON summary goes",
    )
    args = parser.parse_args(argv)
    if args.cases < 1 or args.events < 1:
        parser.error(f"--cases and --events must be >= 1, got {args.cases} and {args.events}")
    import torch

    torch.set_num_threads(1)
    model_dir = make_model("tiny", "nemotron_h", Path(tempfile.mkdtemp()) / "tiny")
    totals: dict[str, int] = {}
    start = time.perf_counter()
    for seed in tqdm(range(args.seed_from, args.seed_from + args.cases), desc="cases"):
        try:
            counts = run_case(model_dir, seed, args.events, moves=args.moves)
        except AssertionError:
            print(f"case with seed {seed} failed", file=sys.stderr)
            raise
        for kind, n in counts.items():
            totals[kind] = totals.get(kind, 0) + n
    summary = {
        "cases": args.cases,
        "events_per_case": args.events,
        "seed_from": args.seed_from,
        "moves": args.moves,
        "counts": totals,
        "seconds": round(time.perf_counter() - start, 1),
        "failures": 0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
