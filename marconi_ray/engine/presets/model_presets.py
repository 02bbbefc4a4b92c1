"""Named random-weight model shapes (`ModelPreset`) and the transformers config keywords
of each family (`family_configs.preset_config` builds the config from them).

A preset is family-neutral: its `pattern` is a NemotronH pattern string (`M` Mamba-2,
`*` attention, `-` MLP). NemotronH uses it as is, one layer per character. Bamba layers are
(mixer + gated MLP) pairs, so a Bamba model gets one layer per mixer (`M` or `*`) of the
pattern; presets are written as alternating mixer/MLP so both families have the same layer
mix. NemotronH MLPs are plain relu2 (`up`, `down`); Bamba MLPs are gated SiLU (`gate`, `up`,
`down`), so Bamba uses 2/3 of the intermediate size (rounded up to a multiple of 64) to
keep the parameter count about the same.

Every MLP has biases (`mlp_bias`): `factory.make_model` uses the last one to lift the
printable logits (all the others stay 0).

FalconH1 (`falcon_kwargs`) has one layer per `M` of the pattern, each running attention and
Mamba-2 in parallel, then Bamba's gated MLP, with the muP multipliers `FALCON_MULTIPLIERS`
(none is 1, so the tests exercise each).

The Gated DeltaNet families (`QWEN_FAMILIES`: Qwen3.5 dense and MoE, text-only or with a
tiny vision tower, and Qwen3-Next) take the preset's widths with their own layer mix (see
`qwen_kwargs`): their MLPs have no biases, so the last layer's attention output bias
lifts the logits instead (`attention_bias`, all zero but that one channel). The
mixture-of-experts hybrids (`MOE_HYBRIDS`: NemotronH with MoE layers, Jamba with
experts, Granite 4.0-H) are described in `engine.presets.moe_presets`.

Zamba2 (see `zamba2_kwargs`) gets one layer per mixer of the pattern: `M` a Mamba-2
layer, `*` a hybrid layer (the shared transformer block, then a Mamba-2), so it has one
Mamba-2 more per attention than the other families. Its shared block is multi-head
(the q/k/v adapters are 2*D wide), with RoPE, q/k/v adapters and `ZAMBA2_MEM_BLOCKS`
copies of the shared weights used in turn, as in the released 2.7B and 7B models. Its
linear layers have biases (`add_bias_linear`): the last Mamba-2's `out_proj` bias lifts
the printable logits (all the others stay 0).

The LFM2 families (`LFM2_FAMILIES`: LFM2 and LFM2-MoE) take the preset's mixers as short
convs (`M`) and attention (`*`), see `lfm2_kwargs`: they have neither MLP nor attention
biases, so the last layer's short-conv `out_proj` bias lifts the logits (`conv_bias`, all
zero but that one channel).

Exact parameter counts (from `count_parameters`, meta device):

| preset          | nemotron_h    | bamba         | falcon_h1     | zamba2        |
|-----------------|---------------|---------------|---------------|---------------|
| tiny            | 230,500       | 305,380       | 267,236       | 408,464       |
| small           | 48,416,640    | 48,426,880    | 46,834,560    | 33,936,512    |
| paper-7b-shape  | 6,820,082,688 | 6,827,576,832 | 7,128,184,832 | 4,954,349,056 |

| preset          | lfm2          | lfm2_moe      |
|-----------------|---------------|---------------|
| tiny            | 264,448       | 265,984       |
| small           | 41,986,816    | 42,019,584    |
| paper-7b-shape  | 5,806,986,240 | 5,807,838,208 |

(Zamba2 has no per-layer MLP: the two copies of its shared block hold its only MLP
weights, so it is the lightest for one layer mix.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from marconi_ray.engine.presets.byte_tokenizer import BOS_ID, BYTE_VOCAB_SIZE, EOS_ID, PAD_ID

BUILD_VERSION: Final = 3
"""Version of how `factory.make_model` builds a preset's weights, written to its record.
Bumped whenever the same preset and seed would give different weights (2: only printable
ASCII rows of the LM head are random; 3: MLP biases, the last one lifting the printable
logits far above every other id's, so sampled text is printable ASCII too), so cached
preset folders are rebuilt."""

QWEN_FAMILIES: Final = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next")
"""The Gated DeltaNet families (see `qwen_kwargs`)."""
LFM2_FAMILIES: Final = ("lfm2", "lfm2_moe")
"""The short-conv families (see `lfm2_kwargs`)."""
MOE_HYBRIDS: Final = ("nemotron_h_moe", "jamba", "granitemoehybrid")
"""The mixture-of-experts hybrids (see `engine.presets.moe_presets`)."""
PURE_SSM_FAMILIES: Final = ("mamba", "falcon_mamba", "mamba2")
"""The pure state-space families, no attention at all (see `engine.presets.ssm_presets`)."""
FAMILIES: Final = (
    "nemotron_h",
    "bamba",
    *QWEN_FAMILIES,
    *MOE_HYBRIDS,
    *LFM2_FAMILIES,
    "falcon_h1",
    "zamba2",
    *PURE_SSM_FAMILIES,
    "olmo_hybrid",
    "recurrent_gemma",
    "kimi_linear",
    "minimax",
    "bailing_hybrid",
    "lfm3",
    "xlstm",
)
"""Model families a preset can be built as: transformers `model_type` names, and
`nemotron_h_moe` (a NemotronH checkpoint with MoE layers)."""
QWEN_ATTENTION_INTERVAL: Final = 4
"""Qwen presets: three Gated DeltaNet layers then one attention layer, repeated (the
released models' `full_attention_interval`), so the last layer is attention."""
ZAMBA2_MEM_BLOCKS: Final = 2
"""Zamba2 presets: copies of the shared block's weights, used by hybrid layers in turn."""
QWEN_EXPERTS: Final = 8
QWEN_TOP_K: Final = 2
LFM2_DENSE_LAYERS: Final = 2
"""LFM2-MoE presets: the first two layers' feed-forwards are dense (LFM2-8B-A1B's
`num_dense_layers`), the rest mixtures of `QWEN_EXPERTS` experts, top `QWEN_TOP_K`."""

FALCON_MULTIPLIERS: Final[Mapping[str, Any]] = MappingProxyType(
    {
        "embedding_multiplier": 2.0,
        "lm_head_multiplier": 0.5,
        "key_multiplier": 0.75,
        "attention_in_multiplier": 1.25,
        "attention_out_multiplier": 0.8,
        "ssm_in_multiplier": 1.5,
        "ssm_out_multiplier": 0.6,
        "ssm_multipliers": (0.75, 1.25, 0.5, 1.5, 0.9),
        "mlp_multipliers": (0.9, 0.7),
    }
)
"""The muP multipliers of every FalconH1 preset (about the spread of the released
models' values, none 1)."""

DTYPE_NAMES: Final = ("float32", "bfloat16", "float16")
"""Weight dtypes a preset can be materialised in (torch dtype names)."""

_PATTERN_CHARS: Final = frozenset("M*-")
_GATED_MULTIPLE: Final = 64


@dataclass(frozen=True)
class ModelPreset:
    """The shape of a hybrid model; see the module docstring for how families use it.

    Contract (checked on construction, ValueError naming the field): `pattern` uses only
    `M`, `*`, `-` and has at least one `M` and one `*`; `mamba_num_heads * mamba_head_dim ==
    2 * hidden_size` (Bamba's d_inner is `mamba_expand=2` times hidden); `hidden_size ==
    num_attention_heads * head_dim`; heads divisible by KV heads; Mamba heads divisible by
    groups; `vocab_size >= BYTE_VOCAB_SIZE`.
    """

    name: str
    pattern: str
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    mamba_num_heads: int
    mamba_head_dim: int
    n_groups: int
    ssm_state_size: int
    conv_kernel: int
    chunk_size: int
    max_position_embeddings: int
    large: bool = False
    """True when materialising the weights needs many GB (`make_model(allow_large=True)`)."""

    def __post_init__(self) -> None:
        if not self.pattern or set(self.pattern) - _PATTERN_CHARS:
            raise ValueError(f"pattern must use only 'M', '*', '-', got {self.pattern!r}")
        if "M" not in self.pattern or "*" not in self.pattern:
            raise ValueError(f"pattern needs an 'M' and a '*', got {self.pattern!r}")
        if self.mamba_num_heads * self.mamba_head_dim != 2 * self.hidden_size:
            raise ValueError(
                f"mamba_num_heads * mamba_head_dim must be 2 * hidden_size, got "
                f"{self.mamba_num_heads} * {self.mamba_head_dim} for hidden {self.hidden_size}"
            )
        if self.num_attention_heads * self.head_dim != self.hidden_size:
            raise ValueError(
                f"num_attention_heads * head_dim must be hidden_size, got "
                f"{self.num_attention_heads} * {self.head_dim} for hidden {self.hidden_size}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads {self.num_key_value_heads} must divide "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.mamba_num_heads % self.n_groups:
            raise ValueError(
                f"n_groups {self.n_groups} must divide mamba_num_heads {self.mamba_num_heads}"
            )
        if self.vocab_size < BYTE_VOCAB_SIZE:
            raise ValueError(f"vocab_size must be >= {BYTE_VOCAB_SIZE}, got {self.vocab_size}")

    @property
    def mixers(self) -> str:
        """The pattern without MLPs: one character per Bamba layer."""
        return self.pattern.replace("-", "")

    @property
    def gated_intermediate_size(self) -> int:
        """Bamba's gated-MLP width: 2/3 of `intermediate_size`, rounded up to 64."""
        return math.ceil(2 * self.intermediate_size / 3 / _GATED_MULTIPLE) * _GATED_MULTIPLE


PRESETS: Final[Mapping[str, ModelPreset]] = MappingProxyType(
    {
        "tiny": ModelPreset(
            name="tiny",
            pattern="M*-M-M*-",
            hidden_size=64,
            intermediate_size=128,
            vocab_size=512,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            mamba_num_heads=4,
            mamba_head_dim=32,
            n_groups=2,
            ssm_state_size=16,
            conv_kernel=4,
            chunk_size=16,
            max_position_embeddings=4096,
        ),
        # The paper's mix (4 attention : 24 Mamba-2 : 28 MLP) scaled to 2 : 8 : 10; every
        # head count and n_groups is even so tensor parallelism over 2 ranks is possible.
        "small": ModelPreset(
            name="small",
            pattern="M-M-*-M-M-" * 2,
            hidden_size=512,
            intermediate_size=3072,
            vocab_size=512,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            mamba_num_heads=16,
            mamba_head_dim=64,
            n_groups=2,
            ssm_state_size=128,
            conv_kernel=4,
            chunk_size=64,
            max_position_embeddings=8192,
        ),
        # The paper's 7B (NVIDIA's 8B Mamba2-Hybrid mix): 4 attention, 24 Mamba-2, 28 MLP
        # layers, in the order of `marconi_ray.core.model.presets.paper_7b`; d_model 4096, d_state
        # 128, Mamba-2 expand 2 (128 heads x 64), 8 groups, GQA 32/8 heads, MLP 4 * d_model.
        "paper-7b-shape": ModelPreset(
            name="paper-7b-shape",
            pattern="M-M-M-*-M-M-M-" * 4,
            hidden_size=4096,
            intermediate_size=16384,
            vocab_size=32000,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            mamba_num_heads=128,
            mamba_head_dim=64,
            n_groups=8,
            ssm_state_size=128,
            conv_kernel=4,
            chunk_size=128,
            max_position_embeddings=8192,
            large=True,
        ),
    }
)
"""Immutable registry of preset name -> `ModelPreset`."""


def get_preset(name: str) -> ModelPreset:
    """The preset called `name`; ValueError naming it and the valid names otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown preset {name!r}; valid presets: {sorted(PRESETS)}") from None


def check_family(family: str) -> str:
    """`family` itself when valid; ValueError naming it and the valid families otherwise."""
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; valid families: {list(FAMILIES)}")
    return family


def common_kwargs(p: ModelPreset, initializer_range: float) -> dict[str, Any]:
    return {
        "vocab_size": p.vocab_size,
        "hidden_size": p.hidden_size,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "max_position_embeddings": p.max_position_embeddings,
        "initializer_range": initializer_range,
        "tie_word_embeddings": False,
        "mlp_bias": True,  # the last MLP's down_proj bias lifts the printable logits
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }


def mamba2_kwargs(p: ModelPreset) -> dict[str, Any]:
    """The `mamba_*` Mamba-2 keys Bamba, FalconH1 and Granite 4.0-H share: the preset's
    heads, head width, groups, state size, conv width and chunk (d_inner set apart: by
    `mamba_expand` or FalconH1's `mamba_d_ssm`)."""
    return {
        "mamba_n_heads": p.mamba_num_heads,
        "mamba_d_head": p.mamba_head_dim,
        "mamba_n_groups": p.n_groups,
        "mamba_d_state": p.ssm_state_size,
        "mamba_d_conv": p.conv_kernel,
        "mamba_chunk_size": p.chunk_size,
    }


def nemotron_h_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.NemotronHConfig` for preset `p`."""
    block = {"M": "linear_attention", "*": "full_attention", "-": "mlp"}
    return {
        **common_kwargs(p, initializer_range),
        "layers_block_type": [block[c] for c in p.pattern],
        "head_dim": p.head_dim,
        "intermediate_size": p.intermediate_size,
        "mlp_hidden_act": "relu2",
        "mamba_num_heads": p.mamba_num_heads,
        "mamba_head_dim": p.mamba_head_dim,
        "n_groups": p.n_groups,
        "ssm_state_size": p.ssm_state_size,
        "conv_kernel": p.conv_kernel,
        "chunk_size": p.chunk_size,
        "expand": 2,
    }


def bamba_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.BambaConfig` for preset `p`."""
    mixers = p.mixers
    return {
        **common_kwargs(p, initializer_range),
        "num_hidden_layers": len(mixers),
        "attn_layer_indices": [i for i, c in enumerate(mixers) if c == "*"],
        "intermediate_size": p.gated_intermediate_size,
        "hidden_act": "silu",
        **mamba2_kwargs(p),
        "mamba_expand": 2,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        },
    }


def qwen_kwargs(p: ModelPreset, family: str, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of the text config of a Qwen3.5 / Qwen3-Next `family` for `p`.

    Layers: `QWEN_ATTENTION_INTERVAL` times the number of whole groups of that many mixers
    in the pattern (at least one group), three Gated DeltaNet layers then one attention
    layer each. Gated DeltaNet: value heads and head widths of the preset's Mamba-2
    (Hv * dv = 2 * hidden), half as many key heads (two value heads per key head). MoE
    families: `QWEN_EXPERTS` experts, top `QWEN_TOP_K`, together as wide as the dense
    gated MLP, and a shared expert of half its width.
    """
    layers = QWEN_ATTENTION_INTERVAL * max(1, len(p.mixers) // QWEN_ATTENTION_INTERVAL)
    out: dict[str, Any] = {
        **common_kwargs(p, initializer_range),
        "num_hidden_layers": layers,
        "head_dim": p.head_dim,
        "intermediate_size": p.gated_intermediate_size,
        "hidden_act": "silu",
        "attention_bias": True,  # zero, but the last layer's lifts the printable logits
        "linear_num_value_heads": p.mamba_num_heads,
        "linear_num_key_heads": p.mamba_num_heads // 2,
        "linear_key_head_dim": p.mamba_head_dim,
        "linear_value_head_dim": p.mamba_head_dim,
        "linear_conv_kernel_dim": p.conv_kernel,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
    }
    del out["mlp_bias"]
    if family in ("qwen3_5_moe_text", "qwen3_5_moe", "qwen3_next"):
        out.update(
            num_experts=QWEN_EXPERTS,
            num_experts_per_tok=QWEN_TOP_K,
            moe_intermediate_size=p.gated_intermediate_size // QWEN_EXPERTS,
            shared_expert_intermediate_size=p.gated_intermediate_size // 2,
        )
    return out


def falcon_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.FalconH1Config` for preset `p`: one layer per
    Mamba-2 (`M`) of the pattern, each with attention (full RoPE), the Mamba-2 and Bamba's
    gated MLP; Mamba-2 as wide as the preset's (d_ssm = 2 * hidden), no gated norm (the
    transformers default), and the multipliers `FALCON_MULTIPLIERS`."""
    return {
        **common_kwargs(p, initializer_range),
        "num_hidden_layers": p.pattern.count("M"),
        "intermediate_size": p.gated_intermediate_size,
        "hidden_act": "silu",
        "mamba_d_ssm": p.mamba_num_heads * p.mamba_head_dim,
        **mamba2_kwargs(p),
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        **{k: list(v) if isinstance(v, tuple) else v for k, v in FALCON_MULTIPLIERS.items()},
    }


def zamba2_kwargs(p: ModelPreset, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.Zamba2Config` for preset `p` (see the module
    docstring): a Mamba-2 layer per `M`, a hybrid layer per `*`; the shared block's MLP
    is the gated width of Bamba's, its adapters of rank hidden/16 (8 to 128)."""
    mixers = p.mixers
    out: dict[str, Any] = {
        **common_kwargs(p, initializer_range),
        "num_hidden_layers": len(mixers),
        "layers_block_type": ["hybrid" if c == "*" else "linear_attention" for c in mixers],
        "num_key_value_heads": p.num_attention_heads,
        "intermediate_size": p.gated_intermediate_size,
        "hidden_act": "gelu",
        "n_mamba_heads": p.mamba_num_heads,
        "mamba_ngroups": p.n_groups,
        "mamba_d_state": p.ssm_state_size,
        "mamba_d_conv": p.conv_kernel,
        "mamba_expand": 2,
        "chunk_size": p.chunk_size,
        "num_mem_blocks": ZAMBA2_MEM_BLOCKS,
        "use_shared_attention_adapter": True,
        "adapter_rank": min(128, max(8, p.hidden_size // 16)),
        "use_mem_rope": True,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "add_bias_linear": True,  # zero, but the last Mamba-2's out_proj lifts the logits
    }
    del out["mlp_bias"]
    return out


def lfm2_kwargs(p: ModelPreset, family: str, initializer_range: float = 0.02) -> dict[str, Any]:
    """Keyword arguments of `transformers.Lfm2Config` / `Lfm2MoeConfig` for preset `p`.

    Layers: one per mixer of the pattern, in reverse order (`M` a short conv, `*`
    attention), so the last layer is a short conv, whose `out_proj` bias lifts the logits
    (`conv_bias`). Short-conv kernel `conv_kernel - 1` (LFM2's 3 for the presets' 4);
    head_dim is hidden / heads, as LFM2 derives it. LFM2's feed-forward width is its own
    auto-adjusted one from `intermediate_size` (2/3, rounded up to a multiple of 64: the
    preset's `gated_intermediate_size`). LFM2-MoE: dense feed-forwards of
    `gated_intermediate_size` in the first `LFM2_DENSE_LAYERS` layers, then `QWEN_EXPERTS`
    experts (top `QWEN_TOP_K`, sigmoid router with a selection bias, renormalised) together
    as wide as the dense one.
    """
    mixers = p.mixers[::-1]
    out: dict[str, Any] = {
        **common_kwargs(p, initializer_range),
        "num_hidden_layers": len(mixers),
        "layer_types": ["full_attention" if c == "*" else "conv" for c in mixers],
        "conv_L_cache": p.conv_kernel - 1,
        "conv_bias": True,  # zero, but the last layer's out_proj lifts the printable logits
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    }
    del out["mlp_bias"]
    if family == "lfm2":
        out.update(
            intermediate_size=p.intermediate_size,
            block_auto_adjust_ff_dim=True,
            block_ffn_dim_multiplier=1.0,
            block_multiple_of=_GATED_MULTIPLE,
        )
    else:
        out.update(
            intermediate_size=p.gated_intermediate_size,
            num_dense_layers=LFM2_DENSE_LAYERS,
            num_experts=QWEN_EXPERTS,
            num_experts_per_tok=QWEN_TOP_K,
            moe_intermediate_size=p.gated_intermediate_size // QWEN_EXPERTS,
            use_expert_bias=True,
            norm_topk_prob=True,
        )
    return out
