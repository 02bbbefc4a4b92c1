"""HF `config.json` dict -> `HybridConfig`: the engine's view of the core's one parse.

`hybrid_config` parses with `marconi_ray.core.hf_config.parse_hf_config` (the only place
a family's config keys are interpreted; the cost model's `ModelSpec` derives from the same
`HfArchitecture`) and converts the result with `from_architecture`. The engine runs the
families in `FAMILIES` with one config per mixer kind; a config that needs something the
engine lacks (shared weights, a RoPE type other than "default", ...) is a
ValueError naming the layer and the cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, TypeVar

from marconi_ray.core.hf_arch import Block, HfArchitecture
from marconi_ray.core.hf_config import parse_hf_config
from marconi_ray.engine.model_config import (
    BLOCK_KINDS,
    AttentionConfig,
    GatedDeltaNetConfig,
    HybridConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    MoEConfig,
)

FAMILIES: Final = (
    "nemotron_h",
    "bamba",
    "jamba",
    "granitemoehybrid",
    "qwen3_5_text",
    "qwen3_5",
    "qwen3_5_moe_text",
    "qwen3_5_moe",
    "qwen3_next",
)
"""The model_types whose weights the engine can load (see `model.HF_NAMES`)."""

_C = TypeVar(
    "_C", AttentionConfig, MLPConfig, Mamba2Config, Mamba1Config, GatedDeltaNetConfig, MoEConfig
)


def _unsupported(model_type: object) -> ValueError:
    return ValueError(
        f"unsupported model_type {model_type!r}; the engine supports {sorted(FAMILIES)}"
    )


def hybrid_config(config: Mapping[str, object]) -> HybridConfig:
    """Parse a HF config dict; an unknown `model_type` is a ValueError listing the known."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise _unsupported(model_type)
    return from_architecture(parse_hf_config(config))


def _check(family: str, block: Block) -> None:
    """Raise ValueError when the engine cannot run `block`."""
    where = f"{family} layer {block.hf_layer}"
    cfg = block.config
    if block.kind not in BLOCK_KINDS or block.shared:
        raise ValueError(f"{where} has a {block.kind!r} block, which the engine lacks")
    if isinstance(cfg, AttentionConfig):
        if cfg.input_dim is not None:
            raise ValueError(f"{where}: attention over a {cfg.input_dim}-wide input")
        if cfg.rotary_dim and cfg.rope_type != "default":
            raise ValueError(f"{family} rope_type {cfg.rope_type!r} is not supported")


def _one(arch: HfArchitecture, kind: str, cls: type[_C]) -> _C | None:
    """The single config of the `kind` blocks (None when there are none)."""
    found = arch.configs_of(kind)
    if len(found) > 1:
        raise ValueError(f"{arch.family} has {len(found)} different {kind} configs")
    if not found:
        return None
    config = found[0]
    assert isinstance(config, cls)
    return config


def from_architecture(arch: HfArchitecture) -> HybridConfig:
    """The engine's view of one parse: block kinds and owning HF layers in order, one
    config per mixer kind (None for a kind the model does not use), and a context limit
    of 4096 when the config sets none."""
    if arch.family not in FAMILIES:
        raise _unsupported(arch.family)
    if arch.parallel_mixers:
        raise ValueError(f"{arch.family}: parallel mixers are not supported")
    for block in arch.blocks:
        _check(arch.family, block)
    return HybridConfig(
        family=arch.family,
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        blocks=tuple(b.kind for b in arch.blocks),
        hf_layer=tuple(b.hf_layer for b in arch.blocks),
        norm_eps=arch.norm_eps,
        attention=_one(arch, "attention", AttentionConfig),
        mlp=_one(arch, "mlp", MLPConfig),
        mamba2=_one(arch, "mamba2", Mamba2Config),
        mamba1=_one(arch, "mamba1", Mamba1Config),
        gdn=_one(arch, "gdn", GatedDeltaNetConfig),
        moe=_one(arch, "moe", MoEConfig),
        tie_embeddings=arch.tie_embeddings,
        max_position=arch.context_limit,
        eos_token_ids=arch.eos_token_ids,
        unit_offset_norms=arch.unit_offset_norms,
        weights_prefix=arch.weights_prefix,
        skipped_weights=arch.skipped_weights,
        scales=arch.scales,
    )
