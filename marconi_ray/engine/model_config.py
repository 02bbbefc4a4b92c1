"""`HybridConfig`: the engine's view of a hybrid decoder, derived from one HF config parse.

The model is a flat list of *blocks*; each block is `x = x + mixer(norm(x))` with one
mixer kind: `mamba2`, `mamba1`, `gdn` (Gated DeltaNet), `attention`, `mlp` or `moe`.
NemotronH maps one HF layer to one block (pattern string `M`, `*`, `-`, `E`); Bamba,
Jamba, Granite 4.0-H, Qwen3.5 and Qwen3-Next map each HF decoder layer to two blocks (the
mixer with `input_layernorm`, then the feed-forward with `pre_ff_layernorm` /
`post_attention_layernorm`; Granite's MoE block runs its experts and its shared MLP).

The per-mixer configs (`AttentionConfig`, `MLPConfig`, `MoEConfig`, `Mamba2Config`,
`Mamba1Config`, `GatedDeltaNetConfig`)
are the core's `marconi_ray.core.hf_arch` dataclasses, re-exported: the config keys are
interpreted once, in `marconi_ray.core.hf_families`, and `marconi_ray.engine.hf_families`
derives a `HybridConfig` from that parse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from marconi_ray.core.hf_arch import (
    AttentionConfig,
    GatedDeltaNetConfig,
    Mamba1Config,
    Mamba2Config,
    MLPConfig,
    MoEConfig,
    Scales,
)

__all__ = [
    "BLOCK_KINDS",
    "PATTERN_CHARS",
    "AttentionConfig",
    "GatedDeltaNetConfig",
    "HybridConfig",
    "MLPConfig",
    "Mamba1Config",
    "Mamba2Config",
    "MoEConfig",
    "Scales",
]

BLOCK_KINDS = ("mamba2", "mamba1", "gdn", "attention", "mlp", "moe")
PATTERN_CHARS = {
    "M": "mamba2",
    "S": "mamba1",
    "G": "gdn",
    "*": "attention",
    "-": "mlp",
    "E": "moe",
}


@dataclass(frozen=True)
class HybridConfig:
    """Everything the engine needs to build and shard one hybrid model.

    Attributes:
        family: the HF `model_type` it came from (see `engine.hf_families.FAMILIES`).
        blocks: block kinds in execution order (values of `BLOCK_KINDS`).
        hf_layer: for each block, the index of the HF decoder layer holding its weights.
        max_position: the context limit in tokens.
        eos_token_ids: token ids that end generation (unless `ignore_eos`).
        unit_offset_norms: RMSNorm scales are (1 + weight) (Qwen3.5, Qwen3-Next).
        weights_prefix: checkpoint prefix of the language model ("" = the usual ones).
        skipped_weights: checkpoint key prefixes the engine does not load (vision).
        scales: embedding, residual and logit multipliers (muP models; all 1 otherwise).
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
    tie_embeddings: bool = False
    max_position: int = 4096
    eos_token_ids: tuple[int, ...] = ()
    unit_offset_norms: bool = False
    weights_prefix: str = ""
    skipped_weights: tuple[str, ...] = ()
    scales: Scales = field(default_factory=Scales)

    def __post_init__(self) -> None:
        for kind in self.blocks:
            if kind not in BLOCK_KINDS:
                raise ValueError(f"unknown block kind {kind!r}; known: {BLOCK_KINDS}")
        if len(self.hf_layer) != len(self.blocks):
            raise ValueError("hf_layer must give one HF layer index per block")
        needs = {
            "attention": self.attention,
            "mlp": self.mlp,
            "mamba2": self.mamba2,
            "mamba1": self.mamba1,
            "gdn": self.gdn,
            "moe": self.moe,
        }
        for kind in set(self.blocks):
            if needs[kind] is None:
                raise ValueError(f"blocks use {kind!r} but its config is missing")

    @property
    def pattern(self) -> str:
        """The blocks as a NemotronH-style pattern string (`S` Mamba-1, `G` Gated DeltaNet,
        `E` mixture of experts)."""
        char = {v: k for k, v in PATTERN_CHARS.items()}
        return "".join(char[k] for k in self.blocks)

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
        if self.moe is not None and "moe" in self.blocks:
            sizes["moe_intermediate_size"] = self.moe.intermediate_size
            if self.moe.n_shared_experts:
                sizes["shared_expert_intermediate_size"] = self.moe.shared_intermediate_size
        for name, size in sizes.items():
            if size % world:
                raise ValueError(f"{name}={size} is not divisible by tensor-parallel size {world}")
