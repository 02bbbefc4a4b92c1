"""The Qwen3.5 / Qwen3-Next cost model against the transformers modules themselves.

Independent counts: the models are built on the meta device (no memory, no compute) and the
per-token matmul FLOPs are 2 x the weights a token multiplies (every nn.Linear and the
depthwise conv1d; of the routed experts only top_k / num_experts of them); the cached state
shapes come from a real forward of a tiny model on CPU, the rotary width from the rotary
embedding's own frequency table. The parses are `marconi_ray.core`'s (no torch there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from transformers import (  # noqa: E402
    Qwen3_5Config,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
)
from transformers.models.qwen3_5 import modeling_qwen3_5 as q35  # noqa: E402
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as q35moe  # noqa: E402
from transformers.models.qwen3_next import modeling_qwen3_next as qnext  # noqa: E402

from marconi_ray.core.model.hf.arch import HfArchitecture  # noqa: E402
from marconi_ray.core.model.hf.parse import layer_spec, parse_hf_config  # noqa: E402
from marconi_ray.core.model.layers import (  # noqa: E402
    AttentionLayer,
    GatedDeltaNetLayer,
    LayerSpec,
)

torch.set_num_threads(1)

TINY: dict[str, Any] = {
    "vocab_size": 100, "hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "linear_num_key_heads": 2,
    "linear_num_value_heads": 6, "linear_key_head_dim": 8, "linear_value_head_dim": 12,
    "linear_conv_kernel_dim": 3,
}  # fmt: skip
MOE: dict[str, Any] = {
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 40,
}  # fmt: skip
# (config class, text model class, GDN class, attention class, MoE block class) per family
FAMILIES: dict[str, tuple[Callable[..., Any], Any, Any, Any, Any]] = {
    "qwen3_5_text": (
        Qwen3_5TextConfig, q35.Qwen3_5TextModel, q35.Qwen3_5GatedDeltaNet,
        q35.Qwen3_5Attention, None,
    ),
    "qwen3_5_moe_text": (
        Qwen3_5MoeTextConfig, q35moe.Qwen3_5MoeTextModel, q35moe.Qwen3_5MoeGatedDeltaNet,
        q35moe.Qwen3_5MoeAttention, q35moe.Qwen3_5MoeSparseMoeBlock,
    ),
    "qwen3_next": (
        Qwen3NextConfig, qnext.Qwen3NextModel, qnext.Qwen3NextGatedDeltaNet,
        qnext.Qwen3NextAttention, qnext.Qwen3NextSparseMoeBlock,
    ),
}  # fmt: skip


def config(model_type: str, **overrides: Any) -> Any:
    cls = FAMILIES[model_type][0]
    extra = {} if model_type == "qwen3_5_text" else MOE
    return cls(**{**TINY, **extra, **overrides})


def parse(cfg: Any) -> HfArchitecture:
    return parse_hf_config(cfg.to_dict())


def active_matmul_weights(module: nn.Module, top_k: int = 0, n_experts: int = 1) -> float:
    """Weights one token multiplies: every nn.Linear and nn.Conv1d (depthwise: kernel taps
    per channel), the router's weight, and top_k / n_experts of the routed experts' stacked
    3-D weights."""
    total = 0.0
    for sub in module.modules():
        own = sum(p.numel() for p in sub.parameters(recurse=False))
        if isinstance(sub, (nn.Linear, nn.Conv1d)):
            total += own
        elif type(sub).__name__.endswith("Experts"):
            total += own * top_k / n_experts
        elif type(sub).__name__.endswith("Router"):  # a bare weight, not an nn.Linear
            total += own
    return total


def non_matmul_flops(layer: LayerSpec) -> float:
    """What the cost model adds to 2 x weights: the delta rule and the gated norm of GDN."""
    if isinstance(layer, GatedDeltaNetLayer):
        rule = 8 * layer.n_v_heads * layer.head_k_dim * layer.head_v_dim
        return float(rule + 5 * layer.value_dim)
    return 0.0


def on_meta(factory: Callable[[], nn.Module]) -> nn.Module:
    with torch.device("meta"):
        return factory()


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_gdn_flops_are_twice_the_projection_and_conv_weights(model_type: str) -> None:
    cfg = config(model_type, num_hidden_layers=4)
    gdn_cls = FAMILIES[model_type][2]
    module = on_meta(lambda: gdn_cls(cfg, 0))
    (gdn,) = set(parse(cfg).configs_of("gdn"))
    layer = layer_spec(gdn, cfg.hidden_size)
    assert isinstance(layer, GatedDeltaNetLayer)
    linear, _ = layer.total_flops_coeffs()
    assert linear - non_matmul_flops(layer) == 2 * active_matmul_weights(module)
    conv = module.conv1d.weight
    assert (conv.shape[0], conv.shape[2]) == (layer.conv_dim, layer.d_conv)


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_gated_attention_projection_flops(model_type: str) -> None:
    cfg = config(model_type, num_hidden_layers=4)
    module = on_meta(lambda: FAMILIES[model_type][3](cfg, 3))
    (attn,) = set(parse(cfg).configs_of("attention"))
    layer = layer_spec(attn, cfg.hidden_size)
    assert isinstance(layer, AttentionLayer) and layer.output_gate
    linear, quadratic = layer.total_flops_coeffs()
    assert linear == 2 * active_matmul_weights(module)
    assert module.q_proj.out_features == 2 * 4 * 16  # query + gate channels
    assert quadratic == 4 * 4 * 16


@pytest.mark.parametrize("model_type", ["qwen3_5_moe_text", "qwen3_next"])
@pytest.mark.parametrize(("n_experts", "top_k"), [(8, 2), (16, 5), (4, 4)])
def test_moe_active_flops_match_the_block(model_type: str, n_experts: int, top_k: int) -> None:
    """Router + top_k routed experts + the shared expert + its sigmoid gate."""
    cfg = config(model_type, num_hidden_layers=4, num_experts=n_experts, num_experts_per_tok=top_k)
    module = on_meta(lambda: FAMILIES[model_type][4](cfg))
    (moe,) = set(parse(cfg).configs_of("moe"))
    layer = layer_spec(moe, cfg.hidden_size)
    assert layer.total_flops_coeffs()[0] == 2 * active_matmul_weights(module, top_k, n_experts)


CASES: list[tuple[str, dict[str, Any]]] = [
    ("qwen3_5_text", {"num_hidden_layers": 8}),
    ("qwen3_5_text", {"num_hidden_layers": 5, "full_attention_interval": 2}),
    ("qwen3_5_moe_text", {"num_hidden_layers": 6, "full_attention_interval": 3}),
    ("qwen3_next", {"num_hidden_layers": 8}),
    ("qwen3_next", {"num_hidden_layers": 6, "decoder_sparse_step": 2, "mlp_only_layers": [3]}),
    ("qwen3_next", {"num_hidden_layers": 4, "num_experts": 0, "num_experts_per_tok": 0}),
    ("qwen3_next", {"num_hidden_layers": 4, "mlp_only_layers": [0, 1, 2, 3]}),
    (
        "qwen3_next",
        {"num_hidden_layers": 4, "layer_types": ["full_attention", "linear_attention"] * 2},
    ),
]


@pytest.mark.parametrize(("model_type", "overrides"), CASES)
def test_each_layer_matches_the_transformers_model(
    model_type: str, overrides: dict[str, Any]
) -> None:
    """Layer by layer: the mixer (linear_attn / self_attn), the feed-forward (dense MLP /
    sparse MoE block) and the matmul FLOPs of the whole decoder layer."""
    cfg = config(model_type, **overrides)
    model = on_meta(lambda: FAMILIES[model_type][1](cfg))
    arch = parse(cfg)
    moe_block = FAMILIES[model_type][4]
    values = cfg.to_dict()
    top_k, n_experts = values.get("num_experts_per_tok", 0), max(values.get("num_experts", 1), 1)
    assert len(model.layers) == cfg.num_hidden_layers
    for i, decoder in enumerate(model.layers):
        blocks = [b for b in arch.blocks if b.hf_layer == i]
        mixer = "gdn" if hasattr(decoder, "linear_attn") else "attention"
        ffn = "moe" if moe_block is not None and isinstance(decoder.mlp, moe_block) else "mlp"
        assert [b.kind for b in blocks] == [mixer, ffn], f"layer {i}"
        specs = [layer_spec(b.config, cfg.hidden_size) for b in blocks]
        ours = sum(s.total_flops_coeffs()[0] - non_matmul_flops(s) for s in specs)
        assert ours == 2 * active_matmul_weights(decoder, top_k, n_experts), f"layer {i}"


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_cached_states_match_a_real_forward(model_type: str) -> None:
    """Conv state (conv_dim x kernel), recurrent state (Hv x dk x dv) and K/V per token of a
    tiny model's cache after a 7-token prefill on CPU."""
    cfg = config(model_type, num_hidden_layers=4, vocab_size=50, hidden_size=32)
    torch.manual_seed(0)
    model = FAMILIES[model_type][1](cfg).eval()
    with torch.no_grad():
        cache = model(torch.arange(7)[None], use_cache=True).past_key_values
    arch = parse(cfg)
    mixers = [b for b in arch.blocks if b.kind in ("gdn", "attention")]
    for i, block in enumerate(mixers):
        layer = layer_spec(block.config, cfg.hidden_size)
        if block.kind == "gdn":
            assert cache.get_conv_state(i).numel() == layer.conv_elements()
            assert cache.get_recurrent_state(i).numel() == layer.state_elements()
            assert layer.kv_elements_per_token() == 0
        else:
            kv = cache.layers[i].keys.numel() + cache.layers[i].values.numel()
            assert kv == 7 * layer.kv_elements_per_token()
            assert layer.state_elements() == 0


@pytest.mark.parametrize(
    ("rotary_cls", "config_cls"),
    [(q35.Qwen3_5TextRotaryEmbedding, Qwen3_5TextConfig), (qnext.Qwen3NextRotaryEmbedding, None)],
)
@pytest.mark.parametrize(("head_dim", "factor"), [(16, 0.25), (32, 0.5), (24, 1.0)])
def test_rotary_dim_matches_the_frequency_table(
    rotary_cls: Any, config_cls: Any, head_dim: int, factor: float
) -> None:
    cls = config_cls or Qwen3NextConfig
    cfg = cls(**{**TINY, "head_dim": head_dim, "partial_rotary_factor": factor})
    rotary = rotary_cls(cfg)
    (attn,) = set(parse(cfg).configs_of("attention"))
    assert attn.rotary_dim == 2 * rotary.inv_freq.numel()  # type: ignore[union-attr]


@pytest.mark.parametrize("tie", [True, False])
def test_multimodal_checkpoint_layout(tie: bool) -> None:
    """The language model's weights sit under the parsed prefix, the rest under the skipped
    vision prefix (the LM head aside); the LM head is tied iff the outer config says so."""
    vision = {
        "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
        "out_hidden_size": 64, "patch_size": 2, "temporal_patch_size": 1,
        "num_position_embeddings": 16,
    }  # fmt: skip
    text = {**TINY, "num_hidden_layers": 2, "tie_word_embeddings": not tie}
    cfg = Qwen3_5Config(text_config=text, vision_config=vision, tie_word_embeddings=tie)
    model = on_meta(lambda: q35.Qwen3_5ForConditionalGeneration(cfg))
    arch = parse_hf_config(cfg.to_dict())
    keys = set(model.state_dict())
    language = {k for k in keys if k.startswith(arch.weights_prefix)}
    skipped = {k for k in keys if k.startswith(arch.skipped_weights)}
    assert language and skipped and keys - language - skipped == {"lm_head.weight"}
    assert bool(model.get_expanded_tied_weights_keys(all_submodels=True)) is arch.tie_embeddings
    assert arch.tie_embeddings is tie
