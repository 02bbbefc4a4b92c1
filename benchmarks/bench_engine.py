"""Benchmark of the in-process engine on CPU (issue "The engine"), all measured in one run.

1. TTFT per turn, marconi vs vanilla: `--sessions` multi-turn ShareGPT conversations
   (artifact-faithful trace) served through two `Engine`s over the same random-weight
   `small` NemotronH checkpoint, in the trace's arrival order (sessions interleaved). Each
   request goes to the marconi engine, then the same prompt to the vanilla engine; greedy
   outputs must be identical (the cache-exactness invariant). Turn k's prompt is turn
   k-1's prompt + the engine's own output + the trace's new user segment of turn k, so the
   "last decoded token" checkpoint can be hit. Llama-2 ids are mapped into the model's
   vocabulary by `id % (vocab - 8) + 7`.
2. Token hit rate of the engine's prefix cache vs the replay simulator fed the exact
   (input, output) sequences the engine served, in the same order, same system, capacity
   and cost model.
3. Prefill throughput of our `HybridModel` vs transformers' `NemotronHForCausalLM` on the
   same weights, prompt lengths interleaved, one thread.

Writes `OUT/bench_engine.json` and `OUT/ttft_by_turn.png`; prints a summary table.
Needs the shared data folder (../shared/data or $MARCONI_DATA_DIR).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from marconi_ray.core.sim.replay import RunConfig, run_replay
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.traces.registry import load_trace
from marconi_ray.traces.trace import Request, Trace

SYSTEMS = ("marconi", "vanilla")
ID_OFFSET = 7  # first id past the byte tokenizer's special tokens


@dataclass(frozen=True)
class Turn:
    """One request of the schedule: the trace's new user segment (mapped ids) of a turn."""

    session_id: int
    turn: int  # 1-based turn index within the session
    ts: float
    segment: np.ndarray
    max_tokens: int
    extends: bool  # the trace's input extends the previous turn's input + output


# ---------------------------------------------------------------------- workload
def map_ids(ids: np.ndarray, vocab: int) -> np.ndarray:
    """Llama-2 ids -> model ids in [7, vocab - 1), deterministically (shared prefixes stay)."""
    return (ids.astype(np.int64) % (vocab - 8) + ID_OFFSET).astype(np.int32)


def new_segment(prev: Request | None, req: Request) -> tuple[np.ndarray, bool]:
    """The part of `req`'s input that is new after `prev`'s input + output, and whether the
    input really extends them (else: everything after their longest common prefix)."""
    if prev is None:
        return req.input_tokens, True
    before = prev.tokens
    n = len(before)
    if len(req.input_tokens) >= n and np.array_equal(req.input_tokens[:n], before):
        return req.input_tokens[n:], True
    m = min(n, len(req.input_tokens))
    diff = np.flatnonzero(req.input_tokens[:m] != before[:m])
    common = int(diff[0]) if diff.size else m
    return req.input_tokens[common:], False


def schedule(trace: Trace, vocab: int, out_cap: int) -> list[Turn]:
    """Every turn of `trace` in arrival order, as new user segments in model ids."""
    turns: list[Turn] = []
    for sid, reqs in trace.sessions().items():
        prev = None
        for k, req in enumerate(reqs, start=1):
            seg, extends = new_segment(prev, req)
            n_out = max(1, min(req.n_output, out_cap))
            turns.append(Turn(sid, k, req.ts, map_ids(seg, vocab), n_out, extends))
            prev = req
    return sorted(turns, key=lambda t: (t.ts, t.session_id, t.turn))


# ---------------------------------------------------------------------- serving
def ensure_model(model_dir: Path) -> Path:
    """The `small` NemotronH checkpoint in `model_dir`, built (seed 0) if absent."""
    if not (model_dir / "config.json").is_file():
        make_model("small", "nemotron_h", model_dir)
    return model_dir


def warm_up(engine: Engine) -> None:
    """One prefill + decode on the model directly (the prefix cache is not touched)."""
    model = engine.model
    state = model.new_state()
    model.prefill(torch.arange(ID_OFFSET, ID_OFFSET + 64), state, [])
    model.decode(torch.tensor([ID_OFFSET]), [state])


def serve(engines: dict[str, Engine], turns: list[Turn], prompt_cap: int) -> list[dict]:
    """Serve `turns` through every engine (marconi first, then the same prompt to the
    others); a session stops at its first turn whose prompt exceeds `prompt_cap`."""
    history: dict[int, np.ndarray] = {}
    stopped: set[int] = set()
    records = []
    for t in tqdm(turns, desc="turns", disable=None):
        if t.session_id in stopped:
            continue
        prompt = np.concatenate([history.get(t.session_id, np.zeros(0, np.int32)), t.segment])
        if len(prompt) + t.max_tokens > prompt_cap:
            stopped.add(t.session_id)
            continue
        params = SamplingParams(max_tokens=t.max_tokens, temperature=0.0, ignore_eos=True)
        rec: dict[str, Any] = {"session_id": t.session_id, "turn": t.turn, "extends": t.extends}
        outputs = {}
        for name, engine in engines.items():
            res = engine.generate(prompt.tolist(), params)
            outputs[name] = res.tokens
            rec[name] = {
                "ttft": res.timings.ttft,
                "prefill": res.timings.prefill,
                "total": res.timings.total,
                "cached_tokens": res.usage.cached_tokens,
            }
        rec["prompt_tokens"] = len(prompt)
        rec["output_tokens"] = len(outputs["marconi"])
        rec["outputs_match"] = all(o == outputs["marconi"] for o in outputs.values())
        rec["input"] = prompt
        rec["output"] = np.asarray(outputs["marconi"], dtype=np.int32)
        history[t.session_id] = np.concatenate([prompt, rec["output"]])
        records.append(rec)
    return records


# ---------------------------------------------------------------------- metrics
def ttft_stats(values: list[float]) -> dict[str, float]:
    """Mean and p95 of TTFTs in seconds, and the count."""
    arr = np.asarray(values)
    return {"n": len(arr), "mean": float(arr.mean()), "p95": float(np.percentile(arr, 95))}


def ttft_by_turn(records: list[dict]) -> list[dict]:
    """Per turn index (1, 2, ...) then the `3+` and `all` groups: TTFT stats per system and
    the vanilla/marconi ratio of mean TTFT."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(str(r["turn"]), []).append(r)
    keys = sorted(groups, key=int)
    groups["3+"] = [r for r in records if r["turn"] >= 3]
    groups["all"] = records
    rows = []
    for key in [*keys, "3+", "all"]:
        rs = groups[key]
        if not rs:
            continue
        row: dict[str, Any] = {
            "turn": key,
            "mean_prompt_tokens": np.mean([r["prompt_tokens"] for r in rs]),
        }
        for name in SYSTEMS:
            row[name] = ttft_stats([r[name]["ttft"] for r in rs])
        row["marconi_mean_cached_tokens"] = float(
            np.mean([r["marconi"]["cached_tokens"] for r in rs])
        )
        row["vanilla_over_marconi"] = row["vanilla"]["mean"] / row["marconi"]["mean"]
        rows.append(row)
    return rows


def simulate(engine: Engine, records: list[dict], cache_bytes: int) -> dict[str, Any]:
    """Replay the served (input, output) sequences through the simulator: at the engine's
    capacity and unbounded; plus the engine's own figures."""
    reqs = [
        Request(r["session_id"], r["turn"] - 1, float(i), r["input"], r["output"])
        for i, r in enumerate(records)
    ]
    cost = engine.cache.cost
    sim = run_replay(reqs, cost, RunConfig("marconi", cache_bytes))
    unbounded = run_replay(reqs, cost, RunConfig("marconi", 10**15))
    stats = engine.cache.stats
    n_in = sum(r["prompt_tokens"] for r in records)
    history = (
        []
        if engine.tuner is None
        else [[h.start_request, h.best_alpha] for h in engine.tuner.history]
    )
    return {
        "engine_token_hit_rate": stats.token_hit_rate,
        "engine_usage_hit_rate": sum(r["marconi"]["cached_tokens"] for r in records) / n_in,
        "engine_evictions": stats.evictions,
        "engine_alpha": engine.cache.alpha,
        "engine_alpha_history": history,
        "engine_peak_bytes": stats.peak_bytes,
        "simulator": sim.to_record(),
        "simulator_unbounded_token_hit_rate": unbounded.token_hit_rate,
    }


# ---------------------------------------------------------------------- prefill
def prefill_bench(model_dir: Path, lengths: list[int], reps: int) -> list[dict]:
    """Prefill tokens/s, ours (`HybridModel.prefill` into a fresh state) vs transformers
    (`model(ids, use_cache=True, logits_to_keep=1)`: builds its cache, last logits only,
    like ours), interleaved per rep and length; best and median of `reps`."""
    from transformers import AutoModelForCausalLM

    ours = load_model(model_dir)
    theirs = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vocab = ours.cfg.vocab_size
    gen = torch.Generator().manual_seed(0)
    runs = {
        "ours": lambda ids: ours.prefill(ids, ours.new_state(), []),
        "transformers": lambda ids: theirs(ids[None], use_cache=True, logits_to_keep=1),
    }
    times: dict[tuple[str, int], list[float]] = {}
    with torch.inference_mode():
        warm = torch.randint(ID_OFFSET, vocab - 1, (64,), generator=gen)
        for fn in runs.values():
            fn(warm)
        for _ in tqdm(range(reps), desc="prefill reps", disable=None):
            for n in lengths:
                ids = torch.randint(ID_OFFSET, vocab - 1, (n,), generator=gen)
                for name, fn in runs.items():
                    t0 = time.perf_counter()
                    fn(ids)
                    times.setdefault((name, n), []).append(time.perf_counter() - t0)
    rows = []
    for n in lengths:
        row: dict[str, Any] = {"tokens": n}
        for name in runs:
            ts = times[(name, n)]
            row[name] = {"best_tok_s": n / min(ts), "median_tok_s": n / float(np.median(ts))}
        row["ours_over_transformers"] = (
            row["ours"]["median_tok_s"] / row["transformers"]["median_tok_s"]
        )
        rows.append(row)
    return rows


# ---------------------------------------------------------------------- output
def plot_ttft(rows: list[dict], path: Path, title: str) -> None:
    """Mean TTFT (with p95 as dotted lines) by turn index, both systems, log y."""
    per_turn = [r for r in rows if r["turn"].isdigit()]
    x = [int(r["turn"]) for r in per_turn]
    fig = Figure(figsize=(7, 4.2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, color in zip(SYSTEMS, ("tab:blue", "tab:orange"), strict=True):
        ax.plot(
            x, [1e3 * r[name]["mean"] for r in per_turn], "o-", color=color, label=f"{name} mean"
        )
        ax.plot(x, [1e3 * r[name]["p95"] for r in per_turn], ":", color=color, label=f"{name} p95")
    ax.set_yscale("log")
    ax.set_xlabel("turn index within the conversation")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def print_summary(report: dict[str, Any]) -> None:
    """The summary table: TTFT per turn, hit rates, prefill throughput."""
    w = report["workload"]
    print(
        f"\nTTFT per turn ({w['requests_served']} requests from {w['sessions']} sessions, "
        f"arrival order; cache {w['cache_bytes'] / 1e9:.2f} GB; "
        f"output mismatches {w['output_mismatches']})"
    )
    print(
        f"{'turn':>5} {'n':>4} {'prompt':>7} | {'marconi mean/p95 ms':>20} | "
        f"{'vanilla mean/p95 ms':>20} | {'v/m':>6} | {'cached':>6}"
    )
    for r in report["ttft_by_turn"]:
        m, v = r["marconi"], r["vanilla"]
        print(
            f"{r['turn']:>5} {m['n']:>4} {r['mean_prompt_tokens']:>7.0f} | "
            f"{1e3 * m['mean']:>9.1f} / {1e3 * m['p95']:>8.1f} | "
            f"{1e3 * v['mean']:>9.1f} / {1e3 * v['p95']:>8.1f} | "
            f"{r['vanilla_over_marconi']:>5.2f}x | {r['marconi_mean_cached_tokens']:>6.0f}"
        )
    h = report["hit_rate"]
    print(
        f"\ntoken hit rate: engine {100 * h['engine_token_hit_rate']:.4f}% "
        f"(usage {100 * h['engine_usage_hit_rate']:.4f}%), simulator "
        f"{100 * h['simulator']['token_hit_rate']:.4f}%, unbounded simulator "
        f"{100 * h['simulator_unbounded_token_hit_rate']:.4f}%; evictions engine "
        f"{h['engine_evictions']} / simulator {h['simulator']['evictions']}"
    )
    print("\nprefill tokens/s (median of reps, one thread)")
    print(f"{'tokens':>6} | {'ours':>8} | {'transformers':>12} | {'ours/hf':>7}")
    for r in report["prefill"]:
        print(
            f"{r['tokens']:>6} | {r['ours']['median_tok_s']:>8.0f} | "
            f"{r['transformers']['median_tok_s']:>12.0f} | {r['ours_over_transformers']:>6.2f}x"
        )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/engine", help="output folder")
    parser.add_argument(
        "--model-dir",
        default=".cache/bench_engine/small-nemotron_h",
        help="checkpoint folder; the small NemotronH preset (seed 0) is built there if absent",
    )
    parser.add_argument("--sessions", type=int, default=20, help="ShareGPT conversations")
    parser.add_argument("--out-cap", type=int, default=32, help="max output tokens per turn")
    parser.add_argument(
        "--prompt-cap",
        type=int,
        default=2048,
        help="a session stops at its first turn with prompt + output over this many tokens",
    )
    parser.add_argument("--cache-bytes", type=float, default=1e9, help="marconi cache capacity")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--prefill-lengths", default="256,1024,2048", help="comma-separated prompt lengths"
    )
    parser.add_argument("--prefill-reps", type=int, default=3, help="reps per prefill length")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 3 sessions, 8 output tokens, 512-token prompts, 1 prefill rep of 256",
    )
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.out_cap, args.prompt_cap = 3, 8, 512
        args.prefill_lengths, args.prefill_reps = "256", 1
    return args


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model_dir = ensure_model(Path(args.model_dir))
    cache_bytes = int(args.cache_bytes)
    engines = {name: Engine(model_dir, system=name, cache_bytes=cache_bytes) for name in SYSTEMS}
    for engine in engines.values():
        warm_up(engine)
    trace = load_trace("sharegpt", n_sessions=args.sessions)
    turns = schedule(trace, engines["marconi"].config.vocab_size, args.out_cap)
    records = serve(engines, turns, args.prompt_cap)
    rows = ttft_by_turn(records)
    report: dict[str, Any] = {
        "model": {"preset": "small", "family": "nemotron_h", "dir": str(model_dir)},
        "workload": {
            "trace": "sharegpt (artifact mode)",
            "order": "trace arrival order, sessions interleaved; each request served by "
            "marconi then the same prompt by vanilla",
            "id_map": "llama2_id % (vocab - 8) + 7",
            "sessions": args.sessions,
            "trace_requests": len(turns),
            "requests_served": len(records),
            "non_extending_turns": sum(not t.extends for t in turns),
            "out_cap": args.out_cap,
            "prompt_cap": args.prompt_cap,
            "cache_bytes": cache_bytes,
            "threads": args.threads,
            "output_mismatches": sum(not r["outputs_match"] for r in records),
            "prompt_tokens": sum(r["prompt_tokens"] for r in records),
        },
        "ttft_by_turn": rows,
        "hit_rate": simulate(engines["marconi"], records, cache_bytes),
    }
    del engines
    report["prefill"] = prefill_bench(
        model_dir, [int(x) for x in args.prefill_lengths.split(",")], args.prefill_reps
    )
    report["requests"] = [
        {k: v for k, v in r.items() if k not in ("input", "output")} for r in records
    ]
    report["wall_s"] = time.perf_counter() - start
    plot_ttft(
        rows,
        out / "ttft_by_turn.png",
        f"TTFT by turn, small NemotronH (48M) on CPU, {args.sessions} ShareGPT sessions",
    )
    (out / "bench_engine.json").write_text(json.dumps(report, indent=2, default=float))
    print_summary(report)
    print(
        f"\nwall time {report['wall_s']:.0f} s; wrote {out / 'bench_engine.json'} and "
        f"{out / 'ttft_by_turn.png'}"
    )


if __name__ == "__main__":
    main()
