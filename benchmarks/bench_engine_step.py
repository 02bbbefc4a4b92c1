"""The engine's decode step before and after a change, side by side in one run, on CPU.

Runs `engine_step_probe.py` (the same measurement, from this tree) against a checkout of
`--before` (a git worktree, first on PYTHONPATH) and against this tree, alternating
(before, after, before, after, ... `--reps` times each) on the same model directories;
timings are the median over the reps (counts do not vary). Reports, per revision:
- torch ops, host syncs and TP broadcasts of one decode step at each batch size (the
  `tiny` presets of `--families`), and ops at the largest batch over batch 1;
- decode tokens/s at each batch (`small` preset, NemotronH), and after / before;
- TTFT p50 and max of `--ttft-requests` prompts of `--ttft-len` tokens arriving together
  (each through `Engine.add_request`), and the same prompts started by one
  `Worker.advance` (the serving path): its model forwards, seconds, torch ops, host
  syncs and attention / mixer kernel calls (kernel-set ops and SDPA, by op);
- bytes made while a cached hit starts, and their slope per cached token (what is copied
  per token of KV);
- a burst of long prompts: the peak KV rows and count of running requests, the sized
  pool's rows and growths (where the revision has one), and whether outputs are exact.
Writes `OUT/bench_engine_step.json` and `OUT/bench_engine_step.md` (the table).

Example: python benchmarks/bench_engine_step.py --before 2c0c516
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from engine_step_probe import add_workload_args
from tqdm import tqdm

from marconi_ray.engine.presets.factory import make_model

ROOT = Path(__file__).resolve().parent.parent
PROBE = Path(__file__).resolve().parent / "engine_step_probe.py"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--before",
        default="2c0c516",
        help="git revision measured as 'before' (default: 2c0c516, the engine "
        "before the KV pool and batched decode attention)",
    )
    p.add_argument(
        "--families",
        default="qwen3_5,nemotron_h",
        help="families of the tiny presets whose ops are counted",
    )
    add_workload_args(p)
    p.add_argument("--reps", type=int, default=3, help="runs of each revision, alternating")
    p.add_argument("--out", default="benchmarks/results/engine_step", help="output folder")
    return p.parse_args()  # fmt: skip


def probe(tree: Path, args: argparse.Namespace, dirs: dict[str, Path]) -> dict[str, Any]:
    """The probe's report with `tree`'s packages first on the path, one thread."""
    env = {
        **os.environ,
        "PYTHONPATH": f"{tree}{os.pathsep}{tree / 'kernels'}",
        "OMP_NUM_THREADS": "1",
    }
    tiny = [f"{f}={dirs[f]}" for f in args.families.split(",")]
    cmd = [
        sys.executable, str(PROBE), "--tiny", *tiny, "--small", str(dirs["small"]),
        "--batches", args.batches, "--steps", str(args.steps),
        "--ttft-requests", str(args.ttft_requests), "--ttft-len", str(args.ttft_len),
        "--burst-requests", str(args.burst_requests), "--burst-len", str(args.burst_len),
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode:
        raise RuntimeError(f"the probe failed on {tree}:\n{done.stderr[-4000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def median_report(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The first run's counts with every timing (tok/s, TTFT) the median over `runs`."""
    out = json.loads(json.dumps(runs[0]))
    for b in out["tok_s"]:
        out["tok_s"][b] = statistics.median(r["tok_s"][b] for r in runs)
    for key in out["ttft"]:
        out["ttft"][key] = statistics.median(r["ttft"][key] for r in runs)
    out["starts"]["seconds"] = statistics.median(r["starts"]["seconds"] for r in runs)
    out["runs"] = runs
    return out


def table(before: dict[str, Any], after: dict[str, Any], batches: list[int]) -> str:
    """The markdown table of both reports, side by side."""
    lines = ["| measure | before | after | after / before |", "| --- | --- | --- | --- |"]

    def row(name: str, b: float, a: float, fmt: str = "{:,.0f}") -> None:
        ratio = f"{a / b:.2f}x" if b else "-"
        lines.append(f"| {name} | {fmt.format(b)} | {fmt.format(a)} | {ratio} |")

    last = str(batches[-1])
    for family in after["ops"]:
        ob, oa = before["ops"][family], after["ops"][family]
        for key in ("ops", "syncs", "broadcasts"):
            for b in batches:
                row(f"{family} tiny: {key} per decode step, batch {b}",
                    ob[str(b)][key], oa[str(b)][key])  # fmt: skip
        lines.append(
            f"| {family} tiny: ops at batch {last} / batch 1 | "
            f"{ob[last]['ops'] / ob['1']['ops']:.2f}x | {oa[last]['ops'] / oa['1']['ops']:.2f}x | |"
        )
    for b in batches:
        row(f"nemotron_h small: decode tok/s, batch {b}",
            before["tok_s"][str(b)], after["tok_s"][str(b)], "{:,.1f}")  # fmt: skip
    for key in ("p50", "max"):
        row(f"TTFT {key} (s)", before["ttft"][key], after["ttft"][key], "{:.3f}")
    sb, sa = before["starts"], after["starts"]
    k = sa["first_tokens"]
    row(f"{k} prompts started in one step: model forwards (prefills + the decode)",
        sb["forwards"], sa["forwards"])  # fmt: skip
    row(f"{k} prompts started in one step: seconds (their TTFT)",
        sb["seconds"], sa["seconds"], "{:.3f}")  # fmt: skip
    if "ops" in sb and "ops" in sa:
        row(f"{k} prompts started in one step: torch ops", sb["ops"], sa["ops"])
        row(f"{k} prompts started in one step: host syncs", sb["syncs"], sa["syncs"])
    if "kernel_calls" in sb and "kernel_calls" in sa:
        kb, ka = sb["kernel_calls"], sa["kernel_calls"]
        row(f"{k} prompts started in one step: attention / mixer kernel calls",
            sum(kb.values()), sum(ka.values()))  # fmt: skip
        for op in sorted(set(kb) | set(ka)):
            row(f"... of which {op}", kb.get(op, 0), ka.get(op, 0))
    per_token = "bytes_per_cached_token"
    row("bytes made when a hit starts, per cached token",
        before["hit"][per_token], after["hit"][per_token])  # fmt: skip
    bb, ba = before["burst"], after["burst"]
    n = ba["requests"]
    row(f"burst of {n} long prompts: peak running requests", bb["peak_running"], ba["peak_running"])
    row(f"burst of {n} long prompts: peak KV rows of running requests",
        bb["peak_running_rows"], ba["peak_running_rows"])  # fmt: skip

    def shown(x: Any) -> str:
        if x is None:
            return "unbounded"
        return str(x) if isinstance(x, bool) else f"{x:,}"

    for key, name in (("pool_rows", "device pool rows (sized once)"), ("growths", "pool growths"),
                      ("exact", "outputs exact")):  # fmt: skip
        lines.append(f"| burst: {name} | {shown(bb[key])} | {shown(ba[key])} | |")
    return "\n".join(lines)


def main() -> None:
    args = parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = [int(b) for b in args.batches.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {f: make_model("tiny", f, Path(tmp) / f) for f in args.families.split(",")}
        dirs["small"] = make_model("small", "nemotron_h", Path(tmp) / "small")
        worktree = Path(tmp) / "before"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), args.before],
            check=True, capture_output=True,
        )  # fmt: skip
        try:
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            order = [("before", worktree), ("after", ROOT)] * args.reps
            for name, tree in tqdm(order, desc="probe runs"):
                runs[name].append(probe(tree, args, dirs))
            reports = {name: median_report(r) for name, r in runs.items()}
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                check=False, capture_output=True,
            )  # fmt: skip
    md = table(reports["before"], reports["after"], batches)
    meta = {"before": args.before, "after": "working tree", **vars(args)}
    (out / "bench_engine_step.json").write_text(json.dumps({**reports, "args": meta}, indent=2))
    (out / "bench_engine_step.md").write_text(md + "\n")
    print(md)
    print(f"\nwrote {out / 'bench_engine_step.json'} and {out / 'bench_engine_step.md'}")


if __name__ == "__main__":
    main()
