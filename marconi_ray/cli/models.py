"""`marconi-ray models`: the model families the engine serves, their mixers, the kernels
behind each mixer on this machine, and whether they run tensor-parallel.

Configs only (models are built on the meta device); see `engine.presets.family_report` for how
every column is derived.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from marconi_kernels.choices import KERNEL_CHOICES

NO_KERNEL = "torch (no kernel-set op)"


def add_parser(subparsers: Any) -> None:
    """Register the `models` subcommand."""
    p = subparsers.add_parser(
        "models",
        help="list the model families the engine serves, their mixers and kernels",
        description="List the model families the engine serves (transformers model_type), "
        "each with its mixers and feed-forward blocks, the kernel-set op that runs each "
        "mixer and that op's backend on this machine (ref: pure torch; triton:marconi: "
        "ours; triton:mamba-ssm: mamba-ssm's), and whether it runs tensor-parallel. Derived "
        "from each family's reference config (the make-model tiny preset, else the "
        "transformers defaults) built on the meta device: no weights are made.",
    )
    p.add_argument(
        "--device",
        default=None,
        help="device whose kernels to show (default: cuda when available, else cpu)",
    )
    p.add_argument(
        "--kernels",
        choices=KERNEL_CHOICES,
        default="auto",
        help="kernel set, as the engine's --kernels: auto picks triton on a CUDA device "
        "where it can run, else ref",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def format_text(kernel_set: str, device: str, why: str, reports: Sequence[Any]) -> str:
    """The listing: a header naming the kernel set, then per family its reference, TP
    support and one line per block (kind, engine class, op: backend ...)."""
    head = f"kernel set: {kernel_set} on {device}" + (f" ({why})" if why else "")
    lines = [head, ""]
    every = [b for r in reports for b in (*r.mixers, *r.feed_forwards)]
    kind_w = max((len(b.kind) for b in every), default=0)
    class_w = max((len(b.engine_class) for b in every), default=0)
    for r in reports:
        if r.error:
            lines += [f"{r.family}: not servable from its reference config: {r.error}", ""]
            continue
        tp = "yes" if r.tensor_parallel else f"no ({r.tp_note})"
        lines.append(f"{r.family}  [reference: {r.reference}; tensor parallel: {tp}]")
        for role, blocks in (("mixer", r.mixers), ("feed-forward", r.feed_forwards)):
            for b in blocks:
                ops = ", ".join(f"{op}: {be}" for op, be in b.kernels.items()) or NO_KERNEL
                kind, cls = b.kind.ljust(kind_w), b.engine_class.ljust(class_w)
                lines.append(f"  {role:<12}  {kind}  {cls}  {ops}")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def run(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Print the listing (text or --json); 0 on success. An unavailable kernel set is a
    ValueError (one-line error, exit 2)."""
    import torch  # slow to import: only when the command runs

    from marconi_kernels import KernelUnavailable
    from marconi_ray.engine.presets.family_report import all_reports, kernel_choice

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        kernels, why = kernel_choice(device, args.kernels)
    except (KernelUnavailable, RuntimeError) as exc:
        raise ValueError(str(exc)) from None
    reports = all_reports(kernels)
    if args.json:
        doc = {
            "device": device,
            "kernel_set": kernels.name,
            "auto_reason": why,
            "families": [r.to_dict() for r in reports],
        }
        print(json.dumps(doc, indent=1))
    else:
        print(format_text(kernels.name, device, why, reports), end="")
    return 0
