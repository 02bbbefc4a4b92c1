"""HF `config.json` dict -> `HybridConfig`: the engine's view of the core's one parse.

`hybrid_config` parses with `marconi_ray.core.model.hf.parse.parse_hf_config` (the only place
a family's config keys are interpreted; the cost model's `ModelSpec` derives from the same
`HfArchitecture`) and converts the result with `from_architecture`. The engine runs the
families in `FAMILIES` with one config per mixer kind; a config that needs something the
engine lacks (a mixture of experts, a RoPE type other than "default", ...) is a
ValueError naming the layer and the cause. Zamba2's shared-block group of one hybrid
layer (the core lists its attention, adapters, MLP and linear as separate blocks, for
the cost model) becomes one `shared_transformer` block (`SharedBlockConfig`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, TypeVar

from marconi_ray.core.model.hf.arch import Block, HfArchitecture, LinearConfig
from marconi_ray.core.model.hf.parse import parse_hf_config
from marconi_ray.engine.model.model_config import (
    BLOCK_KINDS,
    AttentionConfig,
    GatedDeltaNetConfig,
    HybridConfig,
    KDAConfig,
    LightningConfig,
    Mamba1Config,
    Mamba2Config,
    MLAConfig,
    MLPConfig,
    MLSTMConfig,
    MoEConfig,
    RGLRUConfig,
    SharedBlockConfig,
    ShortConvConfig,
    SlidingAttentionConfig,
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
    "falcon_h1",
    "zamba2",
    "lfm2",
    "lfm2_moe",
    "mamba",
    "falcon_mamba",
    "mamba2",
    "olmo_hybrid",
    "recurrent_gemma",
    "kimi_linear",
    "minimax",
    "bailing_hybrid",
    "lfm3",
    "lfm3_vl",
    "xlstm",
)
"""The model_types whose weights the engine can load (see `hybrid_model.HF_NAMES`)."""

ROPE_TYPES: Final = ("default", "proportional")
"""RoPE types the engine's `Rope` applies (see `AttentionConfig.rope_type`)."""

PARALLEL_KINDS: Final = ("attention", "mamba2")
"""Block kinds a residual group of parallel mixers may hold (see `hybrid_model.Block`)."""

_C = TypeVar(
    "_C",
    AttentionConfig,
    MLPConfig,
    Mamba2Config,
    Mamba1Config,
    GatedDeltaNetConfig,
    MoEConfig,
    SharedBlockConfig,
    ShortConvConfig,
    RGLRUConfig,
    SlidingAttentionConfig,
    KDAConfig,
    MLAConfig,
    LightningConfig,
    MLSTMConfig,
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


@dataclass(frozen=True)
class _EngineBlock:
    """One block of the engine's view: its kind, the core block it comes from (the
    shared attention of a collapsed shared-block group) and its config."""

    kind: str
    block: Block
    config: object


def _shared_group(family: str, group: list[Block]) -> SharedBlockConfig:
    """The `SharedBlockConfig` of one hybrid layer's shared-block group: attention, the
    q/k/v adapters (down, up) x 3 when present, MLP, its adapter (down, up), linear."""
    attn, mlp, down = group[0].config, group[-4].config, group[-3].config
    linears = group[1:-4] + group[-3:]
    if (
        len(group) not in (5, 11)
        or not isinstance(attn, AttentionConfig)
        or not isinstance(mlp, MLPConfig)
        or not isinstance(down, LinearConfig)
        or not all(isinstance(b.config, LinearConfig) for b in linears)
    ):
        raise ValueError(
            f"{family} layer {group[0].hf_layer}: unexpected shared-block layout "
            f"{[b.kind for b in group]}"
        )
    return SharedBlockConfig(attn, mlp, down.d_out, qkv_adapters=len(group) == 11)


def _engine_blocks(arch: HfArchitecture) -> list[_EngineBlock]:
    """The engine's blocks: each Zamba2 shared-block group (a shared attention block and
    the adapters, MLP and linear of its HF layer that follow it) collapsed into one
    `shared_transformer`; every other block as it is."""
    out: list[_EngineBlock] = []
    blocks = list(arch.blocks)
    i = 0
    while i < len(blocks):
        b = blocks[i]
        if not (b.shared and b.kind == "attention"):
            out.append(_EngineBlock(b.kind, b, b.config))
            i += 1
            continue
        j = i + 1
        in_group = ("linear", "mlp")
        while j < len(blocks) and blocks[j].hf_layer == b.hf_layer and blocks[j].kind in in_group:
            j += 1
        out.append(_EngineBlock("shared_transformer", b, _shared_group(arch.family, blocks[i:j])))
        i = j
    return out


def _check(family: str, eb: _EngineBlock) -> None:
    """Raise ValueError when the engine cannot run block `eb`."""
    block = eb.block
    where = f"{family} layer {block.hf_layer}"
    cfg = block.config
    if eb.kind not in BLOCK_KINDS or (block.shared and eb.kind != "shared_transformer"):
        raise ValueError(f"{where} has a {block.kind!r} block, which the engine lacks")
    if isinstance(cfg, AttentionConfig):
        if cfg.input_dim is not None and eb.kind != "shared_transformer":
            raise ValueError(f"{where}: attention over a {cfg.input_dim}-wide input")
        if cfg.rotary_dim and cfg.rope_type not in ROPE_TYPES:
            raise ValueError(f"{family} rope_type {cfg.rope_type!r} is not supported")
    if isinstance(cfg, Mamba2Config) and cfg.conv_activation != "silu":
        raise ValueError(
            f"{where}: Mamba-2 conv activation {cfg.conv_activation!r} (hidden_act) is not "
            "supported; the engine's conv applies 'silu'"
        )


def _one(family: str, blocks: list[_EngineBlock], kind: str, cls: type[_C]) -> _C | None:
    """The single config of the `kind` blocks (None when there are none)."""
    found = list(dict.fromkeys(b.config for b in blocks if b.kind == kind))
    if len(found) > 1:
        raise ValueError(f"{family} has {len(found)} different {kind} configs")
    if not found:
        return None
    config = found[0]
    assert isinstance(config, cls)
    return config


def _residual_factors(
    blocks: list[_EngineBlock],
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """`HybridConfig`'s per-block residual (alpha, beta) factors; empty when all are 1."""
    alpha = tuple(b.block.residual_alpha for b in blocks)
    beta = tuple(b.block.residual_beta for b in blocks)
    if all(a == 1.0 for a in alpha) and all(b == 1.0 for b in beta):
        return (), ()
    return alpha, beta


def from_architecture(arch: HfArchitecture) -> HybridConfig:
    """The engine's view of one parse: block kinds and owning HF layers in order, one
    config per mixer kind (None for a kind the model does not use), and a context limit
    of 4096 when the config sets none. Parallel mixers (FalconH1) must be attention and
    Mamba-2, the kinds whose output projection can defer its all-reduce to the group."""
    if arch.family not in FAMILIES:
        raise _unsupported(arch.family)
    blocks = _engine_blocks(arch)
    for eb in blocks:
        _check(arch.family, eb)
    fam = arch.family
    shared = _one(fam, blocks, "shared_transformer", SharedBlockConfig)
    alpha, beta = _residual_factors(blocks)
    cfg = HybridConfig(
        family=arch.family,
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        blocks=tuple(b.kind for b in blocks),
        hf_layer=tuple(b.block.hf_layer for b in blocks),
        norm_eps=arch.norm_eps,
        attention=_one(fam, blocks, "attention", AttentionConfig),
        mlp=_one(fam, blocks, "mlp", MLPConfig),
        mamba2=_one(fam, blocks, "mamba2", Mamba2Config),
        mamba1=_one(fam, blocks, "mamba1", Mamba1Config),
        gdn=_one(fam, blocks, "gdn", GatedDeltaNetConfig),
        moe=_one(fam, blocks, "moe", MoEConfig),
        shortconv=_one(fam, blocks, "shortconv", ShortConvConfig),
        tie_embeddings=arch.tie_embeddings,
        max_position=arch.context_limit,
        eos_token_ids=arch.eos_token_ids,
        unit_offset_norms=arch.unit_offset_norms,
        weights_prefix=arch.weights_prefix,
        skipped_weights=arch.skipped_weights,
        mtp_layers=arch.mtp_layers,
        mtp_blocks=arch.mtp_blocks,
        scales=arch.scales,
        parallel_mixers=arch.parallel_mixers,
        shared=shared,
        weights_layer=tuple(b.block.source_layer for b in blocks) if shared else (),
        post_norm=tuple(b.block.post_norm for b in blocks)
        if any(b.block.post_norm for b in blocks)
        else (),
        rglru=_one(fam, blocks, "rglru", RGLRUConfig),
        swa=_one(fam, blocks, "swa", SlidingAttentionConfig),
        logits_soft_cap=arch.logits_soft_cap,
        kda=_one(fam, blocks, "kda", KDAConfig),
        mla=_one(fam, blocks, "mla", MLAConfig),
        lightning=_one(fam, blocks, "lightning", LightningConfig),
        residual_alpha=alpha,
        residual_beta=beta,
        norm_residual=arch.norm_residual,
        sandwich_norm=arch.sandwich_norms,
        mlstm=_one(fam, blocks, "mlstm", MLSTMConfig),
    )
    for group in cfg.residual_groups:
        kinds = [cfg.blocks[i] for i in group]
        if len(group) > 1 and set(kinds) - set(PARALLEL_KINDS):
            raise ValueError(
                f"{arch.family} layer {cfg.hf_layer[group[0]]} runs {kinds} in parallel; "
                f"the engine runs only {list(PARALLEL_KINDS)} in parallel"
            )
    return cfg
