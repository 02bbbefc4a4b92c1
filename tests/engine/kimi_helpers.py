"""Kimi Linear layer tests' shared set-up: a tiny transformers config, a layer's random
weights, and loading one rank's shard of them into an engine mixer."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from marconi_ray.engine.model.loader import _load_tensor
from marconi_ray.engine.model.parallel import TPGroup
from marconi_ray.engine.model.weight_source import StateDictSource


def tiny_config(**overrides: Any) -> Any:
    """A small `KimiLinearConfig` (fp32): 4 KDA heads of 8, MLA with 4 heads."""
    from transformers import KimiLinearConfig

    kw: dict[str, Any] = {
        "vocab_size": 128, "hidden_size": 32, "intermediate_size": 48,
        "moe_intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 4, "kv_lora_rank": 12, "qk_rope_head_dim": 4,
        "qk_nope_head_dim": 6, "v_head_dim": 5, "linear_num_heads": 4, "linear_head_dim": 8,
        "linear_conv_kernel_dim": 4, "layer_types": ["linear_attention", "full_attention"],
        "num_local_experts": 4, "num_experts_per_tok": 2, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2,
    }  # fmt: skip
    kw.update(overrides)
    config = KimiLinearConfig(**kw)
    config._attn_implementation = "eager"
    return config


def randomize(module: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Fill every parameter of `module` with small random values (norm weights about 1,
    KDA's A_log and dt_bias as the fla initialisation draws them); returns its state dict."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            r = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            if name.endswith("A_log"):
                value = torch.log(1 + 15 * torch.rand(p.shape, generator=gen, dtype=torch.float64))
            elif name.endswith("dt_bias"):
                value = r * 0.5 - 2.0
            elif "norm" in name:
                value = 1 + 0.1 * r
            else:
                value = r * p.shape[-1] ** -0.5
            p.copy_(value.to(p.dtype))
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def checkpoint_layout(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A KDA module's in-memory weights in the checkpoint layout transformers saves: the
    fused `conv1d.weight` split into `q_conv1d` / `k_conv1d` / `v_conv1d`, the forget
    gate's weights beside the others (MLA weights pass unchanged)."""
    out = {}
    for key, value in weights.items():
        if key == "conv1d.weight":
            for name, part in zip(("q", "k", "v"), value.chunk(3), strict=True):
                out[f"{name}_conv1d.weight"] = part
        else:
            out[key.removeprefix("forget_gate.")] = value
    return out


def load_shard(
    mixer: nn.Module, weights: dict[str, torch.Tensor], prefix: str, tp: TPGroup
) -> None:
    """Copy rank `tp.rank`'s slice of `weights` (keys without `prefix.`) into `mixer`
    through its `weight_specs` (the loader's slicing)."""
    layout = checkpoint_layout(weights)
    source = StateDictSource({f"{prefix}.{k}": v for k, v in layout.items()})
    owner = SimpleNamespace(tp=tp)
    params = dict(mixer.named_parameters())
    for name, spec in mixer.weight_specs().items():  # type: ignore[operator]
        tensor = _load_tensor(owner, spec, spec.key, source)  # type: ignore[arg-type]
        with torch.no_grad():
            params[name].copy_(tensor)
