"""`--model`: a preset name or a Hugging Face config.json, resolved to a cost model."""

from __future__ import annotations

import json
from pathlib import Path

from marconi_ray.core.model.cost_model import CostModel
from marconi_ray.core.model.hf.parse import spec_from_hf_config
from marconi_ray.core.model.model_spec import ModelSpec
from marconi_ray.core.model.presets import PRESETS, get_preset

MODEL_HELP = (
    f"model whose FLOPs and state sizes drive the cache: a preset ({', '.join(PRESETS)}) "
    "or a Hugging Face config.json of a hybrid model (file or folder holding it)"
)


def load_spec(model: str) -> ModelSpec:
    """The ModelSpec named by `model`; ValueError / FileNotFoundError naming it otherwise."""
    if model in PRESETS:
        return get_preset(model)
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        if model.endswith(".json") or "/" in model:
            raise FileNotFoundError(f"model config not found: {path}")
        raise ValueError(
            f"unknown model {model!r}; use a preset ({', '.join(PRESETS)}) or a config.json"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}") from None
    try:
        return spec_from_hf_config(config, name=path.parent.name or None)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def load_cost_model(model: str) -> tuple[str, CostModel]:
    """(model name, its cost model)."""
    spec = load_spec(model)
    return spec.name, CostModel.from_spec(spec)
