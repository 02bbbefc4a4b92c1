"""`add_mtp_weights`: give a make-model Qwen3.5 / Qwen3-Next folder random
multi-token-prediction layers (`mtp.*`), as the released checkpoints carry trained ones
(transformers builds none: its models drop `mtp.*` when loading)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from marconi_ray.engine.model.hybrid_model import HybridModel
from marconi_ray.engine.model.loader import read_config
from marconi_ray.engine.model.model_config import HybridConfig
from marconi_ray.engine.model.mtp import MTP_PREFIX, MTPHead

MTP_CONFIG_KEY = "mtp_num_hidden_layers"
WEIGHT_STD = 0.02


def add_mtp_weights(model_dir: str | Path, layers: int = 1, seed: int = 0) -> Path:
    """Write `layers` seeded random MTP layers into the folder's single
    `model.safetensors` and set `mtp_num_hidden_layers` in its config.json (the text
    config's, for a multimodal Qwen3.5). Existing `mtp.*` weights are replaced. Returns
    the folder. ValueError naming the folder for a family without MTP layers, a
    sharded checkpoint or `layers` < 1."""
    folder = Path(model_dir)
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{str(folder)!r}: no single model.safetensors to add MTP layers to")
    cfg, raw = read_config(folder)
    if "mtp." not in cfg.skipped_weights:
        raise ValueError(f"{str(folder)!r}: {cfg.family} checkpoints have no MTP layers")
    tensors = {k: v for k, v in load_file(weights).items() if not k.startswith(MTP_PREFIX)}
    dtype = tensors[next(iter(tensors))].dtype
    tensors.update(_random_layers(replace(cfg, mtp_layers=layers), dtype, seed))
    save_file(tensors, weights, metadata={"format": "pt"})
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    assert isinstance(text, dict)
    text[MTP_CONFIG_KEY] = layers
    (folder / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    return folder


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
