"""Measures one engine revision's decode step, prefill latency and hit start (run by
`bench_engine_step.py`, once per revision, with that revision first on `PYTHONPATH`).

It uses only what every revision since the engine's subpackages has: `Engine`, its
`worker` (`step`, `_load_hit`, `tp.broadcast`) and `SamplingParams`, so the same
measurement runs against the code before and after a change. Prints one JSON object.

What is counted, during one `Worker.step` of B running requests (greedy, in one batch):
- ops: every aten op dispatched (a `TorchDispatchMode`), views included;
- host syncs: the calls that make a CUDA host wait for the device (see `host_syncs`:
  `.item()` and the like, `.tolist()`, `.numpy()`, ops with data-dependent shapes);
- TP broadcasts: calls to the worker's `tp.broadcast`.
Bytes at hit start: bytes of every non-view op output during `Worker._load_hit` of a
request whose prompt is cached but for its last token.
Starts in one step: `--ttft-requests` prompts of `--ttft-len` tokens planned and started
by one `Worker.advance` (the serving path: their first tokens leave with that step): the
model forwards it runs (embedding calls: prefills plus the step's decode) and its
seconds, every request's TTFT there; and, in a second engine, the torch ops, host syncs
and attention / mixer kernel calls (kernel-set ops and SDPA: each at least one launch on
a GPU) of the same step.
A burst: `--burst-requests` prompts of `--burst-len` tokens submitted together. Where the
revision can size its KV pool from a budget (`protocol.kv_memory`), the budget holds two
of them at a time; the peak KV rows running requests hold (the sum of their lengths),
the peak running count, the pool's rows and growths, and whether every request ended
with the tokens of an unbounded engine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from host_syncs import HostReads, SyncOps
from torch.overrides import TorchFunctionMode

from marconi_ray.engine.engine import Engine
from marconi_ray.protocol.sampling import SamplingParams


class _CountingTP:
    """A worker's TP group whose `broadcast` calls are counted (the rest delegated)."""

    def __init__(self, tp: Any, calls: Counter[str]) -> None:
        self._tp = tp
        self._calls = calls

    def broadcast(self, *args: Any, **kwargs: Any) -> Any:
        self._calls["broadcast"] += 1
        return self._tp.broadcast(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tp, name)


@contextmanager
def counting(engine: Engine) -> Iterator[dict[str, int]]:
    """Counts ops, host syncs, bytes made and TP broadcasts inside the block."""
    worker = engine.worker
    calls: Counter[str] = Counter()
    tp = worker.tp
    worker.tp = _CountingTP(tp, calls)
    out: dict[str, int] = {}
    ops, reads = SyncOps(), HostReads()
    try:
        with reads, ops:
            yield out
    finally:
        worker.tp = tp
    out.update(
        ops=ops.ops,
        syncs=ops.syncs + reads.reads,
        broadcasts=calls["broadcast"],
        bytes_made=ops.bytes_made,
    )


class _SDPACalls(TorchFunctionMode):
    """Counts `scaled_dot_product_attention` calls made outside a kernel-set op (`inside`
    > 0 while one runs: a reference op's own SDPA is that op's call)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.inside = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") == "scaled_dot_product_attention" and not self.inside:
            self.calls += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def kernel_calls(model: Any) -> Iterator[Counter[str]]:
    """Counts, inside the block, the calls of every kernel-set op the model's layers make
    (each is at least one launch on a GPU) and of SDPA (key "sdpa"): the model and every
    module holding a `kernels` set get a counting copy, restored after."""
    calls: Counter[str] = Counter()
    holders = [m for m in model.modules() if dataclasses.is_dataclass(getattr(m, "kernels", None))]
    saved = [m.kernels for m in holders]
    sdpa = _SDPACalls()

    def counted(name: str, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            sdpa.inside += 1
            try:
                return fn(*args, **kwargs)
            finally:
                sdpa.inside -= 1

        return run

    for m, ks in zip(holders, saved, strict=True):
        ops = {f.name: counted(f.name, getattr(ks, f.name)) for f in dataclasses.fields(ks)
               if callable(getattr(ks, f.name))}  # fmt: skip
        m.kernels = dataclasses.replace(ks, **ops)
    try:
        with sdpa:
            yield calls
    finally:
        for m, ks in zip(holders, saved, strict=True):
            m.kernels = ks
        calls["sdpa"] += sdpa.calls


def _prompt(seed: int, n: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(8, vocab, (n,), generator=g).tolist()


def _engine(model_dir: str, batch: int, system: str = "vanilla") -> Engine:
    return Engine(model_dir, system, cache_bytes=1 << 30, max_batch=batch, max_batch_tokens=4096)


def _running(engine: Engine, batch: int, prompt_len: int, max_tokens: int) -> None:
    vocab = engine.config.vocab_size
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    for b in range(batch):
        engine.add_request(_prompt(b, prompt_len, vocab), sp)
    engine.step()  # every request joins the decode batch


def decode_step(model_dir: str, batch: int, prompt_len: int, steps: int) -> dict[str, float]:
    """Ops, syncs and broadcasts of one decode step at `batch`, and tokens/s over `steps`."""
    engine = _engine(model_dir, batch)
    _running(engine, batch, prompt_len, steps + 8)
    with counting(engine) as counts:
        engine.worker.step()
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.worker.step()
    elapsed = time.perf_counter() - t0
    return {**counts, "tok_s": batch * steps / elapsed}


def ttft(model_dir: str, n: int, prompt_len: int) -> dict[str, float]:
    """TTFT of `n` requests of `prompt_len` tokens that arrive together (one engine call
    each, as the in-process API serves them): p50 and max, seconds."""
    engine = _engine(model_dir, n)
    vocab = engine.config.vocab_size
    sp = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    engine.add_request(_prompt(99, prompt_len, vocab), sp)  # warm
    while engine.num_running:
        engine.step()
    t0 = time.perf_counter()
    firsts = []
    for i in range(n):
        engine.add_request(_prompt(200 + i, prompt_len, vocab), sp)
        firsts.append(time.perf_counter() - t0)
    return {"p50": statistics.median(firsts), "max": max(firsts)}


def _hit_start(model_dir: str, n: int) -> dict[str, int]:
    """Counts while the hit of a request cached at `n` + 1 tokens starts."""
    engine = _engine(model_dir, 2, system="marconi")
    vocab = engine.config.vocab_size
    prompt = _prompt(7, n, vocab)
    sp = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    done = engine.generate(prompt, sp)
    worker = engine.worker
    load = worker._load_hit
    seen: dict[str, int] = {}

    def measured(seq: Any) -> None:
        with counting(engine) as counts:
            load(seq)
        seen.update(counts, hit=seq.order.hit_len)

    worker._load_hit = measured  # type: ignore[method-assign]
    engine.generate(prompt + list(done.tokens) + _prompt(8, 4, vocab), sp)
    return seen


def hit_start_bytes(model_dir: str, lengths: list[int]) -> dict[str, float]:
    """Bytes made while a hit of each length starts, and their slope per cached token."""
    seen = [_hit_start(model_dir, n) for n in lengths]
    out: dict[str, float] = {f"bytes_at_{s['hit']}": s["bytes_made"] for s in seen}
    hits = [s["hit"] for s in seen]
    made = [s["bytes_made"] for s in seen]
    out["bytes_per_cached_token"] = (made[-1] - made[0]) / (hits[-1] - hits[0])
    return out


def _start_together(model_dir: str, n: int, prompt_len: int, counted: bool) -> dict[str, Any]:
    """Plan `n` prompts and start them in one `Worker.advance`: its model forwards and
    seconds, or (counted) its torch ops and host syncs (timed and counted apart: the
    counting mode slows every op)."""
    import numpy as np

    from marconi_ray.protocol.orders import StepInput

    engine = _engine(model_dir, n)
    vocab = engine.config.vocab_size
    sp = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine.generate(_prompt(98, prompt_len, vocab), sp)  # warm
    orders = []
    for i in range(n):
        prompt = np.asarray(_prompt(400 + i, prompt_len, vocab), np.int32)
        order, release = engine.planner.order(1000 + i, prompt, sp, time.time())
        engine.worker.release(release)
        orders.append(order)
    model = engine.model
    embed = model._embed
    calls = [0]

    def forward(ids: Any) -> Any:
        calls[0] += 1
        return embed(ids)

    model._embed = forward
    step = StepInput(start=tuple(orders))
    if counted:
        with counting(engine) as counts, kernel_calls(model) as kernels:
            engine.worker.advance(step)
        return {"ops": counts["ops"], "syncs": counts["syncs"], "kernel_calls": dict(kernels)}
    t0 = time.perf_counter()
    out = engine.worker.advance(step)
    elapsed = time.perf_counter() - t0
    firsts = {e.request_id for e in out.events}
    return {"forwards": calls[0], "seconds": elapsed, "first_tokens": len(firsts)}


def step_starts(model_dir: str, n: int, prompt_len: int) -> dict[str, Any]:
    """The starts-in-one-step measure of the module docstring."""
    timed = _start_together(model_dir, n, prompt_len, counted=False)
    return {**timed, **_start_together(model_dir, n, prompt_len, counted=True)}


def burst(model_dir: str, n: int, prompt_len: int, max_tokens: int) -> dict[str, Any]:
    """The burst of the module docstring, on the vanilla system (nothing cached)."""
    try:
        from marconi_ray.protocol.kv_memory import KVMemory
    except ImportError:  # a revision before the sized pool
        KVMemory = None
    free = _engine(model_dir, n)
    vocab = free.config.vocab_size
    prompts = [_prompt(300 + i, prompt_len, vocab) for i in range(n)]
    sp = [SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)] * n
    want = [r.tokens for r in free.generate_many(prompts, sp)]
    engine, cache = free, 1 << 20
    if KVMemory is not None:
        store = free.store
        budget = cache + 3 * n * store.state_bytes
        budget += 2 * (prompt_len + max_tokens) * store.kv_bytes_per_token
        engine = Engine(
            model_dir, "vanilla", cache_bytes=cache, max_batch=n, max_batch_tokens=4096,
            kv_memory=KVMemory(bytes=budget),
        )  # fmt: skip
    worker = engine.worker
    peak = {"rows": 0, "running": 0}
    step = worker.step

    def watched(*args: Any, **kw: Any) -> Any:
        live = [*worker._running, *getattr(worker, "_prefilling", [])]
        peak["rows"] = max(peak["rows"], sum(s.state.length for s in live))
        peak["running"] = max(peak["running"], len(live))
        return step(*args, **kw)

    worker.step = watched  # type: ignore[method-assign]
    got = [r.tokens for r in engine.generate_many(prompts, sp)]
    pool = getattr(engine.store, "device_kv", None)
    sized = pool is not None and getattr(pool, "sized", False)
    return {
        "requests": n,
        "exact": got == want,
        "peak_running": peak["running"],
        "peak_running_rows": peak["rows"],
        "pool_rows": pool.capacity if sized else None,
        "growths": pool.growths if sized else None,
    }


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The options `bench_engine_step.py` passes through to this probe."""
    p.add_argument("--batches", default="1,8,32,64", help="decode batch sizes")
    p.add_argument("--steps", type=int, default=16, help="timed decode steps per batch")
    p.add_argument("--ttft-requests", type=int, default=8, help="requests arriving together")
    p.add_argument("--ttft-len", type=int, default=256, help="their prompt tokens")
    p.add_argument("--burst-requests", type=int, default=8, help="long prompts of the burst")
    p.add_argument("--burst-len", type=int, default=512, help="their prompt tokens")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--tiny",
        nargs="+",
        required=True,
        metavar="FAMILY=DIR",
        help="tiny-preset model dirs for the op and sync counts",
    )
    p.add_argument(
        "--small",
        required=True,
        metavar="DIR",
        help="small-preset model dir for tokens/s, TTFT and hit bytes",
    )
    p.add_argument("--prompt-len", type=int, default=64, help="prompt tokens of each decoder")
    add_workload_args(p)
    args = p.parse_args()
    torch.set_num_threads(1)
    batches = [int(b) for b in args.batches.split(",")]
    report: dict[str, Any] = {"ops": {}, "tok_s": {}}
    for spec in args.tiny:
        family, model_dir = spec.split("=", 1)
        report["ops"][family] = {b: decode_step(model_dir, b, args.prompt_len, 1) for b in batches}
    report["tok_s"] = {
        b: decode_step(args.small, b, args.prompt_len, args.steps)["tok_s"] for b in batches
    }
    report["ttft"] = ttft(args.small, args.ttft_requests, args.ttft_len)
    report["hit"] = hit_start_bytes(args.small, [64, 192])
    report["starts"] = step_starts(args.small, args.ttft_requests, args.ttft_len)
    report["burst"] = burst(args.small, args.burst_requests, args.burst_len, 8)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
