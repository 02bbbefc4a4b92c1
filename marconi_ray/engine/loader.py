"""Load a Hugging Face checkpoint directory (`config.json` + safetensors) into a
`HybridModel` rank: parse the config, build the shard, copy each weight's slice.

Errors name the file and the key: an unknown architecture, a missing or mis-shaped weight,
or a checkpoint weight the model has no place for. Weights the config marks as not the
language model's (a multimodal checkpoint's vision tower) are skipped, with a log line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch
from safetensors import safe_open

from marconi_kernels import KernelSet
from marconi_ray.engine.hf_families import hybrid_config
from marconi_ray.engine.layers.weights import WeightSpec
from marconi_ray.engine.model import HybridModel
from marconi_ray.engine.model_config import HybridConfig
from marconi_ray.engine.parallel import Segment, TPGroup, shard_index
from marconi_ray.protocol.model_files import read_config_json

log = logging.getLogger(__name__)

_PREFIXES = ("model.", "backbone.", "")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_config(model_dir: str | Path) -> tuple[HybridConfig, dict[str, object]]:
    """Parse `model_dir/config.json`; returns the engine config and the raw dict."""
    raw = read_config_json(model_dir)
    try:
        return hybrid_config(raw), raw
    except ValueError as exc:
        raise ValueError(f"{Path(model_dir) / 'config.json'}: {exc}") from None


def _weight_files(model_dir: Path) -> list[Path]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / n for n in names]
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {str(model_dir)!r}")
    return files


def _key_index(files: list[Path]) -> dict[str, Path]:
    where: dict[str, Path] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as handle:
            for key in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                where[key] = f
    return where


class _Sliceable(Protocol):
    """A checkpoint tensor, or a lazy view of one that reads only the rows indexed."""

    @property
    def shape(self) -> Sequence[int]: ...

    def __getitem__(self, index: tuple[slice, ...]) -> torch.Tensor: ...


class _FileEntry:
    """A safetensors entry: indexing it reads only the slices asked for, so a rank reads
    its shard of a weight (its experts' rows of a fused 3-D tensor), not the whole."""

    def __init__(self, handle: Any, key: str) -> None:
        self._slice = handle.get_slice(key)
        self.shape: Sequence[int] = tuple(self._slice.get_shape())

    def __getitem__(self, index: tuple[slice, ...]) -> torch.Tensor:
        tensor: torch.Tensor = self._slice[index]
        return tensor


def _prefix(where: Mapping[str, str], anchor: str, preferred: str = "") -> str:
    tried = ([preferred] if preferred else []) + list(_PREFIXES)
    for p in tried:
        if p + anchor in where:
            return p
    files = sorted(set(where.values()))
    raise ValueError(f"{files}: missing weight {anchor!r} (tried prefixes {tried})")


def _load_tensor(
    model: HybridModel,
    spec: WeightSpec,
    key: str,
    where: Mapping[str, str],
    get: Callable[[str], _Sliceable],
) -> torch.Tensor:
    """Checkpoint tensor `key`, this rank's slice when `spec` splits it (only that slice
    is read from a file)."""
    if key not in where:
        files = sorted(set(where.values()))
        raise ValueError(f"{files}: missing weight {key!r}")
    source = get(key)
    if spec.dim is None:
        return source[tuple(slice(None) for _ in source.shape)]
    segments = spec.segments or (Segment(source.shape[spec.dim]),)
    try:
        index = shard_index(source.shape, spec.dim, segments, model.tp)
    except ValueError as exc:
        raise ValueError(
            f"{where[key]}: weight {key!r} of shape {tuple(source.shape)}: {exc}"
        ) from None
    parts = [source[i] for i in index]
    return torch.cat(parts, dim=spec.dim) if len(parts) > 1 else parts[0]


def load_model(
    model_dir: str | Path,
    tp: TPGroup | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    kernels: KernelSet | None = None,
    weights: Mapping[str, torch.Tensor] | None = None,
) -> HybridModel:
    """Build this rank's `HybridModel` from `model_dir` and load its weight shards.

    weights: checkpoint tensors by key (e.g. a transformers model's `state_dict()`, on any
    device) to load instead of the folder's safetensors; `model_dir` then only needs its
    config.json. Used to compare with transformers on the same weights without writing
    them to disk. They must be in the checkpoint layout: transformers 5 holds some
    families' experts fused in memory (Jamba's, NemotronH's and Granite's
    `experts.gate_up_proj`, ...) and converts them when saving, so pass
    `transformers.core_model_loading.revert_weight_conversion(model, model.state_dict())`
    for those.
    """
    cfg, _ = read_config(model_dir)
    model = HybridModel(cfg, tp, dtype, device, kernels)
    if weights is None:
        load_weights(model, model_dir)
    else:
        _copy_weights(model, dict.fromkeys(weights, "state dict"), weights.__getitem__, model_dir)
    return model.eval()


def load_weights(model: HybridModel, model_dir: str | Path) -> None:
    """Copy every local parameter's slice from the checkpoint in `model_dir`."""
    files = _weight_files(Path(model_dir))
    where = {k: str(f) for k, f in _key_index(files).items()}
    handles = {str(f): safe_open(str(f), framework="pt", device="cpu") for f in files}

    def get(key: str) -> _Sliceable:
        return _FileEntry(handles[where[key]], key)

    _copy_weights(model, where, get, model_dir)


def _copy_weights(
    model: HybridModel,
    where: Mapping[str, str],
    get: Callable[[str], _Sliceable],
    model_dir: str | Path,
) -> None:
    """Copy each local parameter's slice of tensor `get(key)`; `where[key]` names its
    origin (a file) for error messages. Every checkpoint key must be used."""
    specs = model.weight_specs()
    prefix = _prefix(where, specs["embed"].key, model.cfg.weights_prefix)
    params = dict(model.named_parameters(remove_duplicate=False))
    used: set[str] = set()
    for name, spec in specs.items():
        keys = [k if k == "lm_head.weight" else prefix + k for k in spec.checkpoint_keys()]
        parts = [_load_tensor(model, spec, key, where, get) for key in keys]
        tensor = torch.stack(parts) if spec.stack else parts[0]
        target = params[name]
        if tensor.shape != target.shape:
            shown = keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]}"
            raise ValueError(
                f"{where[keys[0]]}: weight {shown!r} has shape {tuple(tensor.shape)} after "
                f"sharding, the model expects {tuple(target.shape)} for {name}"
            )
        with torch.no_grad():
            target.copy_(tensor.to(target.dtype))
        used.update(keys)
    skipped = {k for k in where if k.startswith(model.cfg.skipped_weights)}
    if skipped:
        log.info(
            "%s: skipped %d weights the language model does not use (%s)",
            model_dir,
            len(skipped),
            ", ".join(f"{p}*" for p in model.cfg.skipped_weights),
        )
    extra = sorted(
        k
        for k in where
        if k not in used and not k.endswith(_IGNORED_SUFFIXES) and k not in skipped
    )
    if extra:
        raise ValueError(
            f"{str(model_dir)!r}: checkpoint has weights the {model.cfg.family} engine model "
            f"does not use: {extra[:5]}{' ...' if len(extra) > 5 else ''}"
        )
