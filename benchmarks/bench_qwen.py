"""Speed of the engine on the Gated DeltaNet families against transformers, one run.

For each family (random weights of the `small` preset, fp32, CPU, one thread), measured
side by side, lengths and implementations interleaved:
1. prefill tok/s: our `HybridModel.prefill` vs transformers' forward with its cache, on the
   same weights and prompts;
2. decode tok/s: one sequence, our `decode` vs transformers' cached forward of one token;
3. TTFT of a follow-up turn (the prompt plus `--turn` new tokens) served by a Marconi
   engine that holds the prompt's states, against a vanilla engine (no prefix cache).

Writes `OUT/bench_qwen.json` and prints a table of medians and ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.presets.factory import make_model, model_class, read_record
from marconi_ray.protocol.sampling import SamplingParams

FAMILIES = ("qwen3_5_text", "qwen3_5_moe_text", "qwen3_next")


def _hf(model_dir: Path) -> Any:
    """transformers' implementation of a make-model folder, on the same weights."""
    cls = model_class(read_record(model_dir)["family"])
    return cls.from_pretrained(model_dir, dtype=torch.float32).eval()


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return out.past_key_values if cache is None else cache


def _ids(n: int, seed: int, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(7, vocab, (n,), generator=g)


@torch.inference_mode()
def _prefill_ours(model: Any, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model.prefill(ids, model.new_state())
    return time.perf_counter() - t0


@torch.inference_mode()
def _prefill_hf(ref: Any, ids: torch.Tensor) -> float:
    t0 = time.perf_counter()
    ref(input_ids=ids[None], use_cache=True)
    return time.perf_counter() - t0


@torch.inference_mode()
def _decode_ours(model: Any, ids: torch.Tensor, steps: int) -> float:
    state = model.new_state()
    model.prefill(ids, state)
    t0 = time.perf_counter()
    for _ in range(steps):
        model.decode(state.logits.argmax()[None], [state])
    return time.perf_counter() - t0


@torch.inference_mode()
def _decode_hf(ref: Any, ids: torch.Tensor, steps: int) -> float:
    out = ref(input_ids=ids[None], use_cache=True)
    cache = _cache_of(out)
    t0 = time.perf_counter()
    for _ in range(steps):
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        out = ref(input_ids=token, past_key_values=cache, use_cache=True)
        cache = _cache_of(out)
    return time.perf_counter() - t0


def _ttft(model_dir: Path, prompt: list[int], turn: list[int], reps: int) -> dict[str, float]:
    """Median TTFT (s) of `prompt + output + turn` after `prompt` was served, per system."""
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    out: dict[str, float] = {}
    for system in ("marconi", "vanilla"):
        times = []
        for rep in range(reps):
            engine = Engine(model_dir, system=system, cache_bytes=10**9)
            first = engine.generate(prompt, params)
            follow = prompt + list(first.tokens) + [t + rep for t in turn]
            result = engine.generate(follow, params)
            if system == "marconi":
                assert result.usage.cached_tokens >= len(prompt), result.usage
            times.append(result.timings.ttft)
        out[system] = statistics.median(times)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"threads": args.threads, "preset": args.preset, "families": {}}
    for family in args.families:
        model_dir = make_model(args.preset, family, Path(args.models) / f"{args.preset}-{family}")
        ours, ref = load_model(model_dir), _hf(model_dir)
        vocab = ours.cfg.vocab_size
        prefill: dict[str, dict[str, list[float]]] = {}
        jobs = [(n, rep) for rep in range(args.reps) for n in args.lengths]
        for n, rep in tqdm(jobs, desc=f"{family} prefill", leave=False):
            ids = _ids(n, rep, vocab)
            row = prefill.setdefault(str(n), {"ours": [], "transformers": []})
            for name, fn in (("ours", _prefill_ours), ("transformers", _prefill_hf)):
                row[name].append(n / fn(ours if name == "ours" else ref, ids))
        decode: dict[str, list[float]] = {"ours": [], "transformers": []}
        for rep in tqdm(range(args.reps), desc=f"{family} decode", leave=False):
            ids = _ids(args.decode_context, 100 + rep, vocab)
            decode["ours"].append(args.decode_steps / _decode_ours(ours, ids, args.decode_steps))
            decode["transformers"].append(
                args.decode_steps / _decode_hf(ref, ids, args.decode_steps)
            )
        prompt = _ids(args.ttft_prompt, 7, vocab).tolist()
        turn = _ids(args.turn, 8, vocab - args.reps).tolist()
        results["families"][family] = {
            "prefill_tok_s": {
                n: {k: statistics.median(v) for k, v in row.items()} for n, row in prefill.items()
            },
            "decode_tok_s": {k: statistics.median(v) for k, v in decode.items()},
            "ttft_s": _ttft(model_dir, prompt, turn, args.reps),
        }
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        "| family | prefill tok/s ours / transformers (ratio) by length | "
        "decode tok/s ours / transformers | TTFT cached / uncached |",
        "|---|---|---|---|",
    ]
    for family, r in results["families"].items():
        pre = "; ".join(
            f"{n}: {v['ours']:,.0f} / {v['transformers']:,.0f} "
            f"({v['ours'] / v['transformers']:.2f}x)"
            for n, v in r["prefill_tok_s"].items()
        )
        d = r["decode_tok_s"]
        t = r["ttft_s"]
        lines.append(
            f"| {family} | {pre} | {d['ours']:.1f} / {d['transformers']:.1f} "
            f"({d['ours'] / d['transformers']:.2f}x) | {t['marconi'] * 1e3:.1f} ms / "
            f"{t['vanilla'] * 1e3:.1f} ms ({t['vanilla'] / t['marconi']:.1f}x faster) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--families", nargs="+", default=list(FAMILIES), help="families to build")
    p.add_argument("--preset", default="small", help="make-model preset (default: small)")
    p.add_argument(
        "--models", default="benchmarks/.models", help="where preset checkpoints are built"
    )
    p.add_argument(
        "--lengths", nargs="+", type=int, default=[128, 512, 1024], help="prefill prompt lengths"
    )
    p.add_argument("--reps", type=int, default=3, help="repetitions of every measurement")
    p.add_argument("--decode-context", type=int, default=256, help="context before decoding")
    p.add_argument("--decode-steps", type=int, default=32, help="decode steps timed")
    p.add_argument("--ttft-prompt", type=int, default=1024, help="tokens of the cached prompt")
    p.add_argument("--turn", type=int, default=32, help="new tokens of the follow-up turn")
    p.add_argument("--threads", type=int, default=1, help="torch threads (both sides)")
    p.add_argument("--out", default="benchmarks/results/qwen", help="output folder")
    args = p.parse_args(argv)
    results = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_qwen.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
