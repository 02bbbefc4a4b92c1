"""Prefill and decode apart against mixed replicas, over HTTP on this machine (issue 50,
item 7a), measured side by side in one run.

For each trace (multi-turn ShareGPT sessions, SWE-bench agent sessions) and each system,
a fresh service on one local Ray replays the same sessions with the load generator
(`loadgen.runner.run_load`: streamed /v1/completions of token ids, each turn's prompt the
previous prompt + the model's actual reply + the next user segment):
- `mixed`: 2 mixed replicas (`replicas: 2`);
- `pd`: 1 prefill + 1 decode replica, entries moving over `--transfer` (GLOO here);
both with `--cache-bytes` per replica, so the total cache bytes are equal. Reported per
run: the token hit rate the clients saw (cached / prompt tokens), bytes moved per
request and seconds spent in moves (the ingress's `marconi_transfer_*` counters), TTFT
and TPOT p50/p99, and failed requests. Writes OUT/bench_disagg.json and a plot; prints a
table. Without the shared data folder the packaged ShareGPT sample stands in for both.

On a 2-core CPU the `tiny` preset's prefill is milliseconds, so the figures show the
protocol's costs (a hand-off per first turn, a move per pull), not an H200's trade-off:
the cluster-scale question is `benchmarks/bench_disagg_replay.py`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import ray
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from loadgen.config import LoadConfig
from loadgen.runner import run_load
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.app import run_app, shutdown_app
from marconi_ray.serve.disagg import DisaggSettings
from marconi_ray.serve.settings import NAMESPACE, ServeSettings
from marconi_ray.traces.paths import default_data_dir

SYSTEMS = ("mixed", "pd")


def settings_for(system: str, model_dir: Path, args: argparse.Namespace) -> ServeSettings:
    disagg = (
        DisaggSettings(prefill_replicas=1, decode_replicas=1, transfer=args.transfer)
        if system == "pd"
        else DisaggSettings()
    )
    return ServeSettings(
        model_dir=str(model_dir),
        model_name="tiny",
        replicas=2,
        cache_bytes=args.cache_bytes,
        alpha=1.0,
        port=args.port,
        app_name=f"bench-{system}",
        prefill_tflops=args.prefill_tflops,
        disagg=disagg,
    )


def traces(args: argparse.Namespace) -> list[str]:
    """The traces to replay: ShareGPT and SWE-bench where the shared data folder has
    them, else the packaged sample."""
    data = default_data_dir()
    out = []
    if (data / "sharegpt").exists():
        out.append("sharegpt")
    if (data / "swebench_agent_trajectories").exists():
        out.append("swebench")
    return out or ["sample"]


def run_one(system: str, trace: str, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    settings = settings_for(system, model_dir, args)
    run_app(settings)
    try:
        config = LoadConfig(
            url=f"http://127.0.0.1:{args.port}",
            trace=trace,
            sessions=args.sessions,
            session_rate=None,
            concurrency=args.concurrency,
            max_output=args.max_output,
            max_prompt=args.max_prompt,
            vocab_size=json.loads((model_dir / "config.json").read_text())["vocab_size"],
        )
        result = run_load(config, progress=False)
    finally:
        shutdown_app(settings)
    s, server = result.summary, result.summary.get("server") or {}
    done = max(int(s["completed"]), 1)
    return {
        "system": system,
        "trace": trace,
        "requests": s["requests"],
        "failed": s["failed"],
        "hit_rate": s["client_token_hit_rate"],
        "ttft_ms": s["ttft_ms"],
        "tpot_ms": s["tpot_ms"],
        "bytes_per_request": server.get("transfer_bytes", 0.0) / done,
        "transfer_s": server.get("transfer_seconds", 0.0),
        "transfers": server.get("transfers", 0.0),
        "wall_s": result.wall_s,
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    fig = Figure(figsize=(9, 3.4))
    names = [f"{r['trace']}\n{r['system']}" for r in rows]
    panels = (
        ("token hit rate", [r["hit_rate"] or 0.0 for r in rows]),
        ("TTFT p50 (ms)", [r["ttft_ms"]["p50"] or 0.0 for r in rows]),
        ("TPOT p50 (ms)", [r["tpot_ms"]["p50"] or 0.0 for r in rows]),
    )
    for i, (title, values) in enumerate(panels):
        ax = fig.add_subplot(1, 3, i + 1)
        ax.bar(range(len(rows)), values, color=["#888" if "mixed" in n else "#36c" for n in names])
        ax.set_xticks(range(len(rows)), names, fontsize=7)
        ax.set_title(title, fontsize=9)
    fig.suptitle("2 mixed replicas vs 1 prefill + 1 decode (equal cache bytes, 2-core CPU)")
    fig.tight_layout()
    FigureCanvasAgg(fig).print_png(str(path))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--sessions", type=int, default=8, help="sessions per trace (default 8)")
    ap.add_argument("--concurrency", type=int, default=4, help="sessions in flight (default 4)")
    ap.add_argument("--max-output", type=int, default=16, help="tokens per turn (default 16)")
    ap.add_argument(
        "--max-prompt",
        type=int,
        default=3800,
        help="a session stops past this prompt length (default 3800: the tiny preset holds 4096)",
    )
    ap.add_argument(
        "--cache-bytes", type=int, default=20_000_000, help="cache bytes per replica (default 2e7)"
    )
    ap.add_argument("--transfer", default="gloo", help="transfer mode of the pd run (default gloo)")
    ap.add_argument(
        "--prefill-tflops",
        type=float,
        default=1e-4,
        help="the coordinator's prefill clock, TFLOP/s (default 1e-4: this CPU's tiny model)",
    )
    ap.add_argument("--port", type=int, default=8124, help="HTTP port of the services")
    ap.add_argument("--out", default="benchmarks/results/disagg", help="output folder")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=12, include_dashboard=False, log_to_driver=False, namespace=NAMESPACE)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model("tiny", "nemotron_h", Path(tmp) / "tiny")
        runs = [(t, s) for t in traces(args) for s in SYSTEMS]
        for trace, system in tqdm(runs, desc="services"):
            rows.append(run_one(system, trace, model_dir, args))
    ray.shutdown()
    (out / "bench_disagg.json").write_text(json.dumps({"args": vars(args), "runs": rows}, indent=2))
    plot(rows, out / "bench_disagg.png")
    head = f"{'trace':9} {'system':6} {'reqs':>5} {'fail':>4} {'hit rate':>8} {'B/req':>9} "
    print(head + f"{'move s':>7} {'TTFT p50/p99 ms':>17} {'TPOT p50/p99 ms':>17}")
    for r in rows:
        ttft, tpot = r["ttft_ms"], r["tpot_ms"]
        print(
            f"{r['trace']:9} {r['system']:6} {r['requests']:5d} {r['failed']:4d} "
            f"{(r['hit_rate'] or 0):8.3f} {r['bytes_per_request']:9.0f} {r['transfer_s']:7.2f} "
            f"{ttft['p50'] or 0:8.1f}/{ttft['p99'] or 0:8.1f} {tpot['p50'] or 0:8.1f}/"
            f"{tpot['p99'] or 0:8.1f}"
        )


if __name__ == "__main__":
    main()
