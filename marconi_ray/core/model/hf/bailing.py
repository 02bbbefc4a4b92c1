"""Ling hybrid's config parser (`bailing_hybrid`: Ling 2.5 / 2.6 / 3.0): KDA and MLA
layers, a dense MLP or a mixture of experts.

Mirrors `BailingHybridConfig.__post_init__` and `BailingHybridModel` (transformers 5.x).
Each decoder layer is a KDA mixer ("linear_attention") or latent attention
("full_attention"; without `layer_types` the last layer of every `layer_group_size`),
then a SwiGLU MLP ("dense"; without `mlp_layer_types` the first `first_k_dense_replace`
layers) or a DeepSeek-V3 MoE ("sparse"). Where it differs from Kimi Linear:

- KDA: q/k/v have `num_attention_heads` heads of `head_dim` (`linear_num_heads`,
  `linear_head_dim`, `linear_conv_kernel_dim` override them when present, as in the
  config.json transformers writes, whose `head_dim` is then `qk_rope_head_dim`); the
  decay and output gate are full-rank projections; with `kda_safe_gate` the decay is
  bounded below by `kda_lower_bound`.
- MLA: RoPE (interleaved, base `rope_parameters.rope_theta`) on the qk_rope channels and
  a per-head sigmoid output gate.
- MoE: the same router; `expert_swiglu_limit_list` / `share_expert_swiglu_limit_list`
  clip the experts' SwiGLU, which the engine does not do: only zero limits are accepted.
- `num_mtp_layers` (`num_nextn_predict_layers`) extra layers are stored after the decoder
  and not run by causal inference: they are ignored.

Ling 2.5 / 2.6 checkpoints share the model_type but not the architecture (their
`architectures` is `BailingMoeV2_5ForCausalLM`: lightning-style linear attention with a
fused `query_key_value`, not KDA); transformers' class would read them as KDA, so they are
refused rather than parsed into the wrong layers.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from marconi_ray.core.model.hf.arch import HfArchitecture
from marconi_ray.core.model.hf.blocks import ATTENTION, MAMBA, rope
from marconi_ray.core.model.hf.kda_arch import KDAConfig
from marconi_ray.core.model.hf.kda_mla_layers import DENSE, SPARSE, kda_mla_stack
from marconi_ray.core.model.hf.mla_arch import MLAConfig
from marconi_ray.core.model.hf.reader import ConfigReader

"""`mlp_layer_types` entries."""
LING_2_5_ARCHITECTURE: Final = "BailingMoeV2_5ForCausalLM"
"""The `architectures` entry of Ling 2.5 / 2.6 checkpoints (see the module docstring)."""

BAILING_HYBRID: Final[Mapping[str, object]] = MappingProxyType(
    {
        "vocab_size": 157184,
        "hidden_size": 2560,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_hidden_layers": 42,
        "num_attention_heads": 32,
        "n_shared_experts": 1,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "n_group": 8,
        "topk_group": 4,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 2,
        "norm_topk_prob": True,
        "hidden_act": "silu",
        "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6,
        "eos_token_id": 156895,
        "tie_word_embeddings": False,
        "rope_parameters": None,
        "attention_bias": False,
        "num_local_experts": 512,
        "rope_theta": 6_000_000.0,
        "head_dim": 128,
        "short_conv_kernel_size": 4,
        "layer_group_size": 6,
        "kda_safe_gate": True,
        "kda_lower_bound": -5.0,
        "layer_types": None,
        "mlp_layer_types": None,
        "expert_swiglu_limit_list": None,
        "share_expert_swiglu_limit_list": None,
    }
)
"""`BailingHybridConfig`'s defaults (transformers 5.25). A null `rope_parameters` is
{"rope_type": "default", "rope_theta": rope_theta}."""
BAILING_HYBRID_ALIASES: Final[Mapping[str, tuple[str, ...]]] = MappingProxyType(
    {
        "max_position_embeddings": ("model_max_length",),
        "norm_topk_prob": ("moe_renormalize",),
        "n_group": ("num_expert_group",),
        "num_local_experts": ("num_experts",),
        "num_experts_per_tok": ("num_experts_per_token",),
        "n_shared_experts": ("num_shared_experts",),
        "expert_swiglu_limit_list": ("swiglu_limits",),
        "share_expert_swiglu_limit_list": ("swiglu_limits_shared",),
    }
)
"""`BailingHybridConfig.attribute_map`: the names its config.json files use."""


def _linear(r: ConfigReader, key: str, fallback: str) -> int:
    """A KDA size: the `linear_*` key when the config has it, else the key it derives from."""
    return r.pos_int(key if r.has(key) else fallback)


def _types(r: ConfigReader, key: str, allowed: tuple[str, str], derived: list[str]) -> list[str]:
    """`key`'s per-layer list (null: `derived`), each entry one of `allowed`."""
    raw = r.opt_str_list(key)
    raw = derived if raw is None else raw
    if len(raw) != len(derived) or set(raw) - set(allowed):
        raise ValueError(
            f"{r.family} config key {key!r} must give {allowed[0]!r} or {allowed[1]!r} for "
            f"each of {len(derived)} layers, got {raw!r}"
        )
    return raw


def _check_no_clipping(r: ConfigReader, key: str, n_layers: int) -> None:
    """`key` is null or one zero limit per layer (no SwiGLU clipping)."""
    value = r.raw(key)
    if value is None:
        return
    if not isinstance(value, list) or len(value) != n_layers:
        raise ValueError(
            f"{r.family} config key {key!r} must hold one limit per each of {n_layers} "
            f"layers, got {value!r}"
        )
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or v != 0 for v in value):
        raise ValueError(
            f"{r.family} config key {key!r} is {value!r}; only zero limits (no SwiGLU "
            "clipping) are supported"
        )


def _rope_theta(r: ConfigReader, config: Mapping[str, object], rotary: int) -> float:
    """The MLA RoPE base: `rope_parameters` (default type only), null meaning
    {"rope_theta": rope_theta}; a legacy `rope_scaling` (which transformers turns into
    `rope_parameters`, e.g. YaRN) is refused unless it is the default type."""
    legacy = config.get("rope_scaling")
    if legacy is not None:
        kind = legacy.get("rope_type", legacy.get("type")) if isinstance(legacy, Mapping) else None
        if kind != "default":
            raise ValueError(
                f"{r.family} config key 'rope_scaling' is {legacy!r}; only the default RoPE "
                "is supported"
            )
    if r.raw("rope_parameters") is None:
        return r.req_float("rope_theta")
    _, theta, rope_type = rope(r, rotary)
    if rope_type != "default":
        raise ValueError(
            f"{r.family} config key 'rope_parameters' has rope_type {rope_type!r}; only "
            "'default' is supported"
        )
    return theta


def parse_bailing_hybrid(config: Mapping[str, object]) -> HfArchitecture:
    """Ling hybrid: per layer a KDA mixer or MLA, then a dense MLP or the MoE."""
    r = ConfigReader(config, BAILING_HYBRID, "bailing_hybrid", BAILING_HYBRID_ALIASES)
    architectures = config.get("architectures")
    if isinstance(architectures, list) and LING_2_5_ARCHITECTURE in architectures:
        raise ValueError(
            f"bailing_hybrid config key 'architectures' is {architectures!r}: Ling 2.5 / 2.6 "
            "(lightning linear attention + MLA) is not the KDA model transformers' "
            "bailing_hybrid implements"
        )
    n_layers = r.pos_int("num_hidden_layers")
    group = r.pos_int("layer_group_size")
    types = _types(
        r,
        "layer_types",
        (MAMBA, ATTENTION),
        [ATTENTION if (i + 1) % group == 0 else MAMBA for i in range(n_layers)],
    )
    k_dense = r.req_int("first_k_dense_replace")
    mlp_types = _types(
        r,
        "mlp_layer_types",
        (DENSE, SPARSE),
        [DENSE if i < k_dense else SPARSE for i in range(n_layers)],
    )
    for key in ("expert_swiglu_limit_list", "share_expert_swiglu_limit_list"):
        _check_no_clipping(r, key, n_layers)
    act = r.req_str("hidden_act")
    kda = mla = None
    if MAMBA in types:
        if act != "silu":
            raise ValueError(
                f"{r.family} config key 'hidden_act' is {act!r}; KDA's short conv supports "
                "only 'silu'"
            )
        safe = r.flag("kda_safe_gate")
        kda = KDAConfig(
            n_heads=_linear(r, "linear_num_heads", "num_attention_heads"),
            head_dim=_linear(r, "linear_head_dim", "head_dim"),
            d_conv=_linear(r, "linear_conv_kernel_dim", "short_conv_kernel_size"),
            low_rank_gates=False,
            gate_lower_bound=r.req_float("kda_lower_bound") if safe else None,
        )
    if ATTENTION in types:
        rotary = r.req_int("qk_rope_head_dim")
        mla = MLAConfig(
            n_heads=r.pos_int("num_attention_heads"),
            kv_lora_rank=r.req_int("kv_lora_rank"),
            qk_nope_head_dim=r.req_int("qk_nope_head_dim"),
            qk_rope_head_dim=rotary,
            v_head_dim=r.req_int("v_head_dim"),
            q_lora_rank=r.opt_int("q_lora_rank"),
            bias=r.flag("attention_bias"),
            rope_theta=_rope_theta(r, config, rotary),
            head_gate=True,
        )
    return kda_mla_stack(r, types, mlp_types, kda, mla, act)
