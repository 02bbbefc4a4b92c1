"""Verified and plain sequences in one forward against two, side by side in one run.

Batch 4 on the `small` presets of a Mamba-2 and a Gated DeltaNet family: two sequences
draft with an oracle forced to 100% acceptance (k = 4), two never draft, so every step
verifies two and decodes two. The same engine runs its steps as one forward
(`Worker.one_forward`: `HybridModel.decode_and_prefill`) or as two (a decode step, then
the verification), and a plain engine gives the baseline; decode tokens/s medians of
`--reps` runs, outputs checked equal. The ratio that matters is one / two: against the
plain baseline both lose throughput, since the drafting pair finishes early and the
other two then decode alone at batch 2 (speculation buys their latency, not the batch's
throughput).

Example: python benchmarks/bench_spec_mixed.py --reps 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).parent))
from bench_spec import decode_run

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.spec.drafters import OracleDrafter
from marconi_ray.protocol.speculative import SpeculativeConfig


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small", help="preset of the models")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--reps", type=int, default=3, help="runs of each configuration")
    return p.parse_args()


def speculative_run(
    folder: Path, prompts: list[list[int]], futures: dict, tokens: int, one_forward: bool
) -> tuple[float, list[Any]]:
    """Decode tok/s and results of an engine whose oracle drafts `futures`' prompts."""
    config = SpeculativeConfig("oracle", 4, backoff=0)
    engine = Engine(folder, system="vanilla", max_batch=len(prompts), speculative=config,
                    drafter=OracleDrafter(futures, 1.0, 263))  # fmt: skip
    engine.worker.one_forward = one_forward
    decode_run(engine, prompts, 4)
    return decode_run(engine, prompts, tokens)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    root = tempfile.mkdtemp()
    print("| family | plain tok/s | two forwards | one forward | one / two |")
    print("| --- | --- | --- | --- | --- |")
    for fam in ("nemotron_h", "qwen3_5"):
        folder = make_model(args.preset, fam, f"{root}/{fam}")
        prompts = [[7 + (j * 5 + i) % 250 for j in range(64)] for i in range(4)]
        ref = Engine(folder, system="vanilla", max_batch=4)
        outs = decode_run(ref, prompts, args.tokens)[1]
        futures = {tuple(p): list(r.tokens) for p, r in zip(prompts, outs, strict=True)}
        half = dict(list(futures.items())[:2])
        base, one, two = [], [], []
        for _ in tqdm(range(args.reps), desc=fam, unit="rep"):
            base.append(decode_run(ref, prompts, args.tokens)[0])
            rate1, res1 = speculative_run(folder, prompts, half, args.tokens, True)
            rate2, res2 = speculative_run(folder, prompts, half, args.tokens, False)
            want = [r.tokens for r in outs]
            if [r.tokens for r in res1] != want or [r.tokens for r in res2] != want:
                raise AssertionError("the tokens differ")
            one.append(rate1)
            two.append(rate2)
        b, o, t = (statistics.median(x) for x in (base, one, two))
        print(f"| {fam} | {b:.1f} | {t:.1f} ({t / b:.2f}x) | {o:.1f} ({o / b:.2f}x) | "
              f"{o / t:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
