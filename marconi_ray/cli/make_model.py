"""`marconi-ray make-model`: write a random-weight hybrid checkpoint from a named preset.

The folder loads with `transformers.AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` (byte-level tokenizer), offline.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from marconi_ray.engine.presets.model_presets import DTYPE_NAMES, FAMILIES, PRESETS


def add_parser(subparsers: Any) -> None:
    """Register the `make-model` subcommand."""
    p = subparsers.add_parser(
        "make-model",
        help="write a random-weight hybrid model folder from a preset",
        description="Build a seeded random-weight hybrid (Attention + Mamba-2) model from a "
        "named preset and save it with its byte-level tokenizer to --out "
        "(config.json, model.safetensors, tokenizer files, marconi.json).",
    )
    p.add_argument(
        "--preset",
        required=True,
        choices=sorted(PRESETS),
        help="model shape: tiny (~0.3M parameters, for tests), small (~48M), "
        "paper-7b-shape (the paper's 7B layer mix; needs --allow-large)",
    )
    p.add_argument(
        "--family",
        required=True,
        choices=FAMILIES,
        help="transformers model family to write (config and weight layout)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (created)")
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="random seed; the same seed gives identical weights (default: 0)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        default="float32",
        help="weight dtype (default: float32)",
    )
    p.add_argument(
        "--allow-large",
        action="store_true",
        help="allow materialising a large preset (paper-7b-shape needs ~14 GB in bfloat16)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="write into --out even if it holds files that are not a previous make-model "
        "output (a previous output is always replaced)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Build and save the model; print the folder and parameter count; 0 on success."""
    from marconi_ray.engine.presets.factory import (  # torch is slow to import
        make_model,
        read_record,
    )

    out = make_model(
        args.preset,
        args.family,
        args.out,
        seed=args.seed,
        dtype=args.dtype,
        allow_large=args.allow_large,
        overwrite=args.overwrite,
    )
    n_params = read_record(out)["num_parameters"]
    print(f"wrote {out} ({args.preset} {args.family}, {n_params:,} parameters, {args.dtype})")
    return 0
