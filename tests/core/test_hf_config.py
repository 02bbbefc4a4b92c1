"""spec_from_hf_config on configs built by transformers' own config classes (configs only)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
from transformers import (
    BailingHybridConfig,
    BambaConfig,
    FalconH1Config,
    FalconMambaConfig,
    GraniteMoeHybridConfig,
    JambaConfig,
    KimiLinearConfig,
    Lfm2Config,
    Lfm2MoeConfig,
    Lfm3Config,
    Lfm3VlConfig,
    Mamba2Config,
    MambaConfig,
    MiniMaxConfig,
    NemotronHConfig,
    OlmoHybridConfig,
    Qwen3_5Config,
    Qwen3_5MoeConfig,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    RecurrentGemmaConfig,
    Zamba2Config,
    xLSTMConfig,
)

from marconi_ray.core.model.hf.parse import (
    HF_PARSERS,
    parse_hf_config,
    spec_from_hf_config,
    supported_model_types,
)
from marconi_ray.core.model.hf.reader import ConfigReader
from marconi_ray.core.model.layers import (
    AttentionLayer,
    LinearLayer,
    Mamba1Layer,
    Mamba2Layer,
    MLPLayer,
    MoELayer,
)
from marconi_ray.core.model.model_spec import ModelSpec

FAMILIES: dict[str, Callable[..., Any]] = {
    "nemotron_h": NemotronHConfig,
    "bamba": BambaConfig,
    "jamba": JambaConfig,
    "zamba2": Zamba2Config,
    "falcon_h1": FalconH1Config,
    "granitemoehybrid": GraniteMoeHybridConfig,
    "qwen3_5_text": Qwen3_5TextConfig,
    "qwen3_5": Qwen3_5Config,
    "qwen3_5_moe_text": Qwen3_5MoeTextConfig,
    "qwen3_5_moe": Qwen3_5MoeConfig,
    "qwen3_next": Qwen3NextConfig,
    "lfm2": Lfm2Config,
    "lfm2_moe": Lfm2MoeConfig,
    "mamba": MambaConfig,
    "falcon_mamba": FalconMambaConfig,
    "mamba2": Mamba2Config,
    "olmo_hybrid": OlmoHybridConfig,
    "recurrent_gemma": RecurrentGemmaConfig,
    "kimi_linear": KimiLinearConfig,
    "minimax": MiniMaxConfig,
    "bailing_hybrid": BailingHybridConfig,
    "lfm3": Lfm3Config,
    "lfm3_vl": Lfm3VlConfig,
    "xlstm": xLSTMConfig,
}
REQUIRED: dict[str, dict[str, Any]] = {
    "lfm2_moe": {"layer_types": ["conv", "conv", "full_attention"] * 10 + ["conv"] * 2},
}
"""Keys without a usable default (transformers cannot build LFM2-MoE without layer_types)."""


def _counts(spec: ModelSpec) -> tuple[int, int, int]:
    return spec.n_attention, spec.n_ssm, spec.n_mlp


def _n(spec: ModelSpec, cls: type) -> int:
    return sum(isinstance(layer, cls) for layer in spec.layers)


def mamba2_bytes(heads: int, head_dim: int, groups: int, d_state: int, d_conv: int) -> int:
    """Recurrent + conv bytes of one Mamba-2 layer in bf16, by hand."""
    d_inner = heads * head_dim
    return (d_inner * d_state + (d_inner + 2 * groups * d_state) * d_conv) * 2


def test_registry_covers_every_family() -> None:
    assert set(HF_PARSERS) == set(FAMILIES)
    assert supported_model_types() == tuple(sorted(FAMILIES))


def test_nemotron_h() -> None:
    pattern: dict[str, Any] = {"hybrid_override_pattern": "M-M*-ME-"}  # legacy kwarg
    cfg = NemotronHConfig(
        **pattern, vocab_size=1000, hidden_size=64,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48, max_position_embeddings=512,
    ).to_dict()  # fmt: skip
    spec = spec_from_hf_config(cfg)
    assert _counts(spec) == (1, 3, 4)
    assert _n(spec, MoELayer) == 1
    assert spec.kv_bytes_per_token == 2 * 2 * 16 * 2
    assert spec.ssm_state_bytes == 3 * mamba2_bytes(8, 16, 2, 16, 4)
    assert (spec.vocab_size, spec.max_position, spec.dtype_bytes) == (1000, 512, 2)
    moe = next(x for x in spec.layers if isinstance(x, MoELayer))
    assert moe.total_flops_coeffs()[0] == 2 * 64 * 4 + 2 * (4 * 64 * 32) + 4 * 64 * 48
    mlp = next(x for x in spec.layers if isinstance(x, MLPLayer))
    assert mlp == MLPLayer(64, 128, gated=False)
    # a hub-style dict with the legacy pattern string and legacy keys parses the same
    legacy = {
        k: v for k, v in cfg.items() if k not in ("layers_block_type", "n_groups", "conv_kernel")
    }
    legacy.update(hybrid_override_pattern="M-M*-ME-", mamba_n_groups=2, mamba_d_conv=4)
    assert spec_from_hf_config(legacy).layers == spec.layers


def test_nemotron_h_moe_latent() -> None:
    cfg = NemotronHConfig(
        hidden_size=64,
        layers_block_type=["moe"],
        n_routed_experts=4,
        moe_latent_size=16,
        moe_intermediate_size=32,
    ).to_dict()
    (moe,) = spec_from_hf_config(cfg).layers
    assert isinstance(moe, MoELayer) and moe.latent_dim == 16


def test_bamba() -> None:
    cfg = BambaConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=6, attn_layer_indices=[2, 5],
        num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
    ).to_dict()  # fmt: skip
    spec = spec_from_hf_config(cfg, name="tiny-bamba")
    assert spec.name == "tiny-bamba"
    assert _counts(spec) == (2, 4, 6)
    assert all(isinstance(spec.layers[i], AttentionLayer) for i in (4, 10))
    assert spec.kv_bytes_per_token == 2 * (2 * 2 * (64 // 4) * 2)
    head_dim = 2 * 64 // 8  # mamba_d_head "auto"
    assert spec.ssm_state_bytes == 4 * mamba2_bytes(8, head_dim, 2, 16, 4)
    assert _n(spec, MLPLayer) == 6 and all(x.gated for x in spec.layers if isinstance(x, MLPLayer))


def test_jamba() -> None:
    cfg = JambaConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=8, num_attention_heads=4,
        num_key_value_heads=1, intermediate_size=128, num_experts=4, num_experts_per_tok=2,
        attn_layer_period=4, attn_layer_offset=1, expert_layer_period=2,
        expert_layer_offset=1, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
    ).to_dict()  # fmt: skip
    spec = spec_from_hf_config(cfg)
    assert _counts(spec) == (2, 6, 8)
    assert _n(spec, MoELayer) == 4 and _n(spec, Mamba1Layer) == 6
    assert spec.kv_bytes_per_token == 2 * (2 * 1 * 16 * 2)
    assert spec.ssm_state_bytes == 6 * (128 * 8 + 128 * 4) * 2
    mamba = next(x for x in spec.layers if isinstance(x, Mamba1Layer))
    assert mamba.dt_rank == math.ceil(64 / 16)
    # layer i: mixer at 2*i, feed-forward at 2*i + 1
    assert isinstance(spec.layers[2 * 1], AttentionLayer)
    assert isinstance(spec.layers[2 * 5], AttentionLayer)
    assert isinstance(spec.layers[2 * 3 + 1], MoELayer)
    assert isinstance(spec.layers[2 * 2 + 1], MLPLayer)


def test_jamba_single_expert_is_all_dense() -> None:
    cfg = JambaConfig(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_experts=1
    ).to_dict()
    spec = spec_from_hf_config(cfg)
    assert _n(spec, MoELayer) == 0 and _n(spec, MLPLayer) == 4


def test_zamba2() -> None:
    cfg = Zamba2Config(
        vocab_size=500, hidden_size=64, num_hidden_layers=6,
        layers_block_type=["mamba", "hybrid", "mamba", "mamba", "hybrid", "mamba"],
        num_attention_heads=4, n_mamba_heads=4, mamba_expand=2, mamba_ngroups=1,
        mamba_d_state=16, mamba_d_conv=4, adapter_rank=8, use_shared_attention_adapter=True,
    ).to_dict()  # fmt: skip
    spec = spec_from_hf_config(cfg)
    assert _counts(spec) == (2, 6, 2)
    attn_head_dim = 2 * 64 // 4
    assert spec.kv_bytes_per_token == 2 * (2 * 4 * attn_head_dim * 2)
    assert spec.ssm_state_bytes == 6 * mamba2_bytes(4, 128 // 4, 1, 16, 4)
    attn = next(x for x in spec.layers if isinstance(x, AttentionLayer))
    assert attn.input_dim == 128 and attn.head_dim == 32
    assert _n(spec, LinearLayer) == 2 * (6 + 2 + 1)  # q/k/v adapters, MLP adapter, linear
    mlp = next(x for x in spec.layers if isinstance(x, MLPLayer))
    assert mlp == MLPLayer(64, 4 * 64, gated=True)  # intermediate_size None -> 4*D


def test_falcon_h1() -> None:
    cfg = FalconH1Config(
        vocab_size=500, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=96, mamba_d_ssm=96, mamba_n_heads=6,
        mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4,
    ).to_dict()  # fmt: skip
    spec = spec_from_hf_config(cfg)
    assert _counts(spec) == (3, 3, 3)
    assert spec.kv_bytes_per_token == 3 * (2 * 2 * 16 * 2)
    assert spec.ssm_state_bytes == 3 * mamba2_bytes(6, 96 // 6, 2, 8, 4)


@pytest.mark.parametrize("n_experts", [4, 0])
def test_granitemoehybrid(n_experts: int) -> None:
    cfg = GraniteMoeHybridConfig(
        vocab_size=500, hidden_size=64, num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "mamba"], num_attention_heads=4,
        num_key_value_heads=1, intermediate_size=32, num_local_experts=n_experts,
        num_experts_per_tok=2, shared_intermediate_size=48, mamba_n_heads=8,
        mamba_n_groups=1, mamba_d_state=16, mamba_d_conv=4, mamba_expand=2,
    ).to_dict()  # fmt: skip
    spec = spec_from_hf_config(cfg)
    assert _counts(spec) == (1, 3, 4)
    assert spec.kv_bytes_per_token == 2 * 1 * 16 * 2
    assert spec.ssm_state_bytes == 3 * mamba2_bytes(8, 128 // 8, 1, 16, 4)
    ffn = spec.layers[1]
    if n_experts:
        assert isinstance(ffn, MoELayer)
        router, routed, shared = 2 * 64 * 4, 2 * 6 * 64 * 32, 6 * 64 * 48
        assert ffn.total_flops_coeffs()[0] == router + routed + shared
    else:
        assert ffn == MLPLayer(64, 48, gated=True)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_missing_keys_take_transformers_defaults(model_type: str) -> None:
    """A bare {"model_type": ...} parses like the config class's own defaults."""
    required = REQUIRED.get(model_type, {})
    full = spec_from_hf_config(FAMILIES[model_type](**required).to_dict())
    bare = spec_from_hf_config({"model_type": model_type, **required})
    assert bare.layers == full.layers
    assert (bare.vocab_size, bare.max_position) == (full.vocab_size, full.max_position)
    assert bare.name == model_type


def test_default_sizes_are_plausible() -> None:
    """Spot-check the defaults against the published models' shapes."""
    jamba = spec_from_hf_config({"model_type": "jamba"})
    assert _counts(jamba) == (4, 28, 32)
    zamba = spec_from_hf_config({"model_type": "zamba2"})
    assert zamba.n_ssm == 54 and zamba.n_attention == 9


@pytest.mark.parametrize(
    ("config", "name"),
    [
        ({"model_type": "llama"}, "llama"),
        ({"model_type": "llama"}, "nemotron_h"),  # the message lists the supported types
        ({"hidden_size": 64}, "model_type"),
        ({"model_type": "bamba", "hidden_size": None}, "hidden_size"),
        ({"model_type": "jamba", "num_experts": "many"}, "num_experts"),
        ({"model_type": "jamba", "attn_layer_offset": 8}, "attn_layer_offset"),
        ({"model_type": "falcon_h1", "hidden_size": 64.5}, "hidden_size"),
        ({"model_type": "zamba2", "use_long_context": "yes"}, "use_long_context"),
        ({"model_type": "nemotron_h", "hybrid_override_pattern": "M*X"}, "X"),
        ({"model_type": "granitemoehybrid", "layer_types": ["mamba", "conv"]}, "conv"),
        ({"model_type": "bamba", "mamba_d_state": 0}, "d_state"),
    ],
)
def test_bad_configs_raise(config: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        spec_from_hf_config(config)


def test_reader_names_missing_required_key() -> None:
    with pytest.raises(ValueError, match="missing required key 'foo'"):
        ConfigReader({}, {}, "fam").req_int("foo")


def test_non_mapping_and_bad_dtype_raise() -> None:
    with pytest.raises(ValueError, match="mapping"):
        spec_from_hf_config([("model_type", "bamba")])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="dtype_bytes"):
        spec_from_hf_config({"model_type": "bamba"}, dtype_bytes=0)


def test_dtype_bytes_and_name_from_path() -> None:
    spec = spec_from_hf_config({"model_type": "bamba", "_name_or_path": "ibm/bamba"}, 4)
    assert spec.name == "ibm/bamba" and spec.dtype_bytes == 4
    assert spec.ssm_state_bytes == 2 * spec_from_hf_config({"model_type": "bamba"}).ssm_state_bytes
    assert _n(spec, Mamba2Layer) == 32


def test_nemotron_h_mtp_layers() -> None:
    """Nemotron 3's `num_nextn_predict_layers` steps of `mtp_layers_block_type` blocks
    (attention then MoE by default) take the model's own configs of their kinds: a kind
    no layer of the model has is refused by name; none when the key is 0."""
    base = NemotronHConfig(
        hybrid_override_pattern="M*ME", vocab_size=1000, hidden_size=64,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=128,
        ssm_state_size=16, mamba_num_heads=8, mamba_head_dim=16, n_groups=2, conv_kernel=4,
        n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48,
    ).to_dict()  # fmt: skip
    assert parse_hf_config({**base, "num_nextn_predict_layers": 0}).mtp_layers == 0
    arch = parse_hf_config({**base, "num_nextn_predict_layers": 1})
    assert (arch.mtp_layers, arch.mtp_blocks) == (1, ("attention", "moe"))
    assert "mtp." in arch.skipped_weights
    with pytest.raises(ValueError, match=r"uses \['mlp'\]"):
        parse_hf_config(
            {**base, "num_nextn_predict_layers": 1, "mtp_layers_block_type": ["attention", "mlp"]}
        )
