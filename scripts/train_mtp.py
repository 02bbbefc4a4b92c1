"""Train multi-token-prediction layers for a served model (by default the packaged `chat`
model), so `--speculative mtp` drafts with trained layers rather than random ones.

The target model stays frozen. Its folder is copied to --out with random MTP layers
added (`add_mtp_weights`: attention then the model's MLP or MoE, the layout the engine
loads); then, on random windows of the ShareGPT training conversations (the chat
model's own split and tokenizer), the layers learn to predict x_{j+2} from the target's
final normed hidden state at j and the token x_{j+1} (`engine.model.mtp`: entry j),
with AdamW and cross-entropy through the target's frozen LM head. The engine's own
modules run the forward (the attention's causal prefill over each window), so the
layers trained are exactly the ones the drafter runs. The weights are written back into
--out's `model.safetensors`; `train_mtp.json` there has the settings and the loss curve.

Needs the shared data folder (ShareGPT). Example:
    python scripts/train_mtp.py --out build/chat-mtp --steps 400
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chat_corpus import read_sharegpt, render, split

from marconi_ray.engine.model.loader import load_model
from marconi_ray.engine.model.mtp import MTPHead, load_mtp
from marconi_ray.engine.presets.mtp_weights import add_mtp_weights, write_mtp_tensors
from marconi_ray.protocol.model_files import load_tokenizer
from marconi_ray.serve.model_source import resolve_model
from marconi_ray.traces.paths import default_data_dir


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="chat", help="the target model (as --model takes it)")
    p.add_argument("--out", required=True, help="folder to write (the model with MTP layers)")
    p.add_argument("--steps", type=int, default=400, help="optimizer steps")
    p.add_argument("--batch", type=int, default=8, help="windows per step")
    p.add_argument("--seq-len", type=int, default=256, help="tokens per window")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (cosine decay)")
    p.add_argument("--conversations", type=int, default=1500, help="training conversations")
    p.add_argument("--seed", type=int, default=0, help="seed of the init and the windows")
    p.add_argument("--minutes", type=float, default=0.0, help="stop after this long (0: no cap)")
    return p.parse_args(argv)


def token_stream(model_dir: Path, n: int) -> np.ndarray:
    """The first `n` training conversations (the chat model's split), rendered with the
    chat template and encoded one after another."""
    train, _ = split(read_sharegpt(default_data_dir() / "sharegpt"))
    tokenizer = load_tokenizer(model_dir)
    ids: list[int] = []
    for conv in tqdm(train[:n], desc="tokenizing", unit="conv"):
        ids.extend(tokenizer.encode(render(conv.messages), add_special_tokens=False))
    return np.asarray(ids, dtype=np.int64)


def window_loss(head: MTPHead, window: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the layers' predictions over one window [L + 1]: the target
    consumes window[:L]; entry j = (window[j + 1], h_j) predicts window[j + 2]."""
    model = head.target
    with torch.inference_mode():
        x, _, _ = model._prefill_hidden(window[:-1], model.new_state(), [])
        hidden = model.normed(x)
    hidden = hidden.clone()  # a normal tensor, usable by autograd
    n = window.shape[0] - 2
    ids, positions = window[1 : n + 1], torch.arange(n)
    kv = head.new_kv()
    z = head._inputs(ids, hidden[:n])
    logits, _ = head._run(z, lambda attn, h, k: attn.prefill(h, positions, kv[k]))
    return F.cross_entropy(logits, window[2 : n + 2])


def save_head(head: MTPHead, folder: Path) -> None:
    """Write the head's weights (as the checkpoint names them) into `folder`'s
    `model.safetensors`, replacing its `mtp.*` tensors."""
    params = dict(head.named_parameters())
    weights = {
        spec.key: params[name].detach().contiguous() for name, spec in head.weight_specs().items()
    }
    write_mtp_tensors(folder, lambda _dtype: weights)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    source = resolve_model(args.model)
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out)
    add_mtp_weights(out, seed=args.seed)
    model = load_model(out)
    head = load_mtp(model, out)
    for p in head.parameters():
        p.requires_grad_(True)
    stream = torch.as_tensor(token_stream(out, args.conversations))
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.steps)
    gen = torch.Generator().manual_seed(args.seed)
    curve: list[tuple[int, float]] = []
    t0 = time.perf_counter()
    for step in tqdm(range(1, args.steps + 1), desc="training MTP", unit="step"):
        starts = torch.randint(0, len(stream) - args.seq_len - 2, (args.batch,), generator=gen)
        loss = torch.stack(
            [window_loss(head, stream[s : s + args.seq_len + 1]) for s in starts.tolist()]
        ).mean()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        sched.step()
        curve.append((step, round(loss.item(), 4)))
        if args.minutes and time.perf_counter() - t0 > args.minutes * 60:
            break
    save_head(head, out)
    log = {"settings": vars(args), "target": str(source), "curve": curve}
    (out / "train_mtp.json").write_text(json.dumps(log) + "\n")
    print(f"{out}: {len(curve)} steps, loss {curve[0][1]} -> {curve[-1][1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
