"""Train the `chat` model: a small Nemotron-H-layout hybrid (Mamba-2 + attention + MLP)
and its BPE tokenizer, on the English ShareGPT conversations of `../shared/data`.

Steps, each skipped when its output is already in --work (so a rerun resumes):
1. read and split the conversations (`chat_corpus`), write the held-out ones;
2. train a byte-level BPE tokenizer (`tokenizers`) on the training text, with the
   special tokens and chat template of `marconi_ray.engine.presets.byte_tokenizer` (ids 0..6);
3. tokenize the training conversations into one stream (`train_tokens.npy`);
4. train with AdamW (warm-up, cosine decay) on random windows of the stream, the batch
   of step s drawn from a generator seeded with (seed, s): a run resumed from a
   checkpoint draws the same batches as one that never stopped. A checkpoint
   (`checkpoint.pt`: weights, optimizer, step) is written every --save-every steps and
   when --minutes runs out;
5. export (`--export`): config.json, model.safetensors (bfloat16: the weights are
   rounded once, and scored after rounding), tokenizer files,
   generation_config.json, the held-out sample the tests score, `train_log.json`
   (settings, data counts, the loss curve, held-out bits per byte before and after) and
   the loss curve's plot (`--plot`).

The model is transformers' `NemotronHForCausalLM` (the engine serves the same checkpoint
and is tested exact against it). Run `python scripts/train_chat.py --help` for options.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chat_corpus import Conversation, read_jsonl_gz, read_sharegpt, render, split, write_jsonl_gz
from chat_eval import bits_per_byte

from marconi_ray.engine.presets.byte_tokenizer import (
    END_ID,
    EOS_ID,
    SPECIAL_TOKENS,
    TOKENIZER_FILES,
    tokenizer_config,
)
from marconi_ray.engine.presets.model_presets import ModelPreset, nemotron_h_kwargs

REPO = Path(__file__).resolve().parents[1]
CHAT_SHAPE = ModelPreset(
    name="chat",
    pattern="M-M*-M-M*-",
    hidden_size=256,
    intermediate_size=640,
    vocab_size=4096,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    mamba_num_heads=16,
    mamba_head_dim=32,
    n_groups=1,
    ssm_state_size=32,
    conv_kernel=4,
    chunk_size=64,
    max_position_embeddings=4096,
)
"""4 Mamba-2, 2 attention and 4 MLP layers, d_model 256, a 4,096-id vocabulary: ~5.5M
weights (11 MB in bfloat16; Nemotron-H does not tie its embeddings)."""

HELD_OUT_SAMPLE = 48
"""Held-out conversations shipped beside the model (scored by the tests)."""
SAMPLE_CHARS = 2000
"""Each shipped held-out message is cut to this many characters (keeps the file small)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Train the packaged `chat` model (a ~5.5M-weight Nemotron-H-layout "
        "hybrid) and its tokenizer on ShareGPT; resumable, seeded.",
    )
    p.add_argument(
        "--data",
        type=Path,
        default=REPO.parent / "shared" / "data" / "sharegpt",
        help="folder with the ShareGPT JSON files (default: ../shared/data/sharegpt)",
    )
    p.add_argument(
        "--work",
        type=Path,
        default=REPO / "runs" / "train-chat",
        help="working folder: tokenizer, token stream, checkpoint (default: runs/train-chat)",
    )
    p.add_argument(
        "--export",
        type=Path,
        default=REPO / "marconi_ray" / "data" / "chat",
        help="where the finished model folder goes (default: marconi_ray/data/chat)",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=REPO / "docs" / "chat_loss.png",
        help="the loss curve's PNG (default: docs/chat_loss.png)",
    )
    p.add_argument("--steps", type=int, default=2000, help="optimizer steps (default: 2000)")
    p.add_argument("--batch", type=int, default=8, help="windows per step (default: 8)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per window (default: 512)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: 2e-3)")
    p.add_argument("--warmup", type=int, default=100, help="warm-up steps (default: 100)")
    p.add_argument(
        "--vocab",
        type=int,
        default=CHAT_SHAPE.vocab_size,
        help=f"tokenizer vocabulary (default: {CHAT_SHAPE.vocab_size})",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of weights and batches (0)")
    p.add_argument("--threads", type=int, default=2, help="torch threads (default: 2)")
    p.add_argument(
        "--save-every", type=int, default=100, help="checkpoint every N steps (default: 100)"
    )
    p.add_argument(
        "--minutes",
        type=float,
        default=0.0,
        help="stop (with a checkpoint, no export) after this many minutes of "
        "training in this run; 0: no limit (default)",
    )
    p.add_argument(
        "--eval-conversations",
        type=int,
        default=HELD_OUT_SAMPLE,
        help=f"held-out conversations scored at export (default: {HELD_OUT_SAMPLE})",
    )
    args = p.parse_args(argv)
    for name in ("steps", "batch", "seq_len", "vocab", "threads", "save_every"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.vocab < len(SPECIAL_TOKENS) + 256:
        raise SystemExit(f"--vocab must be >= {len(SPECIAL_TOKENS) + 256}, got {args.vocab}")
    return args


def build_tokenizer(train: list[Conversation], vocab: int) -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on `train`'s text; ids 0..6 are
    `SPECIAL_TOKENS` in order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    tokenizer.train_from_iterator((m["content"] for c in train for m in c.messages), trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != i:
            raise AssertionError(f"special token {token!r} is not id {i}")
    return tokenizer


def save_tokenizer(tokenizer: Any, out: Path, max_length: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = tokenizer_config(max_length)
    special = {k: config[k] for k in ("bos_token", "eos_token", "pad_token")}
    special["additional_special_tokens"] = config["additional_special_tokens"]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")


def load_hf_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def token_stream(tokenizer: Any, train: list[Conversation]) -> np.ndarray:
    """Every training conversation rendered and encoded, one after another (int16)."""
    texts = [render(c.messages) for c in train]
    ids: list[int] = []
    for start in tqdm(range(0, len(texts), 256), desc="tokenizing", unit="x256 conv"):
        for enc in tokenizer.encode_batch(texts[start : start + 256]):
            ids.extend(enc.ids)
    return np.asarray(ids, dtype=np.int16)


def make_model(vocab: int, seed: int) -> Any:
    from transformers import NemotronHConfig, NemotronHForCausalLM

    kwargs = nemotron_h_kwargs(CHAT_SHAPE)
    kwargs.update(vocab_size=vocab)
    torch.manual_seed(seed)
    return NemotronHForCausalLM(NemotronHConfig(**kwargs))


def learning_rate(step: int, args: argparse.Namespace) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def batch_at(stream: np.ndarray, step: int, args: argparse.Namespace) -> torch.Tensor:
    """The windows of `step`: the same for every run with this seed."""
    rng = np.random.default_rng([args.seed, step])
    starts = rng.integers(0, len(stream) - args.seq_len - 1, size=args.batch)
    rows = np.stack([stream[s : s + args.seq_len] for s in starts]).astype(np.int64)
    return torch.from_numpy(rows)


def train(args: argparse.Namespace, stream: np.ndarray, work: Path) -> tuple[Any, list]:
    """Train from the checkpoint in `work` (or from scratch) up to `args.steps`, or until
    `args.minutes` run out; returns the model and the loss curve [(step, loss)]."""
    model = make_model(args.vocab, args.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    ckpt = work / "checkpoint.pt"
    step, curve = 0, []
    if ckpt.is_file():
        state = torch.load(ckpt, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step, curve = state["step"], state["curve"]
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else math.inf

    def save() -> None:
        tmp = ckpt.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "step": step,
                "curve": curve,
            },
            tmp,
        )
        tmp.replace(ckpt)

    model.train()
    bar = tqdm(total=args.steps, initial=step, desc="training", unit="step")
    while step < args.steps and time.monotonic() < deadline:
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, args)
        x = batch_at(stream, step, args)
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        curve.append((step, round(loss.item(), 4)))
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}")
        if step % args.save_every == 0:
            save()
    bar.close()
    save()
    model.eval()
    return model, curve


def plot_curve(curve: list, path: Path, bpb: float, random_bpb: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.array([s for s, _ in curve])
    loss = np.array([v for _, v in curve])
    smooth = np.convolve(loss, np.ones(25) / 25, mode="valid") if len(loss) >= 25 else loss
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, loss, alpha=0.3, label="training loss (per step)")
    ax.plot(steps[len(steps) - len(smooth) :], smooth, label="mean of 25 steps")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per token)")
    ax.set_title(f"chat model: held-out {bpb:.3f} bits/byte (untrained: {random_bpb:.3f})")
    ax.legend()
    ax.grid(alpha=0.3)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def export(
    args: argparse.Namespace, model: Any, curve: list, work: Path, counts: dict[str, int]
) -> dict[str, Any]:
    """Write the model folder to `args.export`; returns the training log."""
    tokenizer = load_hf_tokenizer(work / "tokenizer")
    held = list(read_jsonl_gz(work / "heldout_sample.jsonl.gz"))[: args.eval_conversations]
    model = model.to(torch.bfloat16).float()
    bpb = bits_per_byte(model, tokenizer, held, window=args.seq_len)
    random_bpb = bits_per_byte(
        make_model(args.vocab, args.seed + 1).eval(), tokenizer, held, window=args.seq_len
    )
    out = args.export
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.to(torch.bfloat16).save_pretrained(str(tmp), safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(work / "tokenizer" / name, tmp / name)
    generation = {
        "bos_token_id": 1,
        "eos_token_id": [EOS_ID, END_ID],
        "pad_token_id": 0,
        "temperature": 0.7,
        "top_p": 0.9,
        "max_new_tokens": 96,
    }
    (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    shutil.copy(work / "heldout_sample.jsonl.gz", tmp / "heldout_sample.jsonl.gz")
    log = {
        "settings": {
            k: str(v) if isinstance(v, Path) else v
            for k, v in vars(args).items()
            if k not in ("data", "work", "export", "plot")
        },
        "shape": CHAT_SHAPE.__dict__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "data": counts,
        "held_out_bits_per_byte": round(bpb, 4),
        "untrained_bits_per_byte": round(random_bpb, 4),
        "held_out_conversations_scored": len(held),
        "curve": curve,
    }
    (tmp / "train_log.json").write_text(json.dumps(log) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    plot_curve(curve, args.plot, bpb, random_bpb)
    return log


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    counts_path = work / "counts.json"
    if not counts_path.is_file():
        train_set, held = split(read_sharegpt(args.data))
        write_jsonl_gz(work / "train.jsonl.gz", train_set)
        sample = [
            Conversation(
                c.id, tuple({**m, "content": m["content"][:SAMPLE_CHARS]} for m in c.messages)
            )
            for c in held[:HELD_OUT_SAMPLE]
        ]
        write_jsonl_gz(work / "heldout_sample.jsonl.gz", sample)
        counts_path.write_text(json.dumps({"train": len(train_set), "held_out": len(held)}))
    counts = json.loads(counts_path.read_text())
    train_set = list(read_jsonl_gz(work / "train.jsonl.gz"))
    if not (work / "tokenizer" / "tokenizer.json").is_file():
        save_tokenizer(
            build_tokenizer(train_set, args.vocab),
            work / "tokenizer",
            CHAT_SHAPE.max_position_embeddings,
        )
    stream_path = work / "train_tokens.npy"
    if not stream_path.is_file():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(work / "tokenizer" / "tokenizer.json"))
        np.save(stream_path, token_stream(tok, train_set))
    stream = np.load(stream_path)
    counts["train_tokens"] = len(stream)
    print(
        f"{counts['train']} training conversations ({len(stream):,} tokens), "
        f"{counts['held_out']} held out"
    )
    model, curve = train(args, stream, work)
    if len(curve) < args.steps:
        print(f"stopped at step {len(curve)} of {args.steps}; run again to resume")
        return 0
    log = export(args, model, curve, work, counts)
    print(
        f"exported {args.export}: {log['parameters']:,} weights, held-out "
        f"{log['held_out_bits_per_byte']} bits/byte (untrained "
        f"{log['untrained_bits_per_byte']})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
