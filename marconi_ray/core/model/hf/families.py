"""One parser per hybrid model family: HF config dict -> `HfArchitecture` (blocks in order).

Each parser mirrors how its transformers model class builds its layers (transformers 5.x),
reading keys through `ConfigReader` with the class's defaults (`defaults`), so a
missing, null or ill-typed key is a ValueError naming the family and the key. Every
parser has the signature `(config) -> HfArchitecture`; keys of a layer type the model does
not use are not read. This is the only place a family's config keys are interpreted: the
core's `ModelSpec` and the engine's `HybridConfig` both derive from what these return.
FalconH1's parser, with its muP multipliers, lives in `falcon` (re-exported here).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace

from marconi_ray.core.model.hf import defaults
from marconi_ray.core.model.hf.arch import (
    KIND_ATTENTION,
    KIND_MLP,
    KIND_MOE,
    AttentionConfig,
    Block,
    BlockConfig,
    GatedDeltaNetConfig,
    HfArchitecture,
    LinearConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    MoEConfig,
    Scales,
    ShortConvConfig,
)
from marconi_ray.core.model.hf.blocks import (
    ATTENTION,
    MAMBA,
    NO_ROPE,
    architecture,
    attention,
    layer_types,
    mamba2_auto,
    per_layer,
    rope,
)
from marconi_ray.core.model.hf.falcon import parse_falcon_h1 as parse_falcon_h1
from marconi_ray.core.model.hf.reader import ConfigReader

MTP_PREFIX = "mtp."
"""Checkpoint prefix of multi-token-prediction layers (Qwen3.5, Qwen3-Next, NemotronH): top
level, beside the language model's prefix, in text and multimodal checkpoints alike."""
NEMOTRON_H_MTP_DEFAULT = ("full_attention", "moe")
"""NemotronH's MTP layers when `mtp_layers_block_type` is absent (transformers' default)."""


def parse_nemotron_h(config: Mapping[str, object]) -> HfArchitecture:
    """NemotronH: one block per entry of layers_block_type / hybrid_override_pattern.

    `M` Mamba-2, `*` attention (no RoPE), `-` plain MLP (mlp_hidden_act, relu2), `E` MoE
    of plain experts with one shared expert and optional latent projections; its router
    is a grouped sigmoid with `e_score_correction_bias` (n_group, topk_group,
    norm_topk_prob, routed_scaling_factor).
    """
    r = ConfigReader(config, defaults.NEMOTRON_H, "nemotron_h", defaults.NEMOTRON_H_ALIASES)
    d = r.req_int("hidden_size")
    types = r.opt_str_list("layers_block_type")
    if types is None:
        pattern = r.opt_str("hybrid_override_pattern")
        if pattern is None:
            types = list(defaults.NEMOTRON_H_DEFAULT_LAYERS)
        else:
            chars = defaults.NEMOTRON_H_PATTERN
            bad = sorted(set(pattern) - set(chars))
            if bad:
                raise ValueError(
                    f"nemotron_h hybrid_override_pattern has unknown characters "
                    f"{bad}; expected {sorted(chars)}"
                )
            types = [chars[c] for c in pattern]
    types = layer_types(types, "nemotron_h", set(defaults.NEMOTRON_H_PATTERN.values()))
    built: dict[str, BlockConfig] = {}
    for t in dict.fromkeys(types):
        if t == MAMBA:
            built[t] = Mamba2Config(
                n_heads=r.req_int("mamba_num_heads"),
                head_dim=r.req_int("mamba_head_dim"),
                n_groups=r.req_int("n_groups"),
                d_state=r.req_int("ssm_state_size"),
                d_conv=r.req_int("conv_kernel"),
                chunk_size=r.req_int("chunk_size"),
                conv_bias=r.flag("use_conv_bias"),
                proj_bias=r.flag("use_bias"),
                dt_min=r.req_float("time_step_min"),
            )
        elif t == ATTENTION:
            built[t] = attention(r, d, with_rope=False, bias=r.flag("attention_bias"))
        elif t == "mlp":
            built[t] = MLPConfig(
                r.req_int("intermediate_size"),
                r.req_str("mlp_hidden_act"),
                gated=False,
                bias=r.flag("mlp_bias"),
            )
        else:
            built[t] = MoEConfig(
                r.req_int("moe_intermediate_size"),
                r.req_int("n_routed_experts"),
                r.req_int("num_experts_per_tok"),
                r.req_str("mlp_hidden_act"),
                gated=False,
                n_shared_experts=1,
                shared_intermediate_size=r.req_int("moe_shared_expert_intermediate_size"),
                latent_dim=r.opt_int("moe_latent_size"),
                norm_topk=r.flag("norm_topk_prob"),
                scoring="sigmoid",
                selection_bias=True,
                n_group=r.req_int("n_group"),
                topk_group=r.req_int("topk_group"),
                routed_scale=r.req_float("routed_scaling_factor"),
            )
    blocks = [Block(built[t], i) for i, t in enumerate(types)]
    arch = architecture(r, blocks, norm_key="layer_norm_epsilon")
    steps = _mtp_steps(r, "num_nextn_predict_layers")
    if not steps:
        return replace(arch, skipped_weights=(MTP_PREFIX,))
    raw = r.opt_str_list("mtp_layers_block_type") or list(NEMOTRON_H_MTP_DEFAULT)
    mtp_types = layer_types(raw, "nemotron_h", (ATTENTION, "moe", "mlp"))
    missing = sorted(set(mtp_types) - set(built))
    if missing:
        raise ValueError(
            f"nemotron_h mtp_layers_block_type uses {missing}, which no layer of the model "
            "uses (the MTP layers take the model's own configs of their kinds)"
        )
    kinds = tuple(built[t].kind for t in mtp_types)
    return replace(arch, mtp_layers=steps, mtp_blocks=kinds, skipped_weights=(MTP_PREFIX,))


def parse_bamba(config: Mapping[str, object]) -> HfArchitecture:
    """Bamba: each layer is attention (index in attn_layer_indices; partial RoPE) or
    Mamba-2, then a gated MLP."""
    r = ConfigReader(config, defaults.BAMBA, "bamba")
    d = r.req_int("hidden_size")
    n_layers = r.req_int("num_hidden_layers")
    attn_idx = set(r.opt_int_list("attn_layer_indices") or ())
    attn = (
        attention(r, d, with_rope=True, bias=r.flag("attention_bias"))
        if attn_idx & set(range(n_layers))
        else None
    )
    mamba = mamba2_auto(r, r.req_int("mamba_expand") * d)
    mlp = MLPConfig(
        r.req_int("intermediate_size"), r.req_str("hidden_act"), True, r.flag("mlp_bias")
    )
    mixers = [attn if attn is not None and i in attn_idx else mamba for i in range(n_layers)]
    return architecture(r, per_layer([m, mlp] for m in mixers))


def parse_jamba(config: Mapping[str, object]) -> HfArchitecture:
    """Jamba: attention (no RoPE) every attn_layer_period layers at the offset, else
    Mamba-1; the feed-forward is a gated MoE every expert_layer_period layers (when
    num_experts > 1; top-k of a softmax router, not renormalised), else a gated MLP."""
    r = ConfigReader(config, defaults.JAMBA, "jamba", defaults.JAMBA_ALIASES)
    d = r.req_int("hidden_size")
    n_layers = r.req_int("num_hidden_layers")
    periods = {}
    for kind in ("attn", "expert"):
        period, offset = r.req_int(f"{kind}_layer_period"), r.req_int(f"{kind}_layer_offset")
        if period <= 0 or not 0 <= offset < period:
            raise ValueError(
                f"jamba {kind}_layer_offset={offset} must be in [0, {kind}_layer_period={period})"
            )
        periods[kind] = (period, offset)
    dt_rank = r.int_or_auto("mamba_dt_rank")
    mamba = Mamba1Config(
        d_inner=r.req_int("mamba_expand") * d,
        d_state=r.req_int("mamba_d_state"),
        d_conv=r.req_int("mamba_d_conv"),
        dt_rank=math.ceil(d / 16) if dt_rank is None else dt_rank,
        conv_bias=r.flag("mamba_conv_bias"),
        proj_bias=r.flag("mamba_proj_bias"),
    )
    ff, act = r.req_int("intermediate_size"), r.req_str("hidden_act")
    mlp = MLPConfig(ff, act, gated=True)
    n_experts = r.req_int("num_experts")
    moe: BlockConfig = (
        MoEConfig(ff, n_experts, r.req_int("num_experts_per_tok"), act, gated=True)
        if n_experts > 1
        else mlp
    )
    ap, ao = periods["attn"]
    ep, eo = periods["expert"]
    attn = (
        attention(r, d, with_rope=False, bias=False)
        if any(i % ap == ao for i in range(n_layers))
        else None
    )
    layers = [
        [attn if attn is not None and i % ap == ao else mamba, moe if i % ep == eo else mlp]
        for i in range(n_layers)
    ]
    return architecture(r, per_layer(layers))


def parse_zamba2(config: Mapping[str, object]) -> HfArchitecture:
    """Zamba2: every layer is a Mamba-2; a "hybrid" layer first runs the shared block.

    The shared block: attention over the 2*D concatenation of hidden state and embeddings
    (head_dim = 2*D // heads, scores scaled by (head_dim / 2)**-0.5; RoPE only with
    use_mem_rope), a gated MLP with a LoRA adapter on its gate/up projection, optional
    LoRA adapters on q/k/v (which need num_key_value_heads == num_attention_heads), and a
    D x D linear. Each hybrid layer has its own KV, adapters and linear. The k-th hybrid
    layer uses copy k % num_mem_blocks of the shared weights, stored (with the adapters of
    every layer using it) under the first hybrid layer using that copy (`weights_layer`).
    """
    r = ConfigReader(config, defaults.ZAMBA2, "zamba2", defaults.ZAMBA2_ALIASES)
    d = r.req_int("hidden_size")
    raw_types = r.opt_str_list("layers_block_type")
    types = layer_types(
        defaults.ZAMBA2_DEFAULT_LAYERS if raw_types is None else raw_types,
        "zamba2",
        (MAMBA, "hybrid"),
    )
    heads = r.pos_int("n_mamba_heads")
    bias = r.flag("add_bias_linear")
    mamba = Mamba2Config(
        n_heads=heads,
        head_dim=r.req_int("mamba_expand") * d // heads,
        n_groups=r.req_int("mamba_ngroups"),
        d_state=r.req_int("mamba_d_state"),
        d_conv=r.req_int("mamba_d_conv"),
        chunk_size=r.req_int("chunk_size"),
        conv_bias=r.flag("use_conv_bias"),
        proj_bias=bias,
        dt_min=r.req_float("time_step_min"),
    )
    shared: list[tuple[BlockConfig, bool]] = []
    if "hybrid" in types:
        attn_heads = r.pos_int("num_attention_heads")
        kv_heads = r.opt_int("num_key_value_heads")
        kv = attn_heads if kv_heads is None else kv_heads
        width = 2 * d
        head_dim = width // attn_heads
        rotary, theta, rope_type = rope(r, head_dim) if r.flag("use_mem_rope") else NO_ROPE
        attn = AttentionConfig(
            attn_heads,
            kv,
            head_dim,
            rotary,
            theta,
            input_dim=width,
            rope_type=rope_type,
            scale=(head_dim / 2) ** -0.5,
        )
        shared.append((attn, True))
        rank = r.req_int("adapter_rank")
        if r.flag("use_shared_attention_adapter"):
            if kv != attn_heads:
                raise ValueError(
                    f"zamba2 use_shared_attention_adapter needs num_key_value_heads={kv} "
                    f"== num_attention_heads={attn_heads} (the k/v adapters are 2*D wide)"
                )
            shared += [(LinearConfig(width, rank), False), (LinearConfig(rank, width), False)] * 3
        ff = r.opt_int("intermediate_size") or 4 * d
        shared += [
            (MLPConfig(ff, r.req_str("hidden_act"), gated=True, bias=bias), True),
            (LinearConfig(d, rank), False),
            (LinearConfig(rank, 2 * ff), False),
        ]
    copies = r.pos_int("num_mem_blocks")
    hybrid = [i for i, t in enumerate(types) if t == "hybrid"]
    blocks: list[Block] = []
    for i, t in enumerate(types):
        if t == "hybrid":
            source = hybrid[hybrid.index(i) % copies]
            blocks += [Block(c, i, shared=s, weights_layer=source) for c, s in shared]
            blocks.append(Block(LinearConfig(d, d), i))
        blocks.append(Block(mamba, i))
    long_context = r.flag("use_long_context")
    max_position = defaults.ZAMBA2_LONG_CONTEXT_POSITIONS if long_context else None
    return architecture(r, blocks, max_position=max_position)


def parse_granitemoehybrid(config: Mapping[str, object]) -> HfArchitecture:
    """GraniteMoeHybrid: Mamba-2 or attention (RoPE only when position_embedding_type is
    "rope") per layer_types, then a gated MoE plus a gated shared MLP (only the shared MLP
    when num_local_experts is 0). The router is a softmax over the top-k logits (the
    renormalised top-k of a softmax). muP multipliers: embedding_multiplier,
    residual_multiplier and 1 / logits_scaling into `Scales`, attention_multiplier is the
    attention's softmax scale."""
    r = ConfigReader(
        config, defaults.GRANITE_MOE_HYBRID, "granitemoehybrid", defaults.GRANITE_MOE_HYBRID_ALIASES
    )
    d = r.req_int("hidden_size")
    raw_types = r.opt_str_list("layer_types")
    if raw_types is None:
        raw_types = [MAMBA] * r.req_int("num_hidden_layers")
    types = layer_types(raw_types, "granitemoehybrid", (MAMBA, ATTENTION))
    mamba = mamba2_auto(r, r.req_int("mamba_expand") * d) if MAMBA in types else None
    attn = None
    if ATTENTION in types:
        with_rope = r.opt_str("position_embedding_type") == "rope"
        attn = replace(
            attention(r, d, with_rope=with_rope, bias=r.flag("attention_bias")),
            scale=r.req_float("attention_multiplier"),
        )
    shared_ff, act = r.req_int("shared_intermediate_size"), r.req_str("hidden_act")
    n_experts = r.req_int("num_local_experts")
    ffn: BlockConfig = (
        MoEConfig(
            r.req_int("intermediate_size"),
            n_experts,
            r.req_int("num_experts_per_tok"),
            act,
            gated=True,
            n_shared_experts=1,
            shared_intermediate_size=shared_ff,
            norm_topk=True,
        )
        if n_experts > 0
        else MLPConfig(shared_ff, act, gated=True)
    )
    layers: list[list[BlockConfig]] = []
    for t in types:
        mixer = mamba if t == MAMBA else attn
        assert mixer is not None
        layers.append([mixer, ffn])
    scales = Scales(
        embedding=r.req_float("embedding_multiplier"),
        residual=r.req_float("residual_multiplier"),
        logits=1.0 / r.req_float("logits_scaling"),
    )
    return replace(architecture(r, per_layer(layers)), scales=scales)


def _qwen_rope(r: ConfigReader) -> tuple[float, float, str]:
    """(rope_theta, partial_rotary_factor, rope_type): `rope_parameters` entries, else the
    legacy top-level keys, else the class defaults. mRoPE sections (Qwen3.5) rotate every
    channel by the text position when the three position streams are equal, as for text."""
    params = r.mapping("rope_parameters") if r.has("rope_parameters") else {}
    out: list[float] = []
    for name in ("rope_theta", "partial_rotary_factor"):
        value = params.get(name, r.raw(name))
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{r.family} config key {name!r} must be a number, got {value!r}")
        out.append(float(value))
    rope_type = params.get("rope_type", "default")
    if not isinstance(rope_type, str):
        raise ValueError(f"{r.family} config key 'rope_type' must be a string, got {rope_type!r}")
    return out[0], out[1], rope_type


def _qwen_linear(r: ConfigReader, *, fused: bool, moe: bool, sparse: bool) -> HfArchitecture:
    """Qwen3.5 / Qwen3-Next text model: each layer is Gated DeltaNet (`linear_attention`)
    or gated attention with q/k norms and partial RoPE (`full_attention`; default: every
    `full_attention_interval`-th layer), then a gated SiLU MLP or a mixture of experts
    (top-k softmax router, renormalised; a shared expert scaled by a sigmoid gate).
    `sparse`: Qwen3-Next's choice of MoE layers (`decoder_sparse_step`, `mlp_only_layers`,
    none when num_experts is 0); otherwise every layer of a MoE model is MoE."""
    d = r.req_int("hidden_size")
    n_layers = r.req_int("num_hidden_layers")
    raw_types = r.opt_str_list("layer_types")
    if raw_types is None:
        interval = r.pos_int("full_attention_interval")
        raw_types = [MAMBA if (i + 1) % interval else ATTENTION for i in range(n_layers)]
    types = layer_types(raw_types, r.family, (MAMBA, ATTENTION))
    if len(types) != n_layers:
        raise ValueError(
            f"{r.family} config has {len(types)} layer_types for num_hidden_layers={n_layers}"
        )
    gdn = GatedDeltaNetConfig(
        n_k_heads=r.req_int("linear_num_key_heads"),
        n_v_heads=r.req_int("linear_num_value_heads"),
        head_k_dim=r.req_int("linear_key_head_dim"),
        head_v_dim=r.req_int("linear_value_head_dim"),
        d_conv=r.req_int("linear_conv_kernel_dim"),
        fused_projection=fused,
    )
    attn: BlockConfig | None = None
    if ATTENTION in types:
        base = attention(r, d, with_rope=False, bias=r.flag("attention_bias"))
        theta, factor, rope_type = _qwen_rope(r)
        attn = AttentionConfig(
            base.n_heads,
            base.n_kv_heads,
            base.head_dim,
            rotary_dim=int(base.head_dim * factor),
            rope_theta=theta,
            bias=base.bias,
            rope_type=rope_type,
            output_gate=True,
            qk_norm=True,
        )
    act = r.req_str("hidden_act")
    n_experts = 0
    if moe:  # Qwen3.5-MoE builds experts in every layer; Qwen3-Next takes 0 as all dense
        n_experts = r.req_int("num_experts") if sparse else r.pos_int("num_experts")
    experts: BlockConfig | None = None
    if n_experts > 0:
        experts = MoEConfig(
            r.req_int("moe_intermediate_size"),
            n_experts,
            r.req_int("num_experts_per_tok"),
            act,
            gated=True,
            n_shared_experts=1,
            shared_intermediate_size=r.req_int("shared_expert_intermediate_size"),
            norm_topk=r.flag("norm_topk_prob") if sparse else True,
            shared_expert_gate=True,
        )
    dense_ok = experts is None or sparse
    mlp = MLPConfig(r.req_int("intermediate_size"), act, gated=True) if dense_ok else None
    dense_layers: set[int] = set()
    if sparse and experts is not None:
        step = r.pos_int("decoder_sparse_step")
        only = set(r.opt_int_list("mlp_only_layers") or ())
        dense_layers = {i for i in range(n_layers) if i in only or (i + 1) % step}
    elif experts is None:
        dense_layers = set(range(n_layers))
    layers: list[list[BlockConfig]] = []
    for i, t in enumerate(types):
        mixer = gdn if t == MAMBA else attn
        ffn = mlp if i in dense_layers else experts
        assert mixer is not None and ffn is not None
        layers.append([mixer, ffn])
    arch = architecture(r, per_layer(layers), unit_offset_norms=True)
    steps = _mtp_steps(r, "mtp_num_hidden_layers")
    mtp_ffn = KIND_MOE if experts is not None else KIND_MLP
    blocks = (KIND_ATTENTION, mtp_ffn) if steps else ()
    return replace(arch, mtp_layers=steps, mtp_blocks=blocks, skipped_weights=(MTP_PREFIX,))


def _mtp_steps(r: ConfigReader, key: str) -> int:
    """The config's multi-token-prediction steps under `key` (0 when absent or null)."""
    steps = r.opt_int(key) if r.has(key) else 0
    if steps is not None and steps < 0:
        raise ValueError(f"{r.family} config key {key!r} must be >= 0, got {steps}")
    return steps or 0


def parse_qwen3_5_text(config: Mapping[str, object]) -> HfArchitecture:
    """Qwen3.5 (dense) text model; see `_qwen_linear`."""
    r = ConfigReader(config, defaults.QWEN3_5_TEXT, "qwen3_5_text")
    return _qwen_linear(r, fused=False, moe=False, sparse=False)


def parse_qwen3_5_moe_text(config: Mapping[str, object]) -> HfArchitecture:
    """Qwen3.5-MoE text model: every layer's feed-forward is a mixture of experts."""
    r = ConfigReader(config, defaults.QWEN3_5_MOE_TEXT, "qwen3_5_moe_text")
    return _qwen_linear(r, fused=False, moe=True, sparse=False)


def parse_qwen3_next(config: Mapping[str, object]) -> HfArchitecture:
    """Qwen3-Next: Qwen3.5's layers with the fused Gated DeltaNet projections."""
    r = ConfigReader(config, defaults.QWEN3_NEXT, "qwen3_next")
    return _qwen_linear(r, fused=True, moe=True, sparse=True)


def _multimodal(
    config: Mapping[str, object], family: str, text_parser: Callable[..., HfArchitecture]
) -> HfArchitecture:
    """The language model of a multimodal checkpoint (`text_config`); its weights sit
    under `model.language_model.`, the vision tower's (`model.visual.`) are skipped.
    `tie_word_embeddings` is the outer config's; a missing `text_config` is the text
    model's defaults."""
    r = ConfigReader(config, {"tie_word_embeddings": False, "text_config": {}}, family)
    text = r.mapping("text_config")
    arch = text_parser(text)
    return replace(
        arch,
        family=family,
        tie_embeddings=r.flag("tie_word_embeddings"),
        weights_prefix="model.language_model.",
        skipped_weights=("model.visual.", *arch.skipped_weights),
    )


def parse_qwen3_5(config: Mapping[str, object]) -> HfArchitecture:
    """Qwen3.5 multimodal checkpoint: its text model (`parse_qwen3_5_text`)."""
    return _multimodal(config, "qwen3_5", parse_qwen3_5_text)


def parse_qwen3_5_moe(config: Mapping[str, object]) -> HfArchitecture:
    """Qwen3.5-MoE multimodal checkpoint: its text model (`parse_qwen3_5_moe_text`)."""
    return _multimodal(config, "qwen3_5_moe", parse_qwen3_5_moe_text)


LFM2_CONV = "conv"
"""LFM2's `layer_types` entry of a short-conv layer."""


def _lfm2_layer_types(r: ConfigReader, n_layers: int, *, legacy_idxs: bool) -> list[str]:
    """`layer_types` ("conv" / "full_attention"), one per layer. Without it LFM2 (not
    LFM2-MoE, which cannot be built without it) puts attention at `full_attn_idxs`, every
    layer when that is null too."""
    raw = r.opt_str_list("layer_types")
    if raw is None:
        if not legacy_idxs:
            raise ValueError(f"{r.family} config needs 'layer_types' (one per layer)")
        idxs = r.opt_int_list("full_attn_idxs")
        attn = set(range(n_layers) if idxs is None else idxs)
        raw = [ATTENTION if i in attn else LFM2_CONV for i in range(n_layers)]
    types = layer_types(raw, r.family, (LFM2_CONV, ATTENTION))
    if len(types) != n_layers:
        raise ValueError(
            f"{r.family} config has {len(types)} layer_types for num_hidden_layers={n_layers}"
        )
    return types


def _lfm2_attention(r: ConfigReader, d: int) -> AttentionConfig:
    """GQA with RMSNorms over head_dim on q and k and RoPE over the whole head; the base is
    `rope_parameters`' rope_theta, else the legacy top-level `rope_theta`."""
    base = attention(r, d, with_rope=False, bias=False)
    params = {} if r.raw("rope_parameters") is None else r.mapping("rope_parameters")
    theta = params.get("rope_theta", r.raw("rope_theta"))
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise ValueError(f"{r.family} config key 'rope_theta' must be a number, got {theta!r}")
    rope_type = params.get("rope_type", "default")
    if not isinstance(rope_type, str):
        raise ValueError(f"{r.family} config key 'rope_type' must be a string, got {rope_type!r}")
    return replace(
        base, rotary_dim=base.head_dim, rope_theta=float(theta), rope_type=rope_type, qk_norm=True
    )


def _lfm2_ff(r: ConfigReader) -> int:
    """LFM2's feed-forward width: with `block_auto_adjust_ff_dim`, int(2/3 of
    intermediate_size), then (when `block_ffn_dim_multiplier` is set) times the multiplier
    and rounded up to a multiple of `block_multiple_of`, as `Lfm2MLP` computes it."""
    ff = r.req_int("intermediate_size")
    if not r.flag("block_auto_adjust_ff_dim"):
        return ff
    ff = int(2 * ff / 3)
    if r.raw("block_ffn_dim_multiplier") is None:
        return ff
    ff = int(r.req_float("block_ffn_dim_multiplier") * ff)
    multiple = r.pos_int("block_multiple_of")
    return multiple * ((ff + multiple - 1) // multiple)


def _lfm2(r: ConfigReader, ffn: Callable[[int], BlockConfig], legacy_idxs: bool) -> HfArchitecture:
    """LFM2 layers: a short conv or attention per `layer_types`, then `ffn(layer)`."""
    d = r.req_int("hidden_size")
    n_layers = r.req_int("num_hidden_layers")
    types = _lfm2_layer_types(r, n_layers, legacy_idxs=legacy_idxs)
    conv = ShortConvConfig(d_conv=r.req_int("conv_L_cache"), bias=r.flag("conv_bias"))
    attn = _lfm2_attention(r, d) if ATTENTION in types else None
    layers: list[list[BlockConfig]] = []
    for i, t in enumerate(types):
        mixer = conv if t == LFM2_CONV else attn
        assert mixer is not None
        layers.append([mixer, ffn(i)])
    return architecture(r, per_layer(layers), norm_key="norm_eps")


def parse_lfm2(config: Mapping[str, object]) -> HfArchitecture:
    """LFM2: each layer is a gated short conv or GQA attention (q/k norms, RoPE), then a
    SwiGLU feed-forward (w1, w3, w2) of the auto-adjusted width (`_lfm2_ff`)."""
    r = ConfigReader(config, defaults.LFM2, "lfm2", defaults.LFM2_ALIASES)
    mlp = MLPConfig(_lfm2_ff(r), "silu", gated=True)
    return _lfm2(r, lambda _: mlp, legacy_idxs=True)


def parse_lfm2_moe(config: Mapping[str, object]) -> HfArchitecture:
    """LFM2-MoE: LFM2's mixers; the first `num_dense_layers` feed-forwards are SwiGLU MLPs
    of `intermediate_size`, the rest mixtures of SwiGLU experts routed by sigmoid scores
    (chosen with `expert_bias` when `use_expert_bias`, renormalised when `norm_topk_prob`,
    times `routed_scaling_factor`)."""
    r = ConfigReader(config, defaults.LFM2_MOE, "lfm2_moe", defaults.LFM2_MOE_ALIASES)
    n_dense = r.req_int("num_dense_layers")
    mlp = MLPConfig(r.req_int("intermediate_size"), "silu", gated=True)
    moe: BlockConfig | None = None
    if n_dense < r.req_int("num_hidden_layers"):
        moe = MoEConfig(
            r.req_int("moe_intermediate_size"),
            r.req_int("num_experts"),
            r.req_int("num_experts_per_tok"),
            "silu",
            gated=True,
            norm_topk=r.flag("norm_topk_prob"),
            scoring="sigmoid",
            selection_bias=r.flag("use_expert_bias"),
            routed_scale=r.req_float("routed_scaling_factor"),
        )

    def ffn(layer: int) -> BlockConfig:
        if layer < n_dense:
            return mlp
        assert moe is not None
        return moe

    return _lfm2(r, ffn, legacy_idxs=False)
