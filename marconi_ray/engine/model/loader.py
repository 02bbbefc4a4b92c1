"""Load a Hugging Face checkpoint directory (`config.json` + safetensors, one file or
sharded with `model.safetensors.index.json`) into a `HybridModel` rank: parse the config,
build the shard, copy each weight's slice. A rank reads only its own slice of each split
weight (see `engine.model.weight_source`), never the whole tensor.

Errors name the file and the key: an unknown architecture, a missing or mis-shaped weight,
or a checkpoint weight the model has no place for. Weights the config marks as not the
language model's (a multimodal checkpoint's vision tower) are skipped, with a log line,
and so are repeats of tied weights (a Zamba2 checkpoint may store its shared block again
under every hybrid layer; the copy under the first layer using it is the one loaded).
The multipliers of muP models (`WeightSpec.scales`) are folded into the rank's slice of
each weight as it is copied.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from marconi_kernels import KernelSet
from marconi_ray.engine.model.from_hf import hybrid_config
from marconi_ray.engine.model.hybrid_model import HF_NAMES, HybridModel
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import HybridConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup, rank_ranges
from marconi_ray.engine.model.weight_source import SafetensorsSource, StateDictSource, WeightSource
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


def _prefix(where: Mapping[str, str], anchor: str, preferred: str = "") -> str:
    tried = ([preferred] if preferred else []) + list(_PREFIXES)
    for p in tried:
        if p + anchor in where:
            return p
    files = sorted(set(where.values()))
    raise ValueError(f"{files}: missing weight {anchor!r} (tried prefixes {tried})")


def _fold(
    spec: WeightSpec, tensor: torch.Tensor, ranges: Sequence[tuple[int, int]] = ()
) -> torch.Tensor:
    """`tensor` times `spec.scales` (whole, or per segment along `spec.dim`), computed in
    float32 (muP multipliers folded into the weights); `tensor` itself when unscaled.
    `tensor` holds the rows `ranges` of the checkpoint weight along `spec.dim` (all of
    them when empty)."""
    if not spec.scales:
        return tensor
    if len(spec.scales) == 1:
        return tensor.float() * spec.scales[0]
    assert spec.dim is not None
    sizes = [s.size for s in spec.segments]
    per_row = torch.repeat_interleave(torch.tensor(spec.scales), torch.tensor(sizes))
    if ranges:
        per_row = torch.cat([per_row[a:b] for a, b in ranges])
    if per_row.numel() != tensor.shape[spec.dim]:
        raise ValueError(
            f"weight {spec.key!r} of shape {tuple(tensor.shape)}: its multipliers cover "
            f"{per_row.numel()} rows of dim {spec.dim}"
        )
    shape = [1] * tensor.ndim
    shape[spec.dim] = -1
    return tensor.float() * per_row.view(shape)


def _load_tensor(
    model: HybridModel, spec: WeightSpec, key: str, source: WeightSource
) -> torch.Tensor:
    """Checkpoint tensor `key`, only this rank's slice when `spec` splits it, with its
    multipliers folded in."""
    if key not in source.where:
        files = sorted(set(source.where.values()))
        raise ValueError(f"{files}: missing weight {key!r}")
    if spec.dim is None:
        return _fold(spec, source.read(key))
    shape = source.shape(key)
    size = shape[spec.dim] if spec.dim < len(shape) else 0
    segments = spec.segments or (Segment(size),)
    try:
        ranges = rank_ranges(size, segments, model.tp)
    except ValueError as exc:
        raise ValueError(
            f"{source.where[key]}: weight {key!r} of shape {shape}: dim {spec.dim}: {exc}"
        ) from None
    return _fold(spec, source.read(key, spec.dim, ranges), ranges)


def _joined_slice(
    model: HybridModel, spec: WeightSpec, keys: Sequence[str], source: WeightSource
) -> torch.Tensor:
    """This rank's slice (by `spec.segments`) of the concatenation of the checkpoint
    tensors `keys` along `spec.dim` (`spec.parts`: small tensors, read whole)."""
    missing = [k for k in keys if k not in source.where]
    if missing:
        raise ValueError(f"{sorted(set(source.where.values()))}: missing weight {missing[0]!r}")
    assert spec.dim is not None
    whole = torch.cat([source.read(k) for k in keys], dim=spec.dim)
    size = whole.shape[spec.dim]
    try:
        ranges = rank_ranges(size, spec.segments or (Segment(size),), model.tp)
    except ValueError as exc:
        raise ValueError(
            f"{source.where[keys[0]]}: weights {list(keys)} joined to {tuple(whole.shape)}: "
            f"dim {spec.dim}: {exc}"
        ) from None
    return torch.cat([whole.narrow(spec.dim, a, b - a) for a, b in ranges], dim=spec.dim)


def copy_param(
    model: HybridModel,
    target: torch.Tensor,
    name: str,
    spec: WeightSpec,
    keys: Sequence[str],
    source: WeightSource,
    owner: str = "the model",
) -> None:
    """Copy parameter `name` (`target`, of `owner`) from the checkpoint tensors `keys`
    (stacked when `spec.stack`, concatenated along `spec.dim` when `spec.parts`), this
    rank's slice of each. ValueError naming the file, the key and both shapes when they
    differ."""
    if spec.parts:
        tensor = _joined_slice(model, spec, keys, source)
    else:
        parts = [_load_tensor(model, spec, key, source) for key in keys]
        tensor = torch.stack(parts) if spec.stack else parts[0]
    if tensor.shape != target.shape:
        shown = keys[0] if len(keys) == 1 else f"{keys[0]} .. {keys[-1]}"
        raise ValueError(
            f"{source.where[keys[0]]}: weight {shown!r} has shape {tuple(tensor.shape)} after "
            f"sharding, {owner} expects {tuple(target.shape)} for {name}"
        )
    with torch.no_grad():
        target.copy_(tensor)


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

    On CPU the linear layers' weights are then stored column-major
    (`HybridModel.use_column_major`).
    """
    cfg, _ = read_config(model_dir)
    model = HybridModel(cfg, tp, dtype, device, kernels)
    source = SafetensorsSource(model_dir) if weights is None else StateDictSource(weights)
    copy_weights(model, source, model_dir)
    if model.device.type == "cpu":
        model.use_column_major()
    return model.eval()


def load_weights(model: HybridModel, model_dir: str | Path) -> int:
    """Copy every local parameter's slice from the checkpoint in `model_dir` (one
    safetensors file or a sharded set with `model.safetensors.index.json`), reading only
    this rank's slice of each split weight; returns the bytes read (see `copy_weights`)."""
    return copy_weights(model, SafetensorsSource(model_dir), model_dir)


def copy_weights(model: HybridModel, source: WeightSource, model_dir: str | Path) -> int:
    """Copy each local parameter's slice from `source` into `model`; returns the bytes
    `source` read: this rank's slice of every split weight plus every replicated one, in
    the checkpoint's dtype (each parameter then converts once to its own dtype).
    ValueError naming the origin and the key of a missing or mis-shaped weight, or of a
    checkpoint weight that no parameter uses."""
    where = source.where
    start = source.bytes_read
    specs = model.weight_specs()
    prefix = _prefix(where, specs["embed"].key, model.cfg.weights_prefix)
    params = dict(model.named_parameters(remove_duplicate=False))
    names = HF_NAMES[model.cfg.family]
    used: set[str] = set()
    for name, spec in specs.items():
        keys = [k if k == "lm_head.weight" else prefix + k for k in spec.checkpoint_keys()]
        keys = [names.present(k, where) for k in keys]
        copy_param(model, params[name], name, spec, keys, source)
        used.update(keys)
    skipped = {k for k in where if k.startswith(model.cfg.skipped_weights)}
    if skipped:
        log.info(
            "%s: skipped %d weights the language model does not use (%s)",
            model_dir,
            len(skipped),
            ", ".join(f"{p}*" for p in model.cfg.skipped_weights),
        )
    tied = tuple(prefix + p for p in model.tied_repeats())
    extra = sorted(
        k
        for k in where
        if k not in used
        and not k.endswith(_IGNORED_SUFFIXES)
        and k not in skipped
        and not k.startswith(tied)
    )
    if extra:
        raise ValueError(
            f"{str(model_dir)!r}: checkpoint has weights the {model.cfg.family} engine model "
            f"does not use: {extra[:5]}{' ...' if len(extra) > 5 else ''}"
        )
    read = source.bytes_read - start
    log.debug("%s: rank %d read %d bytes of weights", model_dir, model.tp.rank, read)
    return read
