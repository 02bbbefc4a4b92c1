"""The LFM2 / LFM2-MoE cost model against the transformers modules themselves.

As for Qwen (`test_qwen_modules.py`): the per-token matmul FLOPs are 2 x the weights a token
multiplies, counted on modules built on the meta device (every nn.Linear and the depthwise
conv; of the routed experts only top_k / num_experts); the cached state sizes come from a
real forward of a tiny model on CPU. The parses are `marconi_ray.core`'s (no torch there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from transformers import Lfm2Config, Lfm2MoeConfig  # noqa: E402
from transformers.models.lfm2 import modeling_lfm2 as lfm2  # noqa: E402
from transformers.models.lfm2_moe import modeling_lfm2_moe as lfm2_moe  # noqa: E402

from marconi_ray.core.model.hf.arch import HfArchitecture, ShortConvConfig  # noqa: E402
from marconi_ray.core.model.hf.parse import layer_spec, parse_hf_config  # noqa: E402
from marconi_ray.core.model.layers import AttentionLayer, ShortConvLayer  # noqa: E402

torch.set_num_threads(1)

TYPES = ["conv", "full_attention", "conv", "conv", "full_attention", "conv"]
TINY: dict[str, Any] = {
    "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "num_hidden_layers": 6, "layer_types": TYPES, "conv_L_cache": 3,
}  # fmt: skip
MOE: dict[str, Any] = {
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
    "num_dense_layers": 2,
}  # fmt: skip
# (config class, text model class, short-conv class, attention class, MoE block class)
FAMILIES: dict[str, tuple[Callable[..., Any], Any, Any, Any, Any]] = {
    "lfm2": (Lfm2Config, lfm2.Lfm2Model, lfm2.Lfm2ShortConv, lfm2.Lfm2Attention, None),
    "lfm2_moe": (
        Lfm2MoeConfig, lfm2_moe.Lfm2MoeModel, lfm2_moe.Lfm2MoeShortConv,
        lfm2_moe.Lfm2MoeAttention, lfm2_moe.Lfm2MoeSparseMoeBlock,
    ),
}  # fmt: skip
ROTARY = {"lfm2": lfm2.Lfm2RotaryEmbedding, "lfm2_moe": lfm2_moe.Lfm2MoeRotaryEmbedding}


def config(model_type: str, **overrides: Any) -> Any:
    extra = MOE if model_type == "lfm2_moe" else {}
    return FAMILIES[model_type][0](**{**TINY, **extra, **overrides})


def parse(cfg: Any) -> HfArchitecture:
    return parse_hf_config(cfg.to_dict())


def active_matmul_weights(module: nn.Module, top_k: int = 0, n_experts: int = 1) -> float:
    """Weights one token multiplies: every nn.Linear and nn.Conv1d (depthwise: the kernel
    taps of each channel), the router's bare weight, and top_k / n_experts of the routed
    experts' stacked 3-D weights."""
    total = 0.0
    for sub in module.modules():
        own = sum(p.numel() for p in sub.parameters(recurse=False))
        if isinstance(sub, (nn.Linear, nn.Conv1d)) or type(sub).__name__.endswith("Router"):
            total += own
        elif type(sub).__name__.endswith("Experts"):
            total += own * top_k / n_experts
    return total


def on_meta(factory: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return factory()


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
@pytest.mark.parametrize("kernel", [2, 3, 5])
def test_short_conv_flops_are_twice_its_weights(model_type: str, kernel: int) -> None:
    cfg = config(model_type, conv_L_cache=kernel)
    module = on_meta(lambda: FAMILIES[model_type][2](cfg, 0))
    (conv,) = parse(cfg).configs_of("shortconv")
    assert conv == ShortConvConfig(d_conv=kernel, bias=False)
    layer = layer_spec(conv, cfg.hidden_size)
    assert isinstance(layer, ShortConvLayer)
    assert layer.total_flops_coeffs() == (2 * active_matmul_weights(module), 0.0)
    assert module.conv.weight.shape == (cfg.hidden_size, 1, kernel)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_attention_flops_and_rope_width(model_type: str) -> None:
    cfg = config(model_type)
    module = on_meta(lambda: FAMILIES[model_type][3](cfg, 1))
    (attn,) = parse(cfg).configs_of("attention")
    layer = layer_spec(attn, cfg.hidden_size)
    assert isinstance(layer, AttentionLayer)
    assert layer.total_flops_coeffs() == (2 * active_matmul_weights(module), 4.0 * 64)
    rotary = ROTARY[model_type](cfg)
    assert attn.rotary_dim == 2 * rotary.inv_freq.numel() == module.head_dim  # type: ignore[union-attr]
    assert attn.qk_norm and attn.rope_theta == cfg.rope_parameters["rope_theta"]  # type: ignore[union-attr]


@pytest.mark.parametrize(("n_experts", "top_k"), [(8, 2), (16, 5), (4, 4)])
def test_moe_active_flops_match_the_block(n_experts: int, top_k: int) -> None:
    """Router + top_k routed experts; the router is sigmoid-scored with the expert bias."""
    cfg = config("lfm2_moe", num_experts=n_experts, num_experts_per_tok=top_k)
    module = on_meta(lambda: lfm2_moe.Lfm2MoeSparseMoeBlock(cfg))
    (moe,) = parse(cfg).configs_of("moe")
    layer = layer_spec(moe, cfg.hidden_size)
    assert layer.total_flops_coeffs()[0] == 2 * active_matmul_weights(module, top_k, n_experts)
    assert (moe.scoring, moe.selection_bias, moe.norm_topk) == ("sigmoid", True, True)  # type: ignore[union-attr]


CASES: list[tuple[str, dict[str, Any]]] = [
    ("lfm2", {}),
    ("lfm2", {"layer_types": None, "full_attn_idxs": [0, 3], "intermediate_size": 200}),
    ("lfm2", {"block_ffn_dim_multiplier": 0.7, "intermediate_size": 100}),
    ("lfm2", {"block_auto_adjust_ff_dim": False, "block_multiple_of": 32}),
    ("lfm2", {"block_ffn_dim_multiplier": 1.5, "block_multiple_of": 48}),
    ("lfm2_moe", {}),
    ("lfm2_moe", {"num_dense_layers": 0, "use_expert_bias": False}),
    ("lfm2_moe", {"num_dense_layers": 6}),
]


@pytest.mark.parametrize(("model_type", "overrides"), CASES)
def test_each_layer_matches_the_transformers_model(
    model_type: str, overrides: dict[str, Any]
) -> None:
    """Layer by layer: the mixer (conv / self_attn), the feed-forward (dense SwiGLU of the
    auto-adjusted width / sparse MoE block) and the matmul FLOPs of the whole layer."""
    cfg = config(model_type, **overrides)
    model = on_meta(lambda: FAMILIES[model_type][1](cfg))
    arch = parse(cfg)
    moe_block = FAMILIES[model_type][4]
    values = cfg.to_dict()
    top_k, n_experts = values.get("num_experts_per_tok", 0), values.get("num_experts", 1)
    assert len(model.layers) == cfg.num_hidden_layers
    for i, decoder in enumerate(model.layers):
        blocks = [b for b in arch.blocks if b.hf_layer == i]
        mixer = "shortconv" if hasattr(decoder, "conv") else "attention"
        sparse = moe_block is not None and isinstance(decoder.feed_forward, moe_block)
        assert [b.kind for b in blocks] == [mixer, "moe" if sparse else "mlp"], f"layer {i}"
        if not sparse:
            assert blocks[1].config.intermediate_size == decoder.feed_forward.w1.out_features  # type: ignore[union-attr]
        ours = sum(layer_spec(b.config, cfg.hidden_size).total_flops_coeffs()[0] for b in blocks)
        assert ours == 2 * active_matmul_weights(decoder, top_k, n_experts), f"layer {i}"


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_cached_states_match_a_real_forward(model_type: str) -> None:
    """Conv state (D x conv_L_cache, nothing else) and K/V per token of a tiny model's cache
    after a 7-token prefill on CPU."""
    cfg = config(model_type, vocab_size=50, hidden_size=32, conv_L_cache=4)
    torch.manual_seed(0)
    model = FAMILIES[model_type][1](cfg).eval()
    with torch.no_grad():
        cache = model(torch.arange(7)[None], use_cache=True).past_key_values
    arch = parse(cfg)
    mixers = [b for b in arch.blocks if b.kind in ("shortconv", "attention")]
    assert len(mixers) == len(TYPES)
    for i, block in enumerate(mixers):
        layer = layer_spec(block.config, cfg.hidden_size)
        if block.kind == "shortconv":
            assert cache.get_conv_state(i).numel() == layer.conv_elements() == 32 * 4
            assert layer.state_elements() == 0 and layer.kv_elements_per_token() == 0
        else:
            kv = cache.layers[i].keys.numel() + cache.layers[i].values.numel()
            assert kv == 7 * layer.kv_elements_per_token()
            assert layer.state_elements() == layer.conv_elements() == 0


def test_legacy_keys() -> None:
    """`tie_embedding`, `block_ff_dim` and a top-level `rope_theta` (as in the published
    config.json files) parse like transformers reads them."""
    legacy = {
        "model_type": "lfm2", "hidden_size": 64, "block_ff_dim": 300, "tie_embedding": False,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3,
        "full_attn_idxs": [1],
        "rope_theta": 5000.0, "block_multiple_of": 64,
    }  # fmt: skip
    ours = parse_hf_config(legacy)
    theirs = Lfm2Config(**{k: v for k, v in legacy.items() if k != "model_type"})
    model = on_meta(lambda: lfm2.Lfm2Model(theirs))
    kinds = [b.kind for b in ours.blocks]
    assert kinds == ["shortconv", "mlp", "attention", "mlp", "shortconv", "mlp"]
    (mlp,) = ours.configs_of("mlp")
    assert mlp.intermediate_size == model.layers[0].feed_forward.w1.out_features == 256  # type: ignore[union-attr]
    (attn,) = ours.configs_of("attention")
    assert attn.rope_theta == theirs.rope_parameters["rope_theta"] == 5000.0  # type: ignore[union-attr]
    assert ours.tie_embeddings is theirs.tie_word_embeddings is False


@pytest.mark.parametrize(
    ("config_", "name"),
    [
        ({"model_type": "lfm2_moe"}, "layer_types"),
        ({"model_type": "lfm2", "layer_types": ["conv", "sliding_attention"]}, "sliding"),
        ({"model_type": "lfm2", "num_hidden_layers": 3, "layer_types": ["conv"]}, "layer_types"),
        ({"model_type": "lfm2", "conv_L_cache": 0}, "conv_L_cache"),
        ({"model_type": "lfm2", "rope_parameters": {"rope_theta": "big"}}, "rope_theta"),
    ],
)
def test_bad_configs_raise(config_: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        parse_hf_config(config_)
