"""The cost of constrained decoding, side by side with unconstrained decoding in one run.

Two sections:
- `engine`: decode tokens/s of the in-process `Engine` with and without a grammar, at
  each batch size of `--batches`, on the `tiny` NemotronH preset (byte vocabulary) and
  the packaged `chat` model (a 4,096-token BPE vocabulary). Both run the same prompts
  for `--tokens` tokens (`ignore_eos`; the grammar, an endless JSON list of strings,
  never completes; only the end-of-sequence token it allows between items can end a
  constrained request early, and tokens/s counts the tokens made). Runs alternate (unconstrained,
  constrained, ...) `--reps` times; the median of each is reported, and the ratio.
- `mask`: the host's share at real vocabulary sizes: one step's bitmask fill for B
  matchers (llguidance, inside a JSON string, the commonest state of a JSON reply) and
  the whole `GrammarMasks.mask` (fill, expansion and fill into the logits, here on the
  CPU), on synthetic byte-level vocabularies of `--vocabs` tokens (Qwen3.5's is
  248,320; Llama-3's 128,256). On a GPU the bitmask fill overlaps the forward it waits
  on (the step's kernels are queued first) and the expansion and fill are two device
  ops over B x V booleans.

Writes `OUT/bench_constrained.json` and `OUT/bench_constrained.md` (the tables).

Example: python benchmarks/bench_constrained.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import llguidance.torch as llt
import torch
from llguidance import LLMatcher, LLTokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from tqdm import tqdm

from marconi_ray.engine.constrained import GrammarMasks, GrammarTokenizer, bitmask_words
from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.serve.model_source import resolve_model

STRING = json.dumps({"type": "string", "x-guidance": {"whitespace_flexible": False}})
GRAMMAR = LLMatcher.grammar_from_lark(f'start: "[" item (", " item)*\nitem: %json {STRING}')
"""A JSON list of strings that is never closed: the JSON lexer's commonest states (inside
a string, between items) for as many tokens as asked."""


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", default="1,16", help="decode batch sizes (comma-separated)")
    p.add_argument("--tokens", type=int, default=48, help="tokens each request generates")
    p.add_argument("--reps", type=int, default=3, help="runs of each mode, alternating")
    p.add_argument(
        "--vocabs",
        default="4096,32000,128256,248320",
        help="vocabulary sizes of the mask section (comma-separated)",
    )
    p.add_argument("--mask-steps", type=int, default=50, help="steps timed per vocabulary")
    p.add_argument("--out", default="benchmarks/results/constrained", help="output folder")
    return p.parse_args()


def _prompts(engine: Engine, n: int) -> list[list[int]]:
    tokenizer = engine.tokenizer
    return [list(tokenizer.encode(f"Request {i}: reply in JSON, please.")) for i in range(n)]


def _tok_s(engine: Engine, prompts: list[list[int]], tokens: int, grammar: str | None) -> float:
    params = [
        SamplingParams(max_tokens=tokens, temperature=1.0, seed=i, ignore_eos=True, grammar=grammar)
        for i in range(len(prompts))
    ]
    t0 = time.perf_counter()
    results = engine.generate_many(prompts, params)
    elapsed = time.perf_counter() - t0
    return sum(len(r.tokens) for r in results) / elapsed


def engine_section(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    models = {
        "tiny nemotron_h": make_model("tiny", "nemotron_h", root / "tiny"),
        "chat": resolve_model("chat"),
    }
    batches = [int(b) for b in args.batches.split(",")]
    out: dict[str, Any] = {}
    jobs = [(name, b) for name in models for b in batches]
    for name, batch in tqdm(jobs, desc="engine", unit="config"):
        # no cache: every run prefills and decodes the same work
        engine = Engine(models[name], system="vanilla", max_batch=max(batches))
        prompts = _prompts(engine, batch)
        _tok_s(engine, prompts, 4, GRAMMAR)  # warm-up: the grammar tokenizer, the kernels
        free, constrained = [], []
        for _ in range(args.reps):
            free.append(_tok_s(engine, prompts, args.tokens, None))
            constrained.append(_tok_s(engine, prompts, args.tokens, GRAMMAR))
        f, c = statistics.median(free), statistics.median(constrained)
        out.setdefault(name, {})[str(batch)] = {
            "unconstrained_tok_s": f,
            "constrained_tok_s": c,
            "ratio": c / f,
            "runs": {"unconstrained": free, "constrained": constrained},
        }
    return out


def synthetic_tokenizer(vocab: int, seed: int = 0) -> LLTokenizer:
    """An llguidance tokenizer of `vocab` byte-level tokens: the 256 bytes, then random
    printable strings of 2-8 characters (a real vocabulary's shape for the mask's cost:
    a trie walk over every token's bytes)."""
    rng = random.Random(seed)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    pieces = dict.fromkeys(sorted(alphabet))
    letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:{}\"'"
    while len(pieces) < vocab - 1:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(2, 8)))
        pieces[word.replace(" ", "Ġ")] = None
    ids = {piece: i for i, piece in enumerate(pieces)}
    ids["<eos>"] = len(ids)
    tok = Tokenizer(models.BPE(vocab=ids, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return LLTokenizer(tok.to_str(), n_vocab=len(ids), eos_token=len(ids) - 1)


def mask_section(args: argparse.Namespace) -> dict[str, Any]:
    """Per vocabulary and batch: the median step's `GrammarMasks.mask` (the engine's
    code path: bitmask fill, expansion, fill into the logits) and its bitmask fill
    alone."""
    batches = [int(b) for b in args.batches.split(",")]
    out: dict[str, Any] = {}
    for vocab in tqdm([int(v) for v in args.vocabs.split(",")], desc="mask", unit="vocab"):
        tokenizer = synthetic_tokenizer(vocab)
        masks = GrammarMasks(GrammarTokenizer.built(tokenizer, vocab))
        prefix = tokenizer.tokenize_str('["abc", "')
        for batch in batches:
            matchers = [masks.matcher(GRAMMAR, prefix) for _ in range(batch)]
            host = torch.empty((batch, bitmask_words(vocab)), dtype=torch.int32)
            logits = torch.randn(batch, vocab)
            rows = list(range(batch))
            fill, whole = [], []
            for _ in range(args.mask_steps):
                t0 = time.perf_counter()
                for i, m in enumerate(matchers):
                    llt.fill_next_token_bitmask(m, host, i)
                t1 = time.perf_counter()
                masks.mask(logits, rows, matchers)
                t2 = time.perf_counter()
                fill.append(t1 - t0)
                whole.append(t2 - t1)
            out.setdefault(str(vocab), {})[str(batch)] = {
                "fill_us": statistics.median(fill) * 1e6,
                "mask_cpu_us": statistics.median(whole) * 1e6,
            }
    return out


def tables(report: dict[str, Any]) -> str:
    lines = [
        "## Decode tokens/s with and without a grammar (median of the reps, one run)",
        "",
        "| model | batch | unconstrained tok/s | constrained tok/s | constrained / unconstrained |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, by_batch in report["engine"].items():
        for batch, r in by_batch.items():
            lines.append(
                f"| {name} | {batch} | {r['unconstrained_tok_s']:,.1f} | "
                f"{r['constrained_tok_s']:,.1f} | {r['ratio']:.2f}x |"
            )
    lines += [
        "",
        "## Host cost of one step's masks, by vocabulary (median over the steps)",
        "",
        "| vocabulary | batch | bitmask fill (us) | per row (us) | whole mask step on CPU (us) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for vocab, by_batch in report["mask"].items():
        for batch, r in by_batch.items():
            lines.append(
                f"| {int(vocab):,} | {batch} | {r['fill_us']:,.0f} | "
                f"{r['fill_us'] / int(batch):,.0f} | {r['mask_cpu_us']:,.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        report = {"engine": engine_section(args, Path(tmp)), "mask": mask_section(args)}
    report["args"] = vars(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_constrained.json").write_text(json.dumps(report, indent=2) + "\n")
    text = tables(report)
    (out / "bench_constrained.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
