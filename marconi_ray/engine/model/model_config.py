"""`HybridConfig`: the engine's view of a hybrid decoder, derived from one HF config parse.

The model is a flat list of *blocks*; each block is `x = x + mixer(norm(x))` with one
mixer kind: `mamba2`, `mamba1`, `gdn` (Gated DeltaNet), `shortconv` (LFM2's gated short
conv), `rglru` (RecurrentGemma's RG-LRU block), `attention`, `swa` (sliding-window
attention), `mlp` or `moe`, except `shared_transformer` (Zamba2's shared block,
see `SharedBlockConfig`), whose output is added to the next block's input instead of the
residual stream.
conv), `lightning` (MiniMax's lightning attention), `attention`, `mlp` or `moe`, except
`shared_transformer` (Zamba2's shared block, see `SharedBlockConfig`), whose output is
added to the next block's input instead of the residual stream. MiniMax's blocks are
`x = alpha * norm(x) + beta * mixer(norm(x))` (`norm_residual`, `residual_factors`).
NemotronH maps one HF layer to one block (pattern string `M`, `*`, `-`, `E`); Bamba,
Jamba, Granite 4.0-H, Qwen3.5, Qwen3-Next and LFM2 map each HF decoder layer to two
blocks (the mixer with `input_layernorm`, then the feed-forward with `pre_ff_layernorm` /
`post_attention_layernorm`; Granite's MoE block runs its experts and its shared MLP).
FalconH1 maps each layer to three blocks (attention, then
Mamba-2, then the gated MLP) with `parallel_mixers`: its attention and Mamba-2 blocks form
one residual group (`residual_groups`) that reads one normed input and adds the sum of
both outputs to the residual stream.

The per-mixer configs (`AttentionConfig`, `MLPConfig`, `MoEConfig`, `Mamba2Config`,
`Mamba1Config`, `GatedDeltaNetConfig`)
are the core's `marconi_ray.core.model.hf.arch` dataclasses, re-exported: the config keys are
interpreted once, in `marconi_ray.core.model.hf.families`, and `marconi_ray.engine.model.from_hf`
derives a `HybridConfig` from that parse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    GatedDeltaNetConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    MoEConfig,
    RGLRUConfig,
    Scales,
    ShortConvConfig,
    SlidingAttentionConfig,
)
from marconi_ray.core.model.hf.kda_arch import KDAConfig
from marconi_ray.core.model.hf.lightning import LightningConfig
from marconi_ray.core.model.hf.mla_arch import MLAConfig
from marconi_ray.core.model.hf.mlstm_arch import MLSTMConfig

__all__ = [
    "BLOCK_KINDS",
    "FEED_FORWARD_KINDS",
    "PATTERN_CHARS",
    "AttentionConfig",
    "GatedDeltaNetConfig",
    "HybridConfig",
    "KDAConfig",
    "LightningConfig",
    "MLAConfig",
    "MLPConfig",
    "MLSTMConfig",
    "Mamba1Config",
    "Mamba2Config",
    "MoEConfig",
    "RGLRUConfig",
    "Scales",
    "SharedBlockConfig",
    "ShortConvConfig",
    "SlidingAttentionConfig",
]

BLOCK_KINDS = (
    "mamba2",
    "mamba1",
    "gdn",
    "shortconv",
    "attention",
    "mlp",
    "moe",
    "shared_transformer",
    "rglru",
    "swa",
    "kda",
    "mla",
    "lightning",
    "mlstm",
)
FEED_FORWARD_KINDS = ("mlp", "moe")
PATTERN_CHARS = {
    "M": "mamba2",
    "S": "mamba1",
    "G": "gdn",
    "C": "shortconv",
    "*": "attention",
    "-": "mlp",
    "E": "moe",
    "Z": "shared_transformer",
    "R": "rglru",
    "W": "swa",
    "K": "kda",
    "A": "mla",
    "L": "lightning",
    "X": "mlstm",
}


@dataclass(frozen=True)
class SharedBlockConfig:
    """Zamba2's shared transformer block, run by every hybrid layer before its Mamba-2.

    With x the residual stream [L, D] and e the token embeddings [L, D]:
    `h = RMSNorm_2D([x, e])`; `a = attention(h)` (q/k/v read the 2*D input, each plus its
    per-layer LoRA adapter `B(A(h))` when `qkv_adapters`; o writes D); `m = down(act(g) *
    u)` where `[g, u] = gate_up(n) + B(A(n))`, `n = RMSNorm_D(a)`; the block's output is
    `linear(m)` (a per-layer D x D), added to the input of the layer's Mamba-2 (before its
    norm), not to the residual stream. Attention, MLP and both norms are shared; the
    adapters (rank `adapter_rank`) and the linear belong to each hybrid layer.
    """

    attention: AttentionConfig
    mlp: MLPConfig
    adapter_rank: int
    qkv_adapters: bool


@dataclass(frozen=True)
class HybridConfig:
    """Everything the engine needs to build and shard one hybrid model.

    Attributes:
        family: the HF `model_type` it came from (see `engine.model.from_hf.FAMILIES`).
        blocks: block kinds in execution order (values of `BLOCK_KINDS`).
        hf_layer: for each block, the index of the HF decoder layer holding its weights.
        max_position: the context limit in tokens.
        eos_token_ids: token ids that end generation (unless `ignore_eos`).
        unit_offset_norms: RMSNorm scales are (1 + weight) (Qwen3.5, Qwen3-Next).
        weights_prefix: checkpoint prefix of the language model ("" = the usual ones).
        skipped_weights: checkpoint key prefixes the engine does not load (vision, MTP).
        mtp_layers: multi-token-prediction steps under `mtp.` (see `engine.model.mtp`).
        mtp_blocks: the block kinds of one MTP step (attention, moe, mlp), in order.
        scales: embedding, residual and logit multipliers (muP models; all 1 otherwise).
        parallel_mixers: consecutive mixer blocks (not mlp / moe) of one HF layer read
            the same normed input and their outputs are summed (FalconH1); see
            `residual_groups`.
        shared: the config of the `shared_transformer` blocks (Zamba2).
        weights_layer: per block, the HF layer whose sub-module holds its weights (empty:
            `hf_layer`); a shared block's is the first hybrid layer using its copy.
        post_norm: per block, its norm applies to its output, `x = x + norm(mixer(x))`
            (OLMo Hybrid's attention layers); empty: every block is pre-norm.
        rglru: the config of the `rglru` blocks (RecurrentGemma's recurrent block).
        swa: the config of the `swa` blocks (sliding-window attention), apart from
            `attention` so a model may hold both.
        logits_soft_cap: the logits are cap * tanh(logits / cap); None: not capped.
        lightning: the config of the `lightning` blocks (MiniMax lightning attention).
        residual_alpha, residual_beta: per block, the residual update is
            `alpha * r + beta * mixer(norm(x))` (empty: all 1; MiniMax's factors).
        norm_residual: r is the block's normed input, not the stream (MiniMax's
            post-norm layers); otherwise r = x.
        sandwich_norm: every block's output is normed too, `x = x + post(mixer(norm(x)))`
            (LFM3; the post norms' names are `HFNames.post_norms`).
        mlstm: the config of the `mlstm` blocks (xLSTM's mLSTM layer).
    """

    family: str
    vocab_size: int
    hidden_size: int
    blocks: tuple[str, ...]
    hf_layer: tuple[int, ...]
    norm_eps: float
    attention: AttentionConfig | None
    mlp: MLPConfig | None
    mamba2: Mamba2Config | None
    mamba1: Mamba1Config | None
    gdn: GatedDeltaNetConfig | None = None
    moe: MoEConfig | None = None
    shortconv: ShortConvConfig | None = None
    tie_embeddings: bool = False
    max_position: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    unit_offset_norms: bool = False
    weights_prefix: str = ""
    skipped_weights: tuple[str, ...] = ()
    mtp_layers: int = 0
    mtp_blocks: tuple[str, ...] = ()
    scales: Scales = field(default_factory=Scales)
    parallel_mixers: bool = False
    shared: SharedBlockConfig | None = None
    weights_layer: tuple[int, ...] = ()
    post_norm: tuple[bool, ...] = ()
    rglru: RGLRUConfig | None = None
    swa: SlidingAttentionConfig | None = None
    logits_soft_cap: float | None = None
    kda: KDAConfig | None = None
    mla: MLAConfig | None = None
    lightning: LightningConfig | None = None
    residual_alpha: tuple[float, ...] = ()
    residual_beta: tuple[float, ...] = ()
    norm_residual: bool = False
    sandwich_norm: bool = False
    mlstm: MLSTMConfig | None = None

    def __post_init__(self) -> None:
        for kind in self.blocks:
            if kind not in BLOCK_KINDS:
                raise ValueError(f"unknown block kind {kind!r}; known: {BLOCK_KINDS}")
        if len(self.hf_layer) != len(self.blocks):
            raise ValueError("hf_layer must give one HF layer index per block")
        if self.weights_layer and len(self.weights_layer) != len(self.blocks):
            raise ValueError("weights_layer must give one HF layer index per block (or none)")
        if self.post_norm and len(self.post_norm) != len(self.blocks):
            raise ValueError("post_norm must give one flag per block (or none)")
        if any(self.post_norm) and self.parallel_mixers:
            raise ValueError("post-norm blocks cannot run as parallel mixers")
        if self.sandwich_norm and (any(self.post_norm) or self.parallel_mixers):
            raise ValueError("sandwich norms exclude post-norm blocks and parallel mixers")
        for name in ("residual_alpha", "residual_beta"):
            if getattr(self, name) and len(getattr(self, name)) != len(self.blocks):
                raise ValueError(f"{name} must give one factor per block (or none)")
        needs = {
            "attention": self.attention,
            "mlp": self.mlp,
            "mamba2": self.mamba2,
            "mamba1": self.mamba1,
            "gdn": self.gdn,
            "moe": self.moe,
            "shared_transformer": self.shared,
            "shortconv": self.shortconv,
            "rglru": self.rglru,
            "swa": self.swa,
            "kda": self.kda,
            "mla": self.mla,
            "lightning": self.lightning,
            "mlstm": self.mlstm,
        }
        for kind in set(self.blocks):
            if needs[kind] is None:
                raise ValueError(f"blocks use {kind!r} but its config is missing")

    @property
    def pattern(self) -> str:
        """The blocks as a NemotronH-style pattern string (`S` Mamba-1, `G` Gated DeltaNet,
        `C` short conv, `E` mixture of experts)."""
        char = {v: k for k, v in PATTERN_CHARS.items()}
        return "".join(char[k] for k in self.blocks)

    @property
    def residual_groups(self) -> tuple[tuple[int, ...], ...]:
        """Block indices, in order, grouped by residual update: a group's first block
        owns the norm, every block of the group reads that normed input, and the sum of
        their outputs is added to the residual stream. Each block is its own group,
        unless `parallel_mixers`: then consecutive mixer blocks of one HF layer share a
        group (FalconH1: (attention, mamba2), then (mlp,) per layer)."""
        groups: list[list[int]] = []
        for i, kind in enumerate(self.blocks):
            joins = (
                self.parallel_mixers
                and i > 0
                and kind not in FEED_FORWARD_KINDS
                and self.blocks[i - 1] not in FEED_FORWARD_KINDS
                and self.hf_layer[i] == self.hf_layer[i - 1]
            )
            if joins:
                groups[-1].append(i)
            else:
                groups.append([i])
        return tuple(tuple(g) for g in groups)

    def is_post_norm(self, index: int) -> bool:
        """Block `index` normalises its output rather than its input."""
        return bool(self.post_norm) and self.post_norm[index]

    def residual_factors(self, index: int) -> tuple[float, float]:
        """(alpha, beta) of block `index`'s residual update (1, 1 when none are set)."""
        alpha = self.residual_alpha[index] if self.residual_alpha else 1.0
        beta = self.residual_beta[index] if self.residual_beta else 1.0
        return alpha, beta

    def source_layer(self, index: int) -> int:
        """The HF layer whose sub-module holds block `index`'s weights."""
        return self.weights_layer[index] if self.weights_layer else self.hf_layer[index]

    @property
    def shared_copies(self) -> tuple[int, ...]:
        """The source layers of the distinct copies of the shared block, in order of use."""
        blocks = self.layers_of("shared_transformer")
        return tuple(dict.fromkeys(self.source_layer(i) for i in blocks))

    @property
    def hybrid_layers(self) -> tuple[int, ...]:
        """The HF layers that run a shared block (Zamba2's "hybrid" layers), in order."""
        return tuple(self.hf_layer[i] for i in self.layers_of("shared_transformer"))

    def layers_of(self, kind: str) -> list[int]:
        """Block indices of one kind, in order."""
        return [i for i, k in enumerate(self.blocks) if k == kind]

    def check_tp(self, world: int) -> None:
        """Raise ValueError naming the size that `world` tensor-parallel ranks cannot split."""
        if world < 1:
            raise ValueError(f"tensor-parallel world size must be >= 1, got {world}")
        sizes: dict[str, int] = {}
        if self.attention is not None and "attention" in self.blocks:
            sizes["num_attention_heads"] = self.attention.n_heads
            sizes["num_key_value_heads"] = self.attention.n_kv_heads
        if self.mlp is not None and "mlp" in self.blocks:
            sizes["intermediate_size"] = self.mlp.intermediate_size
        if self.mamba2 is not None and "mamba2" in self.blocks:
            sizes["mamba_num_heads"] = self.mamba2.n_heads
        if self.mamba1 is not None and "mamba1" in self.blocks:
            sizes["mamba_d_inner"] = self.mamba1.d_inner
        if self.gdn is not None and "gdn" in self.blocks:
            sizes["linear_num_key_heads"] = self.gdn.n_k_heads
            sizes["linear_num_value_heads"] = self.gdn.n_v_heads
        if self.shared is not None and "shared_transformer" in self.blocks:
            sizes["num_attention_heads"] = self.shared.attention.n_heads
            sizes["num_key_value_heads"] = self.shared.attention.n_kv_heads
            sizes["intermediate_size"] = self.shared.mlp.intermediate_size
        if self.shortconv is not None and "shortconv" in self.blocks:
            sizes["hidden_size (short-conv channels)"] = self.hidden_size
        if self.rglru is not None and "rglru" in self.blocks:
            sizes["num_attention_heads (RG-LRU gate blocks)"] = self.rglru.n_heads
        if self.swa is not None and "swa" in self.blocks:
            sizes["num_attention_heads (windowed)"] = self.swa.attention.n_heads
            sizes["num_key_value_heads (windowed)"] = self.swa.attention.n_kv_heads
        if self.lightning is not None and "lightning" in self.blocks:
            sizes["num_attention_heads (lightning)"] = self.lightning.n_heads
        if self.mlstm is not None and "mlstm" in self.blocks:
            sizes["num_heads (mLSTM)"] = self.mlstm.n_heads
        if self.moe is not None and "moe" in self.blocks:
            sizes["moe_intermediate_size"] = self.moe.intermediate_size
            if self.moe.n_shared_experts:
                sizes["shared_expert_intermediate_size"] = self.moe.shared_intermediate_size
        if self.kda is not None and "kda" in self.blocks:
            sizes["linear_attn_config.num_heads"] = self.kda.n_heads
        if self.mla is not None and "mla" in self.blocks:
            sizes["num_attention_heads (MLA)"] = self.mla.n_heads
        for name, size in sizes.items():
            if size % world:
                raise ValueError(f"{name}={size} is not divisible by tensor-parallel size {world}")
