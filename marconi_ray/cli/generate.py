"""`marconi-ray generate`: a multi-turn chat through the in-process `Engine`.

Each `--prompt` is one user turn, rendered with the model's chat template. The history is
kept as token ids (the prompt and the tokens the model actually produced), so the next
turn's prompt extends the previous sequence exactly and the prefix cache serves it; each
line reports how many prompt tokens were reused.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from marconi_kernels.choices import KERNEL_CHOICES
from marconi_ray.core.cache.systems import SYSTEMS
from marconi_ray.engine.presets.model_presets import DTYPE_NAMES


def add_parser(subparsers: Any) -> None:
    """Register the `generate` subcommand."""
    p = subparsers.add_parser(
        "generate",
        help="chat with a local hybrid model through the engine and its prefix cache",
        description="Run a multi-turn chat through the in-process engine (no Ray): each "
        "--prompt is one user turn; prints each reply with its token usage (prompt, "
        "completion, cached) and timings.",
    )
    p.add_argument(
        "--model",
        required=True,
        metavar="M",
        help="model folder (make-model output or HF checkpoint), the packaged trained model "
        "chat, a preset (tiny, small, preset:family, built on first use) or a Hugging Face "
        "id ORG/NAME[@REVISION]",
    )
    p.add_argument(
        "--prompt",
        action="append",
        required=True,
        metavar="TEXT",
        help="one user turn; repeat for a multi-turn conversation",
    )
    p.add_argument("--system-prompt", default=None, metavar="TEXT", help="optional system message")
    p.add_argument(
        "--system",
        choices=sorted(SYSTEMS),
        default="marconi",
        help="prefix-caching system (default: marconi)",
    )
    p.add_argument(
        "--cache-bytes",
        type=float,
        default=1e9,
        metavar="B",
        help="prefix cache budget in bytes, KV + SSM states (default: 1e9)",
    )
    p.add_argument(
        "--dtype", choices=DTYPE_NAMES, default="float32", help="compute dtype (default: float32)"
    )
    p.add_argument(
        "--max-tokens", type=int, default=32, metavar="N", help="tokens per reply (default: 32)"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1)")
    p.add_argument("--top-k", type=int, default=0, help="top-k sampling, 0 = off (default: 0)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    p.add_argument(
        "--kernels",
        choices=KERNEL_CHOICES,
        default="auto",
        help="kernels (SSM scans, convs, decode attention): auto (Triton on CUDA when "
        "installed, else the torch references; "
        "the log says why), ref (pure torch), triton (mamba-ssm's and our Triton kernels; "
        "CUDA, or CPU under TRITON_INTERPRET=1; fails loudly when it cannot run) "
        "(default: auto)",
    )
    p.add_argument(
        "--device", default="cpu", metavar="DEV", help="torch device, e.g. cuda:0 (default: cpu)"
    )
    p.add_argument(
        "--speculative",
        default=None,
        metavar="METHOD",
        help="speculative decoding: ngram drafts the tokens that followed the latest earlier "
        "occurrence of the last 2-4 tokens (prompt lookup); mtp drafts with the "
        "checkpoint's own multi-token-prediction layers (Qwen3.5 / Qwen3-Next mtp.*); "
        "draft:MODEL has a small model with the same tokenizer draft its greedy "
        "continuation (MODEL as --model takes it, "
        "e.g. draft:chat); drafts are verified k + 1 positions in one forward and greedy "
        "output is unchanged (default: off)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=4,
        metavar="K",
        help="with --speculative: tokens drafted per step at most, 1-16 (default: 4)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object per turn: reply, token ids, usage (prompt, completion, "
        "cached tokens), timings, the backend each kernel op used and, with --speculative, "
        "spec: the tokens drafted and kept",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Load the engine, play the turns, print each reply."""
    import torch

    from marconi_kernels import KernelUnavailable
    from marconi_ray.engine.draft_model import drafter_for
    from marconi_ray.engine.engine import Engine
    from marconi_ray.engine.model.loader import read_config
    from marconi_ray.protocol.sampling import SamplingParams
    from marconi_ray.protocol.speculative import SpeculativeConfig
    from marconi_ray.serve.model_source import resolve_drafter, resolve_model

    torch.set_num_threads(1)
    model_dir = resolve_model(args.model)
    speculative, drafter = None, None
    if args.speculative is not None:
        method = resolve_drafter(args.speculative)
        speculative = SpeculativeConfig(method, args.num_speculative_tokens)
        drafter = drafter_for(speculative, read_config(model_dir)[0].vocab_size)
    try:
        engine = Engine(
            model_dir,
            system=args.system,
            cache_bytes=int(args.cache_bytes),
            dtype=args.dtype,
            device=args.device,
            kernels=args.kernels,
            speculative=speculative,
            drafter=drafter,
        )
    except KernelUnavailable as exc:  # a usage error here: the CLI reports it in one line
        raise ValueError(str(exc)) from exc
    tok = engine.tokenizer
    end_ids = [i for i in (tok.convert_tokens_to_ids("<|end|>"),) if isinstance(i, int) and i >= 0]
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop_token_ids=tuple(end_ids),
    )
    history: list[int] = []
    for turn, text in enumerate(args.prompt, start=1):
        messages = [{"role": "user", "content": text}]
        if turn == 1 and args.system_prompt:
            messages.insert(0, {"role": "system", "content": args.system_prompt})
        ids = _template_ids(tok, messages)
        if history and ids and ids[0] == tok.bos_token_id:
            ids = ids[1:]
        prompt = history + ids
        result = engine.generate(prompt, params)
        reply = tok.decode(list(result.tokens), skip_special_tokens=True)
        history = prompt + list(result.tokens)
        if result.finish_reason != "stop":
            history += end_ids
        record = {
            "turn": turn,
            "reply": reply,
            "token_ids": list(result.tokens),
            "finish_reason": result.finish_reason,
            "prompt_tokens": result.usage.prompt_tokens,
            "completion_tokens": result.usage.completion_tokens,
            "cached_tokens": result.usage.cached_tokens,
            "ttft_ms": round(1e3 * result.timings.ttft, 2),
            "total_ms": round(1e3 * result.timings.total, 2),
            "kernels": engine.model.kernels.name,
            "backends": dict(engine.model.kernels.backends),
        }
        if speculative is not None:
            record["spec"] = {"drafted": result.spec.drafted, "accepted": result.spec.accepted}
        if args.json:
            sys.stdout.write(json.dumps(record) + "\n")
        else:
            sys.stdout.write(
                f"[turn {turn}] prompt {result.usage.prompt_tokens} tokens "
                f"({result.usage.cached_tokens} cached), {result.usage.completion_tokens} "
                f"generated, TTFT {record['ttft_ms']} ms\n  {reply!r}\n"
            )
    stats = engine.cache.stats
    (sys.stderr if args.json else sys.stdout).write(
        f"token hit rate {100 * stats.token_hit_rate:.1f}%, cache holds "
        f"{engine.cache.bytes_used:,} of {engine.cache.capacity:,} bytes\n"
    )
    return 0


def _template_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of `messages` rendered with the chat template and a generation prompt."""
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):
        ids = list(ids["input_ids"])
    return [int(i) for i in ids]
