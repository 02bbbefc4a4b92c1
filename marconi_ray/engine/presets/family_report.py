"""What the engine serves, per model family: its mixers, the kernels behind each, and
whether it runs tensor-parallel. Configs only: models are built on the meta device.

Everything is derived, so a family added to `model.from_hf.FAMILIES` shows up on its own:

- a family's reference config is the make-model `tiny` preset built as that family
  (`family_configs.preset_config`) when make-model can build it, else the transformers
  config class's defaults (`AutoConfig.for_model`);
- its block kinds are those of `model.from_hf.hybrid_config(reference)` in first-use order,
  split into mixers and feed-forwards (`model_config.FEED_FORWARD_KINDS`), each with the
  engine class that runs it (from a `HybridModel` of the reference built on the meta
  device);
- the kernel-set ops of a mixer are those its class declares (`KERNEL_OPS`, checked
  against the ops a real prefill and decode call in `tests/engine/test_engine_triton.py`),
  and their backends those of the set the engine would pick (`get_kernels(device, prefer)`);
- tensor parallelism is supported when the reference builds as rank 0 of 2 ranks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch

from marconi_kernels import OPS, KernelSet, get_kernels, triton_unavailable
from marconi_ray.engine.model.from_hf import FAMILIES, hybrid_config
from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.model_config import FEED_FORWARD_KINDS, HybridConfig
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.presets import model_presets
from marconi_ray.engine.presets.family_configs import preset_config

REFERENCE_PRESET: Final = "tiny"
TP_PROBE_WORLD: Final = 2


@dataclass(frozen=True)
class BlockReport:
    """One block kind of a family: `kind` (a `model_config.BLOCK_KINDS` value), the engine
    class that runs it, and per kernel-set op it calls, that op's backend (empty for a
    block that calls no kernel-set op, e.g. attention runs torch's SDPA)."""

    kind: str
    engine_class: str
    kernels: Mapping[str, str]


@dataclass(frozen=True)
class FamilyReport:
    """One family the engine serves.

    Attributes:
        family: the transformers model_type.
        reference: where its reference config comes from ("make-model tiny preset" or
            "transformers defaults").
        mixers / feed_forwards: its block kinds in first-use order.
        tensor_parallel: whether the reference builds as rank 0 of `TP_PROBE_WORLD`.
        tp_note: why not (empty when it does).
        error: set when the reference config could not be parsed or built (the other
            fields are then empty).
    """

    family: str
    reference: str
    mixers: tuple[BlockReport, ...]
    feed_forwards: tuple[BlockReport, ...]
    tensor_parallel: bool
    tp_note: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view."""

        def blocks(items: tuple[BlockReport, ...]) -> list[dict[str, Any]]:
            return [
                {"kind": b.kind, "engine_class": b.engine_class, "kernels": dict(b.kernels)}
                for b in items
            ]

        return {
            "family": self.family,
            "reference": self.reference,
            "mixers": blocks(self.mixers),
            "feed_forwards": blocks(self.feed_forwards),
            "tensor_parallel": self.tensor_parallel,
            "tp_note": self.tp_note,
            "error": self.error,
        }


def reference_config(family: str) -> tuple[dict[str, Any], str]:
    """(config dict, where it comes from) of `family`; see the module docstring."""
    if family in model_presets.FAMILIES:
        config = preset_config(REFERENCE_PRESET, family).to_dict()
        return config, f"make-model {REFERENCE_PRESET} preset"
    import transformers

    return transformers.AutoConfig.for_model(family).to_dict(), "transformers defaults"


def kernel_ops(cls: type) -> tuple[str, ...]:
    """The kernel-set ops mixer class `cls` declares (`KERNEL_OPS`; none for a class
    without), in `OPS` order."""
    declared = set(getattr(cls, "KERNEL_OPS", ()))
    return tuple(op for op in OPS if op in declared)


def _blocks(model: HybridModel, kinds: list[str], kernels: KernelSet) -> list[BlockReport]:
    out = []
    for kind in kinds:
        mixer = next(b.mixer for b in model.layers if b.kind == kind)
        ops = kernel_ops(type(mixer))
        out.append(
            BlockReport(kind, type(mixer).__name__, {op: kernels.backends[op] for op in ops})
        )
    return out


def family_report(family: str, kernels: KernelSet) -> FamilyReport:
    """The report of one family with the kernel set `kernels`; a reference config the
    engine cannot parse or build gives a report with `error` set instead of raising."""
    try:
        config, reference = reference_config(family)
        cfg: HybridConfig = hybrid_config(config)
        model = HybridModel(cfg, device="meta", kernels=kernels)
    except (ValueError, KeyError) as exc:
        return FamilyReport(family, "", (), (), False, error=str(exc))
    kinds = list(dict.fromkeys(cfg.blocks))
    mixers = [k for k in kinds if k not in FEED_FORWARD_KINDS]
    ffns = [k for k in kinds if k in FEED_FORWARD_KINDS]
    try:
        HybridModel(cfg, TPGroup(0, TP_PROBE_WORLD), device="meta", kernels=kernels)
        tp, note = True, ""
    except ValueError as exc:
        tp, note = False, str(exc)
    return FamilyReport(
        family,
        reference,
        tuple(_blocks(model, mixers, kernels)),
        tuple(_blocks(model, ffns, kernels)),
        tp,
        note,
    )


def kernel_choice(device: str, prefer: str) -> tuple[KernelSet, str]:
    """The kernel set the engine would use on `device` with `prefer` (as `get_kernels`),
    and a one-line reason when "auto" did not pick triton (empty otherwise)."""
    kernels = get_kernels(device, prefer)
    why = ""
    if prefer == "auto" and kernels.name != "triton":
        dev = torch.device(device)
        why = "not a CUDA device" if dev.type != "cuda" else (triton_unavailable(dev) or "")
    return kernels, why


def all_reports(kernels: KernelSet) -> list[FamilyReport]:
    """One report per family in `model.from_hf.FAMILIES`, in that order."""
    return [family_report(f, kernels) for f in FAMILIES]
