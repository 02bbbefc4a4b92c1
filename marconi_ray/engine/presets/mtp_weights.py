"""`add_mtp_weights`: give a make-model Qwen3.5 / Qwen3-Next / NemotronH folder random
multi-token-prediction layers (`mtp.*`), as the released checkpoints carry trained ones
(transformers builds none: its models drop `mtp.*` when loading)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.loader import read_config
from marconi_ray.engine.model.model_config import HybridConfig
from marconi_ray.engine.model.mtp import MTP_KEYS, MTP_PREFIX, MTPHead

STEPS_KEY = {"nemotron_h": "num_nextn_predict_layers"}
"""Family -> its config key of MTP steps (default `mtp_num_hidden_layers`)."""
NEMOTRON_H_KINDS_KEY = "mtp_layers_block_type"
WEIGHT_STD = 0.02


def add_mtp_weights(model_dir: str | Path, layers: int = 1, seed: int = 0) -> Path:
    """Write `layers` seeded random MTP steps into the folder's single
    `model.safetensors` and name them in its config.json (`mtp_num_hidden_layers`, the
    text config's for a multimodal Qwen3.5; NemotronH's `num_nextn_predict_layers` and
    `mtp_layers_block_type`: attention then MoE, or then an MLP in a model without
    experts). Existing `mtp.*` weights are replaced. Returns the folder. ValueError
    naming the folder for a family without MTP layers, a sharded checkpoint or
    `layers` < 1."""
    folder = Path(model_dir)
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{str(folder)!r}: no single model.safetensors to add MTP layers to")
    cfg, raw = read_config(folder)
    if cfg.family not in MTP_KEYS:
        raise ValueError(f"{str(folder)!r}: {cfg.family} checkpoints have no MTP layers")
    ffn = "moe" if cfg.moe is not None else "mlp"
    with_mtp = replace(cfg, mtp_layers=layers, mtp_blocks=("attention", ffn))
    write_mtp_tensors(folder, lambda dtype: _random_layers(with_mtp, dtype, seed))
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    assert isinstance(text, dict)
    text[STEPS_KEY.get(cfg.family, "mtp_num_hidden_layers")] = layers
    if cfg.family == "nemotron_h":
        text[NEMOTRON_H_KINDS_KEY] = ["full_attention", ffn]
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return folder


def write_mtp_tensors(folder: Path, make: Callable[[torch.dtype], dict[str, torch.Tensor]]) -> None:
    """Replace the `mtp.*` tensors of `folder`'s single `model.safetensors` with
    `make(dtype)` (checkpoint key -> tensor), dtype the checkpoint's; the rest is kept."""
    path = folder / "model.safetensors"
    tensors = {k: v for k, v in load_file(path).items() if not k.startswith(MTP_PREFIX)}
    dtype = tensors[next(iter(tensors))].dtype
    tensors.update({k: v.to(dtype) for k, v in make(dtype).items()})
    save_file(tensors, path, metadata={"format": "pt"})


def _random_layers(cfg: HybridConfig, dtype: torch.dtype, seed: int) -> dict[str, torch.Tensor]:
    """Checkpoint key -> a seeded random tensor of the checkpoint's shape (an unsharded
    head's parameter shapes; a stacked parameter is one key per leading row). Norm
    weights are small around 0 (Qwen's norms scale by 1 + w); the rest N(0, 0.02)."""
    with torch.device("meta"):
        head = MTPHead(HybridModel(cfg, dtype=dtype, device="meta"))
    params = dict(head.named_parameters())
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, spec in sorted(head.weight_specs().items()):
        shape = params[name].shape
        keys = list(spec.checkpoint_keys())
        one = shape[1:] if spec.stack else shape
        for key in keys:
            out[key] = (torch.randn(one, generator=gen) * WEIGHT_STD).to(dtype)
    return out
