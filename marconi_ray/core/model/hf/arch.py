"""`HfArchitecture`: one hybrid model as its Hugging Face config describes it (pure data).

`families` parses a `config.json` dict into one `HfArchitecture`: the residual blocks in
execution order, each with the frozen config of its operator (attention, Mamba-2, Mamba-1,
MLP, MoE or a bare projection) and the HF decoder layer that holds its weights, plus the
model-wide norms, embeddings and limits. Both views of a model derive from it: the core's
`ModelSpec` (FLOPs and bytes, `parse.spec_from_architecture`) and the engine's
`HybridConfig` (`engine.model.from_hf.hybrid_config`), which re-exports these block configs.

Sizes are checked where the cost model builds its layer specs (`core/model/layers.py`):
`parse.parse_hf_config` only returns architectures whose `ModelSpec` builds. The
dataclasses here check only what the cost model does not see (chunk size, rotary width).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Final

from marconi_ray.core.model.hf.kda_arch import KIND_KDA, KDAConfig
from marconi_ray.core.model.hf.lightning import KIND_LIGHTNING, LightningConfig
from marconi_ray.core.model.hf.mla_arch import KIND_MLA, MLAConfig
from marconi_ray.core.model.hf.mlstm_arch import KIND_MLSTM, MLSTMConfig
from marconi_ray.core.model.layers import Mamba2Sizes
from marconi_ray.core.model.spec_checks import require_non_negative, require_positive

KIND_ATTENTION: Final = "attention"
KIND_MAMBA2: Final = "mamba2"
KIND_MAMBA1: Final = "mamba1"
KIND_MLP: Final = "mlp"
KIND_MOE: Final = "moe"
KIND_LINEAR: Final = "linear"
KIND_GDN: Final = "gdn"
KIND_SHORTCONV: Final = "shortconv"
KIND_RGLRU: Final = "rglru"
KIND_SWA: Final = "swa"
ROUTER_SCORINGS: Final = ("softmax", "sigmoid")
MAMBA2_IN_PROJ_SEGMENTS: Final = 5
"""Mamba-2's in_proj output segments: z, x, B, C, dt."""
BLOCK_CONFIG_KINDS: Final = (
    KIND_ATTENTION,
    KIND_MAMBA2,
    KIND_MAMBA1,
    KIND_GDN,
    KIND_SHORTCONV,
    KIND_RGLRU,
    KIND_SWA,
    KIND_LIGHTNING,
    KIND_MLP,
    KIND_MOE,
    KIND_LINEAR,
    KIND_KDA,
    KIND_MLA,
    KIND_MLSTM,
)


def require_finite(config: object, *names: str) -> None:
    """ValueError naming the first of the fields `names` of `config` that is not finite."""
    for name in names:
        value = getattr(config, name)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")


@dataclass(frozen=True)
class AttentionConfig:
    """Grouped-query self-attention (`n_kv_heads` divides `n_heads`).

    Attributes:
        rotary_dim: leading channels of each head that RoPE rotates; 0 means no positional
            encoding (then `rope_theta` and `rope_type` mean nothing).
        rope_theta: the RoPE base.
        bias: the q/k/v/o projections have biases.
        input_dim: width the q/k/v projections read; None means the hidden size (Zamba2's
            shared block reads the 2*D concatenation of hidden state and embeddings).
        rope_type: the HF `rope_type`; "default" is plain RoPE. "proportional" (LFM3's
            full attention) rotates channel pairs (i, i + head_dim / 2) of the whole
            head, the first rotary_dim / 2 pairs at frequencies theta^(-2i / head_dim)
            and the rest at frequency 0 (unrotated): `rotary_dim` channels turn.
        output_gate: q_proj also emits a per-channel gate (each head's head_dim query
            channels, then head_dim gate channels); the attention output is multiplied by
            sigmoid(gate) before o_proj (Qwen3.5, Qwen3-Next).
        head_gate: a separate `g_proj` (D -> n_heads, no bias) gates each head: the
            head's attention output is multiplied by sigmoid(g) before o_proj (LFM3).
        qk_norm: RMSNorm over head_dim on each query and key head, before RoPE.
        qk_norm_whole: with `qk_norm`, the norm is over the whole q (all heads) and the
            whole k projection instead of each head (OLMo Hybrid).
        scale: the softmax scale of the scores; None means head_dim**-0.5 (Granite 4.0-H's
            `attention_multiplier` sets it; FalconH1's `key_multiplier` times head_dim**-0.5).
        input_scale: the q/k/v projections read the input times it (FalconH1
            `attention_in_multiplier`; biases are not scaled).
        output_scale: the o projection's output (bias included) is multiplied by it
            (FalconH1 `attention_out_multiplier`).
    """

    kind: ClassVar[str] = KIND_ATTENTION
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rotary_dim: int = 0
    rope_theta: float = 10000.0
    bias: bool = False
    input_dim: int | None = None
    rope_type: str = "default"
    output_gate: bool = False
    qk_norm: bool = False
    head_gate: bool = False
    qk_norm_whole: bool = False
    scale: float | None = None
    input_scale: float = 1.0
    output_scale: float = 1.0

    def __post_init__(self) -> None:
        require_non_negative("rotary_dim", self.rotary_dim)
        require_finite(self, "input_scale", "output_scale")
        if self.scale is not None and not self.scale > 0:
            raise ValueError(f"attention scale must be > 0, got {self.scale}")
        if self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim={self.rotary_dim} exceeds head_dim={self.head_dim}")


@dataclass(frozen=True)
class MLPConfig:
    """`down(act(up(x)))`, or `down(act(gate(x)) * up(x))` when `gated`.

    Attributes:
        gate_scale: the gate projection's output (bias included) is multiplied by it
            before the activation (FalconH1 `mlp_multipliers[0]`).
        down_scale: the down projection's output (bias included) is multiplied by it
            (FalconH1 `mlp_multipliers[1]`).
    """

    kind: ClassVar[str] = KIND_MLP
    intermediate_size: int
    activation: str
    gated: bool
    bias: bool = False
    gate_scale: float = 1.0
    down_scale: float = 1.0

    def __post_init__(self) -> None:
        require_finite(self, "gate_scale", "down_scale")


@dataclass(frozen=True)
class MoEConfig:
    """Mixture of experts: a router picks `top_k` of `n_experts` experts (MLPs of width
    `intermediate_size`) per token; `n_shared_experts` always-on experts of width
    `shared_intermediate_size` run beside them. With `latent_dim` (NemotronH) the routed
    experts run between projections D -> latent -> D.

    The router: scores = `scoring`(x . W_router) over the experts ("softmax" or
    "sigmoid"); experts are chosen by the `top_k` largest scores (plus a per-expert
    correction bias when `selection_bias`, restricted to the best `topk_group` of `n_group`
    expert groups when `n_group` > 1; a group's rank is the sum of its two best biased
    scores); an expert's weight is its unbiased score, renormalised over the chosen when
    `norm_topk`, times `routed_scale`.

    Attributes:
        norm_topk: the chosen experts' weights are renormalised to sum to 1 (Qwen3.5-MoE
            always, Qwen3-Next / NemotronH / LFM2-MoE `norm_topk_prob`, Granite's softmax
            over the top-k logits); Jamba leaves them unnormalised.
        shared_expert_gate: the shared expert's output is scaled by sigmoid(x . w_gate), a
            D -> 1 projection (Qwen3.5-MoE, Qwen3-Next).
        scoring: "softmax" or "sigmoid".
        selection_bias: a per-expert bias is added to the scores to choose the experts
            only (NemotronH `e_score_correction_bias`, LFM2-MoE `expert_bias`).
        n_group, topk_group: group-limited routing (NemotronH).
        routed_scale: the routed experts' weights are multiplied by it
            (`routed_scaling_factor`).
    """

    kind: ClassVar[str] = KIND_MOE
    intermediate_size: int
    n_experts: int
    top_k: int
    activation: str
    gated: bool
    n_shared_experts: int = 0
    shared_intermediate_size: int = 0
    latent_dim: int | None = None
    norm_topk: bool = False
    shared_expert_gate: bool = False
    scoring: str = "softmax"
    selection_bias: bool = False
    n_group: int = 1
    topk_group: int = 1
    routed_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.scoring not in ROUTER_SCORINGS:
            raise ValueError(
                f"unknown MoE router scoring {self.scoring!r}; known: {list(ROUTER_SCORINGS)}"
            )
        require_positive("n_group", self.n_group)
        if self.n_experts % self.n_group or not 1 <= self.topk_group <= self.n_group:
            raise ValueError(
                f"n_group={self.n_group} must divide n_experts={self.n_experts} and "
                f"topk_group={self.topk_group} must be in [1, n_group]"
            )


@dataclass(frozen=True)
class Mamba2Config:
    """Mamba-2 (SSD) mixer. Its sizes and the widths derived from them (d_inner, conv_dim)
    are the cost model's `Mamba2Sizes` (`sizes`), checked where its `Mamba2Layer` builds.

    Attributes:
        chunk_size: tokens per chunk of the chunked scan.
        conv_bias: the depthwise conv has a bias.
        proj_bias: in_proj and out_proj have biases.
        dt_min, dt_max: the clamp applied to dt after softplus.
        gated_norm: the scan output goes through the gated group RMSNorm before out_proj;
            without it the output is only gated, y * silu(z) (FalconH1 `mamba_rms_norm`).
        norm_before_gate: the gated norm is weight * norm(y) * silu(z) instead of
            weight * norm(y * silu(z)) (FalconH1 `mamba_norm_before_gate`).
        conv_activation: the activation after the depthwise conv (FalconH1: `hidden_act`).
        input_scale: in_proj reads the input times it (FalconH1 `ssm_in_multiplier`; the
            bias is not scaled).
        in_proj_scales: multipliers of in_proj's output segments (z, x, B, C, dt), bias
            included (FalconH1 `ssm_multipliers`, its "mup vector").
        output_scale: out_proj's output (bias included) is multiplied by it (FalconH1
            `ssm_out_multiplier`).
    """

    kind: ClassVar[str] = KIND_MAMBA2
    n_heads: int
    head_dim: int
    n_groups: int
    d_state: int
    d_conv: int
    chunk_size: int
    conv_bias: bool = True
    proj_bias: bool = False
    dt_min: float = 0.0
    dt_max: float = float("inf")
    gated_norm: bool = True
    norm_before_gate: bool = False
    conv_activation: str = "silu"
    input_scale: float = 1.0
    in_proj_scales: tuple[float, ...] = (1.0,) * MAMBA2_IN_PROJ_SEGMENTS
    output_scale: float = 1.0

    def __post_init__(self) -> None:
        require_positive("chunk_size", self.chunk_size)
        if len(self.in_proj_scales) != MAMBA2_IN_PROJ_SEGMENTS:
            raise ValueError(
                f"in_proj_scales needs {MAMBA2_IN_PROJ_SEGMENTS} multipliers (z, x, B, C, dt), "
                f"got {self.in_proj_scales!r}"
            )
        require_finite(self, "input_scale", "output_scale")
        for v in self.in_proj_scales:
            if not math.isfinite(v):
                raise ValueError(f"in_proj_scales must be finite, got {self.in_proj_scales!r}")

    @property
    def sizes(self) -> Mamba2Sizes:
        """The sizes and derived widths, as the cost model describes (and checks) them."""
        return Mamba2Sizes(self.n_heads, self.head_dim, self.n_groups, self.d_state, self.d_conv)

    @property
    def d_inner(self) -> int:
        return self.sizes.d_inner

    @property
    def conv_dim(self) -> int:
        return self.sizes.conv_dim


@dataclass(frozen=True)
class Mamba1Config:
    """Mamba-1 (selective scan) mixer as in Jamba and Mamba.

    Attributes:
        inner_norms: RMSNorms on dt, B and C (Jamba, Falcon-Mamba; not Mamba).
        inner_norm_weights: those norms have weights (`dt_layernorm`, `b_layernorm`,
            `c_layernorm`: Jamba); Falcon-Mamba's have none.
        inner_norm_eps: their epsilon; None means the model's norm epsilon (Jamba).
    """

    kind: ClassVar[str] = KIND_MAMBA1
    d_inner: int
    d_state: int
    d_conv: int
    dt_rank: int
    conv_bias: bool = True
    proj_bias: bool = False
    inner_norms: bool = True
    inner_norm_weights: bool = True
    inner_norm_eps: float | None = None


@dataclass(frozen=True)
class GatedDeltaNetConfig:
    """Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next).

    q and k have `n_k_heads` heads of `head_k_dim`, v and the output gate z `n_v_heads` of
    `head_v_dim`; each key head serves `n_v_heads // n_k_heads` consecutive value heads. A
    depthwise causal conv (kernel `d_conv`, no bias, SiLU) runs over the concatenation
    [q, k, v] (`conv_dim` channels); beta = sigmoid(b) and the log decay
    g = -exp(A_log) * softplus(a + dt_bias) come from one projection per value head.

    Attributes:
        fused_projection: Qwen3-Next's layout: `in_proj_qkvz` and `in_proj_ba`, their rows
            grouped by key head ([q, k, v, z] and [b, a] of each key head's value heads);
            otherwise Qwen3.5's `in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`.
        separate_projections: OLMo Hybrid's layout: `q_proj`, `k_proj`, `v_proj`, `a_proj`,
            `b_proj`, the output gate `g_proj` and `o_proj` (exclusive with
            `fused_projection`).
        chunk_size: tokens per chunk of the chunked prefill.
        beta_scale: the write strength is beta_scale * sigmoid(b) (OLMo Hybrid's
            `linear_allow_neg_eigval`: 2, so the transition's eigenvalues reach -1).
        norm_eps: the epsilon of the gated output norm; None means the model's.
    """

    kind: ClassVar[str] = KIND_GDN
    n_k_heads: int
    n_v_heads: int
    head_k_dim: int
    head_v_dim: int
    d_conv: int
    fused_projection: bool = False
    chunk_size: int = 64
    separate_projections: bool = False
    beta_scale: float = 1.0
    norm_eps: float | None = None

    def __post_init__(self) -> None:
        for name in ("n_k_heads", "n_v_heads", "head_k_dim", "head_v_dim", "d_conv"):
            require_positive(name, getattr(self, name))
        require_positive("chunk_size", self.chunk_size)
        if self.fused_projection and self.separate_projections:
            raise ValueError("a Gated DeltaNet layout is fused or separate, not both")
        if not 0 < self.beta_scale <= 2:
            raise ValueError(f"beta_scale must be in (0, 2], got {self.beta_scale}")
        if self.n_v_heads % self.n_k_heads:
            raise ValueError(
                f"linear_num_key_heads={self.n_k_heads} must divide "
                f"linear_num_value_heads={self.n_v_heads}"
            )

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class ShortConvConfig:
    """LFM2's gated short convolution over the residual width D.

    `in_proj` (D -> 3D) gives B, C and x; y = C * conv(B * x), where conv is a depthwise
    causal conv1d of kernel `d_conv` (`conv_L_cache`) with no activation; then `out_proj`
    (D -> D). Its only state is the conv window: the last `d_conv` inputs B * x.

    Attributes:
        bias: in_proj, the conv and out_proj have biases (`conv_bias`).
    """

    kind: ClassVar[str] = KIND_SHORTCONV
    d_conv: int
    bias: bool = False

    def __post_init__(self) -> None:
        require_positive("conv_L_cache", self.d_conv)


@dataclass(frozen=True)
class RGLRUConfig:
    """RecurrentGemma's recurrent block (Griffin) over an LRU of `lru_width` channels.

    y = act(linear_y(x)); u = conv(linear_x(x)) (a depthwise causal conv1d of kernel
    `d_conv` with a bias, no activation); h = RG-LRU(u), whose input and recurrence gates
    are block-diagonal (`n_heads` blocks of lru_width / n_heads channels);
    out = linear_out(h * y). linear_x / linear_y / linear_out have biases. States: the
    conv window (lru_width x d_conv) and the LRU state (lru_width, float32).

    Attributes:
        activation: the y branch's activation (`hidden_activation`).
    """

    kind: ClassVar[str] = KIND_RGLRU
    lru_width: int
    n_heads: int
    d_conv: int
    activation: str = "gelu_pytorch_tanh"

    def __post_init__(self) -> None:
        require_positive("lru_width", self.lru_width)
        require_positive("num_attention_heads", self.n_heads)
        require_positive("conv1d_width", self.d_conv)
        if self.lru_width % self.n_heads:
            raise ValueError(
                f"num_attention_heads={self.n_heads} must divide lru_width={self.lru_width}"
            )

    @property
    def block_width(self) -> int:
        """Channels of one gate block."""
        return self.lru_width // self.n_heads


@dataclass(frozen=True)
class SlidingAttentionConfig:
    """Self-attention over a sliding window: a token attends to the last `window`
    positions, itself included (key position k is seen from query q when
    q - window < k <= q, transformers' `sliding_window` convention).

    Attributes:
        attention: the attention itself (heads, RoPE, biases of q/k/v).
        window: the window in tokens (RecurrentGemma `attention_window_size`).
        output_bias: o_proj has a bias even when q/k/v have none (RecurrentGemma).
    """

    kind: ClassVar[str] = KIND_SWA
    attention: AttentionConfig
    window: int
    output_bias: bool = False

    def __post_init__(self) -> None:
        require_positive("attention_window_size", self.window)


@dataclass(frozen=True)
class LinearConfig:
    """A bare projection d_in -> d_out (Zamba2's shared-block adapters and output linear)."""

    kind: ClassVar[str] = KIND_LINEAR
    d_in: int
    d_out: int


BlockConfig = (
    AttentionConfig
    | MLPConfig
    | MoEConfig
    | Mamba2Config
    | Mamba1Config
    | GatedDeltaNetConfig
    | ShortConvConfig
    | RGLRUConfig
    | SlidingAttentionConfig
    | LightningConfig
    | LinearConfig
    | KDAConfig
    | MLAConfig
    | MLSTMConfig
)


@dataclass(frozen=True)
class Block:
    """One operator of the model in execution order, normally `x = x + op(norm(x))`.

    Attributes:
        config: the operator; `config.kind` is one of `BLOCK_CONFIG_KINDS`.
        hf_layer: index of the HF decoder layer that runs it (and holds its weights).
        shared: its weights are shared by several layers (Zamba2's shared transformer
            block, which every "hybrid" layer runs before its Mamba-2).
        weights_layer: the HF decoder layer whose sub-module holds its weights when that
            is not `hf_layer` (Zamba2: a hybrid layer's shared block, and the adapters
            that live beside it, are stored under the first hybrid layer using the same
            copy of the shared weights); None means `hf_layer`.
        post_norm: the block's norm is applied to its output, `x = x + norm(op(x))`
            (OLMo Hybrid's attention layers), instead of to its input.
        residual_alpha, residual_beta: the residual update is
            `alpha * r + beta * op(norm(x))` (r is x, or norm(x) with
            `HfArchitecture.norm_residual`): MiniMax's `*_alpha_factor` / `*_beta_factor`.
    """

    config: BlockConfig
    hf_layer: int
    shared: bool = False
    weights_layer: int | None = None
    post_norm: bool = False
    residual_alpha: float = 1.0
    residual_beta: float = 1.0

    def __post_init__(self) -> None:
        require_non_negative("hf_layer", self.hf_layer)
        if self.weights_layer is not None:
            require_non_negative("weights_layer", self.weights_layer)
        require_finite(self, "residual_alpha", "residual_beta")

    @property
    def source_layer(self) -> int:
        """The HF decoder layer holding this block's weights."""
        return self.hf_layer if self.weights_layer is None else self.weights_layer

    @property
    def kind(self) -> str:
        return self.config.kind


@dataclass(frozen=True)
class Scales:
    """Scalar multipliers of muP-trained models (Granite 4.0-H, FalconH1); 1.0 is none.

    Attributes:
        embedding: the token embeddings are multiplied by it before the first block.
        residual: every block's output is multiplied by it before the residual add.
        logits: the LM head's logits are multiplied by it (Granite: 1 / logits_scaling).
    """

    embedding: float = 1.0
    residual: float = 1.0
    logits: float = 1.0

    def __post_init__(self) -> None:
        for name in ("embedding", "residual", "logits"):
            if not getattr(self, name) > 0:
                raise ValueError(f"scale {name} must be > 0, got {getattr(self, name)}")


DEFAULT_CONTEXT_LIMIT: Final = 4096
"""Context limit of a model whose config sets no `max_position_embeddings`."""


@dataclass(frozen=True)
class HfArchitecture:
    """Everything both the cost model and the engine read from one HF config.

    Attributes:
        family: the HF `model_type`.
        vocab_size: rows of the embedding table.
        hidden_size: the residual width D.
        blocks: the operators in execution order (non-empty).
        norm_eps: epsilon of the model's RMS/layer norms.
        tie_embeddings: the LM head reuses the embedding table.
        max_position: the context limit in tokens; None when the config sets none.
        eos_token_ids: token ids that end generation.
        parallel_mixers: the mixers of one HF layer read the same normed input and their
            outputs are summed (FalconH1) instead of running one after the other.
        unit_offset_norms: the RMSNorm weights are stored zero-centred, the scale is
            (1 + w) (Qwen3.5, Qwen3-Next: the block, final and q/k norms; not the gated
            norm inside Gated DeltaNet).
        weights_prefix: the checkpoint prefix of the language model's weights when the
            checkpoint wraps it (Qwen3.5's multimodal `model.language_model.`); "" lets the
            loader try the usual `model.` / `backbone.` / none.
        skipped_weights: checkpoint key prefixes the language model does not use (the
            vision tower of a multimodal checkpoint, multi-token-prediction layers),
            skipped by the loader.
        mtp_layers: multi-token-prediction steps the checkpoint carries under `mtp.`
            (Qwen3.5 / Qwen3-Next `mtp_num_hidden_layers`, NemotronH
            `num_nextn_predict_layers`; 0: none). They do not run in the model's forward:
            the `mtp` speculative drafter loads them.
        mtp_blocks: the block kinds of one step, in order (`KIND_ATTENTION`, `KIND_MOE`,
            `KIND_MLP`), with the model's own configs of those kinds.
        scales: the scalar multipliers of muP-trained models (all 1 for the others).
        logits_soft_cap: the logits are cap * tanh(logits / cap) (RecurrentGemma); None:
            not capped.
        norm_residual: each block's residual is its normed input, not the stream itself:
            `x = alpha * norm(x) + beta * op(norm(x))` (MiniMax's post-norm layers).
        sandwich_norms: every block also norms its output, `x = x + post(op(norm(x)))`
            (LFM3's `use_sandwich_norm`: post_operator_norm / post_ffn_norm).
    """

    family: str
    vocab_size: int
    hidden_size: int
    blocks: tuple[Block, ...]
    norm_eps: float
    tie_embeddings: bool
    max_position: int | None
    eos_token_ids: tuple[int, ...] = ()
    parallel_mixers: bool = False
    unit_offset_norms: bool = False
    weights_prefix: str = ""
    skipped_weights: tuple[str, ...] = ()
    mtp_layers: int = 0
    mtp_blocks: tuple[str, ...] = ()
    scales: Scales = Scales()
    logits_soft_cap: float | None = None
    norm_residual: bool = False
    sandwich_norms: bool = False

    def __post_init__(self) -> None:
        if not self.blocks:
            raise ValueError(f"{self.family} config describes no layers")

    @property
    def context_limit(self) -> int:
        """The context limit the serving stack enforces: `max_position`, or
        `DEFAULT_CONTEXT_LIMIT` when the config sets none."""
        return self.max_position or DEFAULT_CONTEXT_LIMIT

    def configs_of(self, kind: str) -> tuple[BlockConfig, ...]:
        """The distinct configs of the blocks of `kind`, in order of first use."""
        return tuple(dict.fromkeys(b.config for b in self.blocks if b.kind == kind))
