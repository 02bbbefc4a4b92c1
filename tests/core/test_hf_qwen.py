"""Qwen3.5 (dense, MoE, multimodal) and Qwen3-Next parses, on configs built by transformers'
own config classes (configs only; `test_qwen_modules.py` checks the same parses against the
transformers modules)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from transformers import (
    Qwen3_5Config,
    Qwen3_5MoeConfig,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
)

from marconi_ray.core.model.hf.arch import (
    AttentionConfig,
    GatedDeltaNetConfig,
    HfArchitecture,
    MLPConfig,
    MoEConfig,
)
from marconi_ray.core.model.hf.parse import parse_hf_config, spec_from_hf_config
from marconi_ray.core.model.layers import GatedDeltaNetLayer, MoELayer

QWEN_FAMILIES: dict[str, Callable[..., Any]] = {
    "qwen3_5_text": Qwen3_5TextConfig,
    "qwen3_5": Qwen3_5Config,
    "qwen3_5_moe_text": Qwen3_5MoeTextConfig,
    "qwen3_5_moe": Qwen3_5MoeConfig,
    "qwen3_next": Qwen3NextConfig,
}
TEXT_CLASSES: dict[str, Callable[..., Any]] = {
    "qwen3_5_text": Qwen3_5TextConfig,
    "qwen3_5_moe_text": Qwen3_5MoeTextConfig,
    "qwen3_next": Qwen3NextConfig,
}
# Small shapes every text family accepts (the MoE keys are ignored by the dense one).
TINY: dict[str, Any] = {
    "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 6, "linear_key_head_dim": 8, "linear_value_head_dim": 12,
    "linear_conv_kernel_dim": 3, "num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40,
}  # fmt: skip
HF_KIND = {"linear_attention": "gdn", "full_attention": "attention"}


def tiny(model_type: str, **overrides: Any) -> dict[str, Any]:
    """`config_class(**TINY, **overrides).to_dict()` of a text family."""
    cls = TEXT_CLASSES[model_type]
    kwargs = {**TINY, **overrides}
    if model_type == "qwen3_5_text":
        for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size"):
            kwargs.pop(key)
        kwargs.pop("shared_expert_intermediate_size")
    return dict(cls(**kwargs).to_dict())


def mixer_kinds(arch: HfArchitecture) -> list[str]:
    """The token mixer of each HF layer, in order."""
    return [b.kind for b in arch.blocks if b.kind in ("gdn", "attention")]


def ffn_kinds(arch: HfArchitecture) -> list[str]:
    return [b.kind for b in arch.blocks if b.kind in ("mlp", "moe")]


@pytest.mark.parametrize("model_type", sorted(QWEN_FAMILIES))
def test_bare_config_parses_like_the_class_defaults(model_type: str) -> None:
    """Every field of a bare {"model_type": ...} equals the parse of the config class's own
    defaults: hf.defaults matches transformers for the Qwen families too."""
    full = parse_hf_config(QWEN_FAMILIES[model_type]().to_dict())
    assert parse_hf_config({"model_type": model_type}) == full
    assert full.family == model_type


@pytest.mark.parametrize("model_type", sorted(TEXT_CLASSES))
@pytest.mark.parametrize(("n_layers", "interval"), [(8, 4), (7, 3), (5, 1), (6, 2), (3, 5)])
def test_layer_order_follows_full_attention_interval(
    model_type: str, n_layers: int, interval: int
) -> None:
    """Layer i is attention iff (i + 1) % full_attention_interval == 0, as the config class
    computes `layer_types`; a hub config that states only the interval parses the same."""
    cfg = tiny(model_type, num_hidden_layers=n_layers, full_attention_interval=interval)
    expected = [HF_KIND[t] for t in cfg["layer_types"]]
    assert expected == ["attention" if (i + 1) % interval == 0 else "gdn" for i in range(n_layers)]
    arch = parse_hf_config(cfg)
    assert mixer_kinds(arch) == expected
    assert [b.hf_layer for b in arch.blocks] == [i for i in range(n_layers) for _ in range(2)]
    hub = {k: v for k, v in cfg.items() if k != "layer_types"}
    hub["full_attention_interval"] = interval
    assert parse_hf_config(hub).blocks == arch.blocks


def test_default_interval_is_four() -> None:
    arch = parse_hf_config({"model_type": "qwen3_next", "num_hidden_layers": 8})
    assert mixer_kinds(arch) == ["gdn", "gdn", "gdn", "attention"] * 2


@pytest.mark.parametrize("model_type", sorted(TEXT_CLASSES))
def test_explicit_layer_types_win_over_the_interval(model_type: str) -> None:
    types = ["full_attention", "linear_attention", "full_attention", "full_attention"]
    cfg = tiny(model_type, num_hidden_layers=4, layer_types=types)
    cfg["full_attention_interval"] = 2  # ignored: layer_types is given
    assert mixer_kinds(parse_hf_config(cfg)) == [HF_KIND[t] for t in types]


def test_all_linear_has_no_attention_block() -> None:
    cfg = tiny("qwen3_5_text", num_hidden_layers=2, layer_types=["linear_attention"] * 2)
    spec = spec_from_hf_config(cfg)
    assert spec.n_attention == 0 and spec.kv_bytes_per_token == 0 and spec.n_ssm == 2


@pytest.mark.parametrize(
    ("n_experts", "step", "mlp_only", "expected"),
    [
        (8, 1, [], ["moe"] * 6),
        (8, 2, [], ["mlp", "moe"] * 3),
        (8, 3, [5], ["mlp", "mlp", "moe", "mlp", "mlp", "mlp"]),
        (8, 1, [0, 4], ["mlp", "moe", "moe", "moe", "mlp", "moe"]),
        (0, 1, [], ["mlp"] * 6),
    ],
)
def test_qwen3_next_moe_layers(
    n_experts: int, step: int, mlp_only: list[int], expected: list[str]
) -> None:
    """A layer is MoE iff it is not in mlp_only_layers, num_experts > 0 and
    (i + 1) % decoder_sparse_step == 0 (Qwen3NextDecoderLayer); otherwise a dense MLP of
    intermediate_size."""
    cfg = tiny(
        "qwen3_next", num_hidden_layers=6, num_experts=n_experts, decoder_sparse_step=step,
        mlp_only_layers=mlp_only,
    )  # fmt: skip
    if n_experts == 0:
        cfg["num_experts_per_tok"] = 0
    arch = parse_hf_config(cfg)
    assert ffn_kinds(arch) == expected
    for config in arch.configs_of("mlp"):
        assert config == MLPConfig(96, "silu", gated=True)
    for config in arch.configs_of("moe"):
        assert config == MoEConfig(
            24, 8, 2, "silu", gated=True, n_shared_experts=1, shared_intermediate_size=40,
            norm_topk=True, shared_expert_gate=True,
        )  # fmt: skip


def test_qwen3_next_norm_topk_prob_is_read_qwen3_5_moe_always_renormalises() -> None:
    (nxt,) = set(parse_hf_config(tiny("qwen3_next", norm_topk_prob=False)).configs_of("moe"))
    assert isinstance(nxt, MoEConfig) and not nxt.norm_topk
    cfg = tiny("qwen3_5_moe_text")
    cfg["norm_topk_prob"] = False  # not a Qwen3.5-MoE key: its router always renormalises
    (q35,) = set(parse_hf_config(cfg).configs_of("moe"))
    assert isinstance(q35, MoEConfig) and q35.norm_topk


def test_qwen3_5_moe_is_moe_in_every_layer() -> None:
    cfg = tiny("qwen3_5_moe_text", num_hidden_layers=5)
    cfg.update(decoder_sparse_step=2, mlp_only_layers=[0])  # Qwen3-Next keys, ignored here
    assert ffn_kinds(parse_hf_config(cfg)) == ["moe"] * 5


def test_qwen3_5_dense_mlp() -> None:
    arch = parse_hf_config(tiny("qwen3_5_text", num_hidden_layers=4))
    assert ffn_kinds(arch) == ["mlp"] * 4
    assert set(arch.configs_of("mlp")) == {MLPConfig(96, "silu", gated=True)}


def test_gated_attention_block() -> None:
    arch = parse_hf_config(tiny("qwen3_next", num_hidden_layers=4))
    (attn,) = set(arch.configs_of("attention"))
    assert attn == AttentionConfig(
        4, 2, 16, rotary_dim=4, rope_theta=10000.0, output_gate=True, qk_norm=True
    )
    assert arch.unit_offset_norms


@pytest.mark.parametrize("model_type", sorted(TEXT_CLASSES))
@pytest.mark.parametrize(("head_dim", "factor"), [(16, 0.25), (16, 0.5), (32, 1.0), (24, 0.25)])
def test_rotary_dim_is_head_dim_times_partial_rotary_factor(
    model_type: str, head_dim: int, factor: float
) -> None:
    """From `rope_parameters` (what the config class writes) and from the legacy top-level
    `rope_theta` / `partial_rotary_factor` keys of the hub's config.json files."""
    cfg = tiny(
        model_type, num_hidden_layers=4, head_dim=head_dim, rope_theta=5e6,
        partial_rotary_factor=factor,
    )  # fmt: skip
    assert cfg["rope_parameters"]["partial_rotary_factor"] == factor
    (attn,) = set(parse_hf_config(cfg).configs_of("attention"))
    assert isinstance(attn, AttentionConfig)
    assert (attn.rotary_dim, attn.rope_theta) == (int(head_dim * factor), 5e6)
    legacy = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    legacy.update(rope_theta=5e6, partial_rotary_factor=factor)
    (legacy_attn,) = set(parse_hf_config(legacy).configs_of("attention"))
    assert legacy_attn == attn
    # rope_parameters without the factor (some Qwen3.5 hub files): the top-level key fills in
    partial = {**legacy, "rope_parameters": {"rope_theta": 5e6, "rope_type": "default"}}
    (partial_attn,) = set(parse_hf_config(partial).configs_of("attention"))
    assert partial_attn == attn


def test_rope_defaults_without_any_rope_key() -> None:
    (attn,) = set(parse_hf_config({"model_type": "qwen3_5_text"}).configs_of("attention"))
    assert isinstance(attn, AttentionConfig)
    assert (attn.rotary_dim, attn.rope_theta) == (256 // 4, 10000.0)


def test_mrope_sections_keep_the_text_rotary_dim() -> None:
    cfg = tiny("qwen3_5_text", num_hidden_layers=4)
    cfg["rope_parameters"] = {
        "rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0], "mrope_interleaved": True,
    }  # fmt: skip
    (attn,) = set(parse_hf_config(cfg).configs_of("attention"))
    assert isinstance(attn, AttentionConfig) and attn.rotary_dim == 4


@pytest.mark.parametrize(
    ("outer", "text"), [("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text")]
)
@pytest.mark.parametrize(("outer_tie", "inner_tie"), [(True, False), (False, True)])
def test_multimodal_wrapper(outer: str, text: str, outer_tie: bool, inner_tie: bool) -> None:
    """The language model is text_config's; weights under model.language_model., the vision
    tower skipped; tie_word_embeddings is the outer config's (the LM head belongs to the
    ForConditionalGeneration model, whose config is the outer one)."""
    text_cfg = tiny(text, num_hidden_layers=4, tie_word_embeddings=inner_tie)
    cfg = QWEN_FAMILIES[outer](text_config=text_cfg, tie_word_embeddings=outer_tie).to_dict()
    arch = parse_hf_config(cfg)
    plain = parse_hf_config(text_cfg)
    assert arch.blocks == plain.blocks
    assert (arch.family, arch.vocab_size, arch.hidden_size) == (outer, 100, 64)
    assert arch.tie_embeddings is outer_tie and plain.tie_embeddings is inner_tie
    assert arch.weights_prefix == "model.language_model." and plain.weights_prefix == ""
    # a released checkpoint carries multi-token-prediction layers: the model skips them
    assert arch.skipped_weights == ("model.visual.", "mtp.")
    assert plain.skipped_weights == ("mtp.",)
    assert spec_from_hf_config(cfg).layers == spec_from_hf_config(text_cfg).layers


def test_multimodal_without_text_config_is_the_text_defaults() -> None:
    arch = parse_hf_config({"model_type": "qwen3_5_moe"})
    assert arch.blocks == parse_hf_config({"model_type": "qwen3_5_moe_text"}).blocks
    assert not arch.tie_embeddings


def test_gdn_block_and_its_state_by_hand() -> None:
    """Hk=2 key heads of dk=8, Hv=6 value heads of dv=12, kernel 3, D=64, bf16."""
    cfg = tiny("qwen3_5_text", num_hidden_layers=4)
    arch = parse_hf_config(cfg)
    (gdn,) = set(arch.configs_of("gdn"))
    assert gdn == GatedDeltaNetConfig(2, 6, 8, 12, 3, fused_projection=False)
    assert (gdn.key_dim, gdn.value_dim, gdn.conv_dim) == (16, 72, 2 * 16 + 72)
    (nxt,) = set(parse_hf_config(tiny("qwen3_next", num_hidden_layers=4)).configs_of("gdn"))
    assert isinstance(nxt, GatedDeltaNetConfig) and nxt.fused_projection
    spec = spec_from_hf_config(cfg)
    layer = next(x for x in spec.layers if isinstance(x, GatedDeltaNetLayer))
    recurrent = 6 * 8 * 12  # Hv x dk x dv
    conv = (2 * 2 * 8 + 6 * 12) * 3  # (2*Hk*dk + Hv*dv) x kernel
    assert (layer.state_elements(), layer.conv_elements()) == (recurrent, conv)
    assert spec.ssm_recurrent_bytes == 3 * recurrent * 2
    assert spec.ssm_conv_bytes == 3 * conv * 2
    assert spec.ssm_state_bytes == 3 * (recurrent + conv) * 2
    assert spec.kv_bytes_per_token == 1 * 2 * 2 * 16 * 2  # one attention layer: K+V, Hkv=2


def test_gdn_flops_by_hand() -> None:
    layer = GatedDeltaNetLayer(64, 2, 6, 8, 12, 3)
    conv_dim, vd = 2 * 2 * 8 + 6 * 12, 6 * 12
    in_proj = 2 * 64 * (conv_dim + vd + 2 * 6)  # qkv, z, b, a
    expected = in_proj + 2 * conv_dim * 3 + 8 * 6 * 8 * 12 + 5 * vd + 2 * vd * 64
    assert layer.total_flops_coeffs() == (float(expected), 0.0)


def test_moe_active_flops_by_hand() -> None:
    spec = spec_from_hf_config(tiny("qwen3_5_moe_text", num_hidden_layers=4))
    moe = next(x for x in spec.layers if isinstance(x, MoELayer))
    router, routed, shared, gate = 2 * 64 * 8, 2 * 6 * 64 * 24, 6 * 64 * 40, 2 * 64
    assert moe.total_flops_coeffs() == (float(router + routed + shared + gate), 0.0)


@pytest.mark.parametrize(
    ("config", "name"),
    [
        ({"linear_num_key_heads": 3, "linear_num_value_heads": 32}, "linear_num_key_heads=3"),
        ({"linear_num_value_heads": 0}, "n_v_heads"),
        ({"num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3}, "3 layer_types"),
        ({"layer_types": ["linear_attention", "sliding_attention"]}, "sliding_attention"),
        ({"layer_types": "linear_attention"}, "layer_types"),
        ({"full_attention_interval": 0}, "full_attention_interval"),
        ({"linear_conv_kernel_dim": 0}, "d_conv"),
        ({"partial_rotary_factor": "x"}, "partial_rotary_factor"),
        ({"rope_parameters": {"partial_rotary_factor": None}}, "partial_rotary_factor"),
        ({"rope_parameters": {"rope_type": 3}}, "rope_type"),
        ({"rope_parameters": "yarn"}, "rope_parameters"),
        ({"partial_rotary_factor": 1.5}, "rotary_dim"),
        ({"num_key_value_heads": 3}, "n_kv_heads=3"),
        ({"hidden_act": None}, "hidden_act"),
    ],
)
@pytest.mark.parametrize("model_type", sorted(TEXT_CLASSES))
def test_bad_values_are_named(model_type: str, config: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        parse_hf_config({"model_type": model_type, **config})


@pytest.mark.parametrize(
    ("config", "name"),
    [
        ({"model_type": "qwen3_next", "decoder_sparse_step": 0}, "decoder_sparse_step"),
        ({"model_type": "qwen3_next", "mlp_only_layers": "0"}, "mlp_only_layers"),
        ({"model_type": "qwen3_next", "num_experts": 4, "num_experts_per_tok": 8}, "top_k=8"),
        ({"model_type": "qwen3_next", "norm_topk_prob": "yes"}, "norm_topk_prob"),
        ({"model_type": "qwen3_5_moe_text", "num_experts": 0}, "num_experts"),
        ({"model_type": "qwen3_5_moe_text", "moe_intermediate_size": None}, "moe_intermed"),
        ({"model_type": "qwen3_5_moe", "text_config": [1]}, "text_config"),
        ({"model_type": "qwen3_5", "tie_word_embeddings": "no"}, "tie_word_embeddings"),
        ({"model_type": "qwen3_5", "text_config": {"num_attention_heads": 0}}, "num_attention"),
    ],
)
def test_bad_family_values_are_named(config: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        parse_hf_config(config)


@pytest.mark.parametrize("model_type", sorted(TEXT_CLASSES))
def test_the_mtp_layers_are_read(model_type: str) -> None:
    """`mtp_num_hidden_layers` (a released checkpoint's key; transformers' classes drop
    it) gives the MTP steps and one step's blocks: attention then the model's MoE or
    MLP; absent or null is none; negative is refused by name."""
    assert parse_hf_config(tiny(model_type)).mtp_layers == 0
    arch = parse_hf_config({**tiny(model_type), "mtp_num_hidden_layers": 1})
    ffn = "mlp" if model_type == "qwen3_5_text" else "moe"
    assert (arch.mtp_layers, arch.mtp_blocks) == (1, ("attention", ffn))
    assert parse_hf_config({**tiny(model_type), "mtp_num_hidden_layers": None}).mtp_layers == 0
    with pytest.raises(ValueError, match="'mtp_num_hidden_layers' must be >= 0, got -1"):
        parse_hf_config({**tiny(model_type), "mtp_num_hidden_layers": -1})
