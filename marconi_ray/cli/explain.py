"""`marconi-ray explain`: what a second prompt could reuse after a first one, and why.

Runs the cache's own code (`core.cache.pair_explain`): the first prompt, with the reply
generated after it, is committed into an empty cache of the chosen system; the second is
planned. It prints the tokens the cache holds of the second prompt (what attention alone
could reuse), the tokens a state makes reusable (what a hybrid model reuses), every state
on the path with why it was admitted, the states the second request will keep, and what
the cache's setting makes it not do for the model. No model runs: prompts are tokenized
with the model's tokenizer (text) or given as token ids (`--ids`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import marconi_ray.data
from marconi_ray.cli import values
from marconi_ray.cli.model import MODEL_HELP, load_spec
from marconi_ray.core.cache.pair_explain import PairExplanation, explain_pair
from marconi_ray.core.cache.systems import get_system
from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.traces.tokenizer import load_tokenizer

PACKAGED_CHAT = Path(marconi_ray.data.__file__).parent / "chat"
"""The packaged `chat` model's folder: the default model and tokenizer."""


def add_parser(subparsers: Any) -> None:
    """Register the `explain` subcommand."""
    p = subparsers.add_parser(
        "explain",
        help="say what a second prompt could reuse from the cache after a first, and why",
        description="Commit a first prompt (and the reply generated after it) into an "
        "empty cache, then plan a second prompt, and say what it could reuse: the tokens "
        "the cache holds (attention alone could reuse them all), those a state makes "
        "reusable (a hybrid model resumes its recurrent layers only from a state at "
        "exactly the reused depth), every state on the path and why it was admitted, and "
        "the states the second request will keep. No model runs.",
    )
    p.add_argument("first", help="the first prompt (text, or token ids with --ids)")
    p.add_argument("second", help="the second prompt (text, or token ids with --ids)")
    p.add_argument(
        "--first-output",
        default="",
        help="the reply generated after the first prompt (text, or ids with --ids); a "
        "conversation's next turn resends it (default: none)",
    )
    p.add_argument(
        "--ids",
        action="store_true",
        help="the prompts are comma-separated token ids, not text",
    )
    p.add_argument(
        "--model",
        default=str(PACKAGED_CHAT),
        help=f"{MODEL_HELP}; its folder's tokenizer reads text prompts (default: the "
        "packaged chat model)",
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer for text prompts: a tokenizer.json / SentencePiece .model, or a "
        "folder holding one (default: the model's folder, else the packaged chat model's)",
    )
    p.add_argument(
        "--system",
        type=values.system,
        default="marconi",
        help="caching system (vanilla, vllm+, vllm+refill, sglang+, marconi, marconi+, "
        "marconi+:B) (default: marconi)",
    )
    p.add_argument(
        "--cache-bytes",
        type=lambda text: values.cache_sizes(text)[0],
        default=10**9,
        help="cache budget in bytes, e.g. 2e9 (default: 1e9)",
    )
    p.add_argument("--json", action="store_true", help="print the explanation as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, _argv: Sequence[str] = ()) -> int:
    """Explain the pair; print it (text or JSON). ValueError naming a bad input."""
    spec = load_spec(args.model)
    cost, context = CostModel.from_spec(spec), spec.max_position or 1 << 20
    encode = _encoder(args)
    first, second = encode(args.first, "first"), encode(args.second, "second")
    output = encode(args.first_output, "first output") if args.first_output else None
    result = explain_pair(
        cost, get_system(args.system), args.cache_bytes, first, second, output, context
    )
    print(json.dumps(_as_dict(result), indent=2) if args.json else _text(result))
    return 0


def _encoder(args: argparse.Namespace) -> Any:
    """Prompt text -> int32 token ids (ids parsed as given with `--ids`)."""
    if args.ids:

        def ids(text: str, what: str) -> np.ndarray:
            try:
                out = [int(x) for x in text.replace(" ", "").split(",") if x]
            except ValueError:
                raise ValueError(
                    f"the {what} prompt: token ids must be integers, got {text!r}"
                ) from None
            if any(t < 0 for t in out):
                raise ValueError(f"the {what} prompt: token ids must be >= 0, got {text!r}")
            return np.asarray(out, dtype=np.int32)

        return ids
    tokenizer = load_tokenizer(_tokenizer_path(args))

    def encode(text: str, what: str) -> np.ndarray:
        return np.asarray(tokenizer.encode(text, bos=what != "first output"), dtype=np.int32)

    return encode


def _tokenizer_path(args: argparse.Namespace) -> str:
    if args.tokenizer:
        return str(args.tokenizer)
    folder = Path(args.model)
    if folder.is_file():
        folder = folder.parent
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer.model").is_file():
        return str(folder)
    return str(PACKAGED_CHAT)


def _as_dict(result: PairExplanation) -> dict[str, Any]:
    out = dataclasses.asdict(result)
    out["states"] = [{"depth": d, "reason": r} for d, r in result.states]
    out["kept"] = [{"depth": d, "reason": r} for d, r in result.kept]
    return out


def _text(r: PairExplanation) -> str:
    states = ", ".join(f"{d} ({reason})" for d, reason in r.states) or "none"
    kept = ", ".join(f"{d} ({reason})" for d, reason in r.kept) or "none"
    lines = [
        f"system {r.system}: first prompt {r.first_tokens} tokens, second {r.second_tokens}",
        f"  shared prefix:                     {r.shared_tokens} tokens",
        f"  cached (attention alone reuses):   {r.cached_tokens} tokens",
        f"  reusable (a state at its end):     {r.reusable_tokens} tokens",
        f"  states on the path (depth, why):   {states}",
        f"  states the second request keeps:   {kept}",
        f"  why: {r.why}",
    ]
    lines += [f"  note ({f.code}): {f.message}" for f in r.findings]
    return "\n".join(lines)
