"""GLOO transfers of cache entries against a plain `torch.distributed` gloo send/recv of
the same tensors, side by side in one run (issue 50's target: at least half the floor's
bytes/s).

For each payload size, on one local Ray:
1. floor: two actors in a `torch.distributed` gloo group; the sender `send`s the tensor
   and the receiver `recv`s it into a preallocated buffer (both calls launched at once).
   Next to it, the same recv into a tensor allocated for each receive (what RDT's GLOO
   receive does: a two-sided transport takes no target buffer), which pays the fresh
   pages' first touch.
2. rdt: the same tensor returned by an actor method with `tensor_transport="gloo"` and
   read by another actor's method (Ray Direct Transport, what `EntryEndpoint` uses).
3. entry: a real cache entry of the tiny model's engine moved with `move_entry` (export
   copy and checksum, RDT, import checksum, admission), end to end.
Each figure is the median of `--reps` timed moves after one warm-up; bytes/s and the
ratio rdt / floor are printed and written to OUT/bench_transfer.json with a plot.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from ray import cloudpickle
from tqdm import tqdm

from marconi_ray.engine.presets.factory import make_model
from marconi_ray.serve.replica.engine_endpoint import EngineEndpoint
from marconi_ray.serve.replica.entry_endpoint import join_transfer_group, move_entry, settle_move
from marconi_ray.serve.transfer_modes import TRANSFER_MODES


class DistPeer:
    """One rank of a plain torch.distributed gloo pair (the floor)."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.buf: torch.Tensor | None = None

    def init(self, address: str, rank: int) -> None:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=address, rank=rank, world_size=2)

    def make(self, n: int) -> None:
        self.buf = torch.randn(n // 4)

    def send(self) -> None:
        import torch.distributed as dist

        assert self.buf is not None
        dist.send(self.buf, dst=1)

    def recv(self) -> float:
        import torch.distributed as dist

        assert self.buf is not None
        dist.recv(self.buf, src=0)
        return float(self.buf[0])

    def recv_fresh(self) -> float:
        """`recv` into a tensor allocated for it, as RDT's GLOO receive does."""
        import torch.distributed as dist

        assert self.buf is not None
        buf = torch.empty_like(self.buf)
        dist.recv(buf, src=0)
        return float(buf[0])


class RdtPeer:
    """A sender / receiver of the same tensors over Ray Direct Transport (gloo)."""

    def __init__(self) -> None:
        torch.set_num_threads(1)
        self.buf: torch.Tensor | None = None

    def make(self, n: int) -> None:
        self.buf = torch.randn(n // 4)

    @ray.method(tensor_transport="gloo")
    def send(self) -> dict[str, torch.Tensor]:
        assert self.buf is not None
        return {"t": self.buf}

    def recv(self, got: dict[str, torch.Tensor]) -> float:
        return float(got["t"][0])


def _free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def _median_s(run: Any, reps: int) -> float:
    run()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _entry_moves(model_root: Path, tokens: int, reps: int) -> dict[str, Any]:
    """Median seconds of `reps` moves of distinct `tokens`-token cache entries from one
    engine to another, over GLOO and over the object store (fresh entries each move, so
    every import admits all of its tokens)."""
    model = make_model("tiny", "nemotron_h", model_root / "tiny")
    endpoint = ray.remote(num_cpus=1)(EngineEndpoint)
    src, dst = endpoint.remote(str(model)), endpoint.remote(str(model))
    join_transfer_group([src, dst], TRANSFER_MODES["gloo"])
    rng = np.random.default_rng(0)
    timed: dict[str, list[float]] = {"gloo": [], "object_store": []}
    nbytes, admitted = 0, []
    for i in tqdm(range(2 * (reps + 1)), desc="entry moves"):
        mode = "gloo" if i % 2 == 0 else "object_store"
        prompt = rng.integers(3, 500, tokens).tolist()
        history = np.asarray(prompt + ray.get(src.generate.remote(prompt, 2))[0], np.int32)
        t0 = time.perf_counter()
        got = settle_move(move_entry(src, dst, history, 0, TRANSFER_MODES[mode]), 120)
        if i >= 2:  # the first move of each mode warms it up
            timed[mode].append(time.perf_counter() - t0)
        nbytes = got.nbytes
        admitted.append(got.tokens)
    return {
        "tokens": tokens + 2,
        "bytes": nbytes,
        "gloo_s": statistics.median(timed["gloo"]),
        "object_store_s": statistics.median(timed["object_store"]),
        "admitted_min": min(admitted),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--mb",
        default="1,8,64,256",
        help="payload sizes in MiB, comma-separated (default 1,8,64,256)",
    )
    ap.add_argument("--reps", type=int, default=5, help="timed moves per size (median; default 5)")
    ap.add_argument(
        "--entry-tokens",
        type=int,
        default=2000,
        help="prompt tokens of the real cache entry moved end to end (default 2000)",
    )
    ap.add_argument(
        "--out", default="benchmarks/results/transfer", help="folder for the JSON and the plot"
    )
    args = ap.parse_args(argv)
    sizes = [int(float(x) * (1 << 20)) for x in args.mb.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    dist_a, dist_b = (ray.remote(num_cpus=1)(DistPeer).remote() for _ in range(2))
    address = _free_address()
    ray.get([dist_a.init.remote(address, 0), dist_b.init.remote(address, 1)])
    rdt_a, rdt_b = (ray.remote(num_cpus=1)(RdtPeer).remote() for _ in range(2))
    join_transfer_group([rdt_a, rdt_b], TRANSFER_MODES["gloo"])
    rows = []
    for n in tqdm(sizes, desc="payload sizes"):
        ray.get([p.make.remote(n) for p in (dist_a, dist_b, rdt_a)])
        floor = _median_s(lambda: ray.get([dist_a.send.remote(), dist_b.recv.remote()]), args.reps)
        fresh = _median_s(
            lambda: ray.get([dist_a.send.remote(), dist_b.recv_fresh.remote()]), args.reps
        )
        rdt = _median_s(lambda: ray.get(rdt_b.recv.remote(rdt_a.send.remote())), args.reps)
        rows.append(
            {
                "bytes": n,
                "floor_gbps": n / floor / 1e9,
                "fresh_gbps": n / fresh / 1e9,
                "rdt_gbps": n / rdt / 1e9,
                "rdt_over_floor": floor / rdt,
                "rdt_over_fresh": fresh / rdt,
            }
        )
    for peer in (dist_a, dist_b, rdt_a, rdt_b):
        ray.kill(peer)
    with tempfile.TemporaryDirectory() as tmp:
        entry = _entry_moves(Path(tmp), args.entry_tokens, args.reps)
    ray.shutdown()
    result = {"sizes": rows, "entry": entry, "reps": args.reps}
    (out / "bench_transfer.json").write_text(json.dumps(result, indent=2))
    print(
        f"{'MiB':>6} {'floor GB/s':>11} {'fresh-buffer GB/s':>18} {'rdt GB/s':>9} "
        f"{'rdt/floor':>10} {'rdt/fresh':>10}"
    )
    for row in rows:
        print(
            f"{row['bytes'] / (1 << 20):6.1f} {row['floor_gbps']:11.3f} {row['fresh_gbps']:18.3f} "
            f"{row['rdt_gbps']:9.3f} {row['rdt_over_floor']:10.2f} {row['rdt_over_fresh']:10.2f}"
        )
    print(
        f"entry: {entry['tokens']} tokens, {entry['bytes']} bytes; median move (export copy, "
        f"checksums, transfer, admission): gloo {entry['gloo_s'] * 1e3:.1f} ms, object store "
        f"{entry['object_store_s'] * 1e3:.1f} ms; fewest tokens admitted by a move "
        f"{entry['admitted_min']}"
    )
    fig = Figure(figsize=(6, 3.5))
    ax = fig.add_subplot()
    mib = [r["bytes"] / (1 << 20) for r in rows]
    ax.plot(mib, [r["floor_gbps"] for r in rows], "o-", label="torch.distributed gloo send/recv")
    ax.plot(
        mib, [r["fresh_gbps"] for r in rows], "^--", label="the same, received into a fresh tensor"
    )
    ax.plot(mib, [r["rdt_gbps"] for r in rows], "s-", label="Ray Direct Transport (gloo)")
    ax.set_xscale("log")
    ax.set_xlabel("payload (MiB)")
    ax.set_ylabel("GB/s")
    ax.legend()
    ax.set_title("Moving the same tensors between two processes (2-core CPU)")
    FigureCanvasAgg(fig).print_png(str(out / "bench_transfer.png"))


if __name__ == "__main__":
    main()
