"""Speculative decoding's decode tokens/s next to decoding without it, in one run.

Decode tokens/s counts the tokens after each request's first, over the steps after every
request has started (prefill left out), greedy, `--tokens` per request; each
configuration runs `--reps` times alternating with its baseline, medians reported. The
outputs with and without speculation are checked equal.

- `oracle`: a drafter that knows the greedy continuation, forced to 100%, 50% and 0%
  acceptance (`OracleDrafter`): the ceiling and the cost of the machinery, on the
  `--preset` preset of a Mamba-2 family (nemotron_h) and a Gated DeltaNet family
  (qwen3_5), for each k of `--ks`, at batch 1.
- `mtp`: the checkpoint's multi-token-prediction layers, added at random to the same
  presets (`add_mtp_weights`; released checkpoints carry trained ones): random layers
  draft almost nothing right, so this measures what MTP drafting costs when it does not
  pay (with the adaptive back-off on), at k = the largest of `--ks`.
- `ngram`: prompt lookup on the packaged `chat` model (and, with `--mtp-model`, the chat
  model's trained MTP layers: `scripts/train_mtp.py`), on ShareGPT conversations and on
  SWE-agent trajectories (copy-heavy), rendered with its chat template (`--prompts`
  prompts each, cut to `--prompt-chars` characters); the acceptance rate (drafts kept
  over drafted) and tokens/s. Needs the shared data folder; left out, and said so,
  without it.

Writes `OUT/bench_spec.json` and `OUT/bench_spec.md`.

Example: python benchmarks/bench_spec.py --reps 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from marconi_ray.engine.engine import Engine
from marconi_ray.engine.presets.factory import make_model
from marconi_ray.engine.presets.mtp_weights import add_mtp_weights
from marconi_ray.engine.spec.drafters import Drafter, OracleDrafter
from marconi_ray.protocol.model_files import load_tokenizer
from marconi_ray.protocol.sampling import SamplingParams
from marconi_ray.protocol.speculative import SpeculativeConfig
from marconi_ray.serve.model_source import resolve_model
from marconi_ray.traces.paths import default_data_dir
from marconi_ray.traces.swebench import TRAJ_DIR, load_messages, trajectory_files


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="small", help="preset of the oracle section's models")
    p.add_argument("--ks", default="2,4", help="draft lengths of the oracle section")
    p.add_argument("--tokens", type=int, default=64, help="tokens generated per request")
    p.add_argument("--reps", type=int, default=3, help="runs of each configuration")
    p.add_argument("--prompts", type=int, default=4, help="prompts per ngram workload")
    p.add_argument("--prompt-chars", type=int, default=3000, help="characters per prompt")
    p.add_argument(
        "--sections",
        default="oracle,mtp,ngram",
        help="sections to run: oracle, mtp, ngram (comma-separated)",
    )
    p.add_argument(
        "--mtp-model",
        default=None,
        help="a chat model folder with trained MTP layers (scripts/train_mtp.py): the ngram "
        "section's workloads also run with --speculative mtp on it",
    )
    p.add_argument("--out", default="benchmarks/results/spec", help="output folder")
    return p.parse_args()


def decode_run(engine: Engine, prompts: list[list[int]], tokens: int) -> tuple[float, list[Any]]:
    """(decode tokens/s, results) of `prompts` started together, then decoded."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    done: dict[int, Any] = {}
    t0 = time.perf_counter()
    while engine.num_running:
        for r in engine.step():
            done[r.request_id] = r
    elapsed = time.perf_counter() - t0
    results = [done[i] for i in ids]
    return sum(len(r.tokens) - 1 for r in results) / elapsed, results


def compare(
    model_dir: Path, prompts: list[list[int]], tokens: int, reps: int, k: int,
    drafter: Drafter | None, method: str = "ngram",
) -> dict[str, Any]:  # fmt: skip
    """Median decode tok/s without and with speculation (`drafter`, None: the one
    `method` names)."""
    base = Engine(model_dir, system="vanilla", max_batch=len(prompts))
    config = SpeculativeConfig(method, k, prompt_lookup_min=2, prompt_lookup_max=4)
    spec = Engine(model_dir, system="vanilla", max_batch=len(prompts), speculative=config,
                  drafter=drafter)  # fmt: skip
    decode_run(base, prompts, 4)  # warm-up
    decode_run(spec, prompts, 4)
    plain, fast, counts = [], [], []
    for _ in range(reps):
        rate, want = decode_run(base, prompts, tokens)
        plain.append(rate)
        rate, got = decode_run(spec, prompts, tokens)
        fast.append(rate)
        if [r.tokens for r in got] != [r.tokens for r in want]:
            raise AssertionError("speculation changed the greedy tokens")
        counts.append((sum(r.spec.drafted for r in got), sum(r.spec.accepted for r in got)))
    p, f = statistics.median(plain), statistics.median(fast)
    drafted, accepted = counts[-1]
    return {
        "plain_tok_s": p, "spec_tok_s": f, "ratio": f / p, "drafted": drafted,
        "accepted": accepted, "acceptance": accepted / drafted if drafted else 0.0,
    }  # fmt: skip


def oracle_section(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    jobs = [(fam, int(k), rate) for fam in ("nemotron_h", "qwen3_5")
            for k in args.ks.split(",") for rate in (1.0, 0.5, 0.0)]  # fmt: skip
    dirs = {fam: make_model(args.preset, fam, root / fam) for fam in ("nemotron_h", "qwen3_5")}
    for fam, k, rate in tqdm(jobs, desc="oracle", unit="config"):
        prompts = [[7 + (j * 5) % 250 for j in range(64)]]
        ref = Engine(dirs[fam], system="vanilla")
        futures = {tuple(p): list(decode_run(ref, [p], args.tokens)[1][0].tokens) for p in prompts}
        vocab = ref.config.vocab_size
        drafter = OracleDrafter(futures, rate, vocab)
        out.setdefault(fam, {}).setdefault(f"k={k}", {})[f"{rate:.0%}"] = compare(
            dirs[fam], prompts, args.tokens, args.reps, k, drafter
        )
    return out


def mtp_section(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    k = max(int(k) for k in args.ks.split(","))
    for fam in tqdm(("nemotron_h", "qwen3_5"), desc="mtp", unit="family"):
        folder = add_mtp_weights(make_model(args.preset, fam, root / f"{fam}_mtp"))
        prompts = [[7 + (j * 5) % 250 for j in range(64)]]
        out[fam] = compare(folder, prompts, args.tokens, args.reps, k, None, "mtp")
        out[fam]["k"] = k
    return out


def _sharegpt_prompts(tokenizer: Any, n: int, chars: int) -> list[list[int]]:
    raw = json.loads(_sharegpt_file().read_text())
    prompts = []
    for conv in raw:
        turns = conv.get("conversations", [])
        messages = []
        for t in turns[:6]:
            role = "user" if t.get("from") == "human" else "assistant"
            messages.append({"role": role, "content": str(t.get("value", ""))[: chars // 6]})
        if len(messages) >= 3 and messages[-1]["role"] == "assistant":
            prompts.append(_render(tokenizer, messages[:-1]))
        if len(prompts) == n:
            break
    return prompts


def _sharegpt_file() -> Path:
    folder = default_data_dir() / "sharegpt"
    return sorted(folder.glob("*.head4000.json"))[0]


def _swe_prompts(tokenizer: Any, n: int, chars: int) -> list[list[int]]:
    prompts = []
    for path in trajectory_files(default_data_dir() / TRAJ_DIR)[:n]:
        messages = [{"role": m["role"], "content": str(m["content"])[: chars // 8]}
                    for m in load_messages(path)[:9]]  # fmt: skip
        prompts.append(_render(tokenizer, messages[:-1]))
    return prompts


def _render(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = out["input_ids"] if hasattr(out, "keys") else out
    return [int(t) for t in ids][-3500:]


def ngram_section(args: argparse.Namespace) -> dict[str, Any] | str:
    try:
        chat = resolve_model("chat")
        tokenizer = load_tokenizer(chat)
        workloads = {
            "sharegpt": _sharegpt_prompts(tokenizer, args.prompts, args.prompt_chars),
            "swe-agent": _swe_prompts(tokenizer, args.prompts, args.prompt_chars),
        }
    except (FileNotFoundError, IndexError) as exc:
        return f"left out: the shared data folder is not here ({exc})"
    out = {}
    for name, prompts in tqdm(workloads.items(), desc="ngram", unit="workload"):
        out[name] = compare(chat, prompts, args.tokens, args.reps, 4, None)
        if args.mtp_model:
            trained = Path(args.mtp_model)
            out[f"{name}, mtp (trained)"] = compare(
                trained, prompts, args.tokens, args.reps, 4, None, "mtp"
            )
    return out


def tables(report: dict[str, Any]) -> str:
    lines = ["## Oracle drafter: decode tok/s at forced acceptance, batch 1", "",
             "| family | k | acceptance | without tok/s | with tok/s | with / without |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for fam, by_k in report["oracle"].items():
        for k, by_rate in by_k.items():
            for rate, r in by_rate.items():
                lines.append(f"| {fam} | {k[2:]} | {rate} | {r['plain_tok_s']:,.1f} | "
                             f"{r['spec_tok_s']:,.1f} | {r['ratio']:.2f}x |")  # fmt: skip
    mtp = report["mtp"]
    lines += ["", "## MTP drafting with random MTP layers (its cost when it does not pay), "
              "batch 1", ""]  # fmt: skip
    if isinstance(mtp, str):
        lines.append(mtp)
    else:
        lines += ["| family | k | drafted | kept | without tok/s | with tok/s | ratio |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for fam, r in mtp.items():
            lines.append(f"| {fam} | {r['k']} | {r['drafted']} | {r['accepted']} | "
                         f"{r['plain_tok_s']:,.1f} | {r['spec_tok_s']:,.1f} | "
                         f"{r['ratio']:.2f}x |")  # fmt: skip
    lines += ["", "## ngram on the chat model (and MTP with trained layers, given), k = 4", ""]
    ngram = report["ngram"]
    if isinstance(ngram, str):
        return "\n".join([*lines, ngram]) + "\n"
    lines += ["| prompts | drafted | kept | acceptance | without tok/s | with tok/s | ratio |",
              "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name, r in ngram.items():
        rates = f"{r['plain_tok_s']:,.1f} | {r['spec_tok_s']:,.1f} | {r['ratio']:.2f}x"
        lines.append(f"| {name} | {r['drafted']} | {r['accepted']} | {r['acceptance']:.2f} | "
                     f"{rates} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    sections = args.sections.split(",")
    report: dict[str, Any] = {
        "oracle": {}, "mtp": "not run (--sections)", "ngram": "not run (--sections)",
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        if "oracle" in sections:
            report["oracle"] = oracle_section(args, Path(tmp))
        if "mtp" in sections:
            report["mtp"] = mtp_section(args, Path(tmp))
    if "ngram" in sections:
        report["ngram"] = ngram_section(args)
    report["args"] = vars(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench_spec.json").write_text(json.dumps(report, indent=2) + "\n")
    text = tables(report)
    (out / "bench_spec.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
