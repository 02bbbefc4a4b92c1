"""The layer stack Kimi Linear and Ling 3.0 share: each HF layer is a KDA or an MLA mixer
(`layer_types`), then a dense gated MLP or a DeepSeek-style mixture of experts
(`mlp_layer_types`): sigmoid scores with a selection bias, expert groups, renormalised
top-k, a routed scale and always-on shared experts of the routed width."""

from __future__ import annotations

from collections.abc import Sequence

from marconi_ray.core.model.hf.arch import BlockConfig, HfArchitecture, MLPConfig, MoEConfig
from marconi_ray.core.model.hf.blocks import MAMBA, architecture, per_layer
from marconi_ray.core.model.hf.kda_arch import KDAConfig
from marconi_ray.core.model.hf.mla_arch import MLAConfig
from marconi_ray.core.model.hf.reader import ConfigReader

DENSE, SPARSE = "dense", "sparse"
"""The `mlp_layer_types` values."""


def deepseek_moe(r: ConfigReader, act: str) -> MoEConfig:
    """The mixture of experts of the `moe_intermediate_size`, `num_local_experts`,
    `num_experts_per_tok`, `n_shared_experts`, `n_group` / `topk_group`,
    `norm_topk_prob` and `routed_scaling_factor` keys."""
    width = r.req_int("moe_intermediate_size")
    shared = r.req_int("n_shared_experts")
    return MoEConfig(
        width,
        r.pos_int("num_local_experts"),
        r.pos_int("num_experts_per_tok"),
        act,
        gated=True,
        n_shared_experts=shared,
        shared_intermediate_size=width * shared,
        norm_topk=r.flag("norm_topk_prob"),
        scoring="sigmoid",
        selection_bias=True,
        n_group=r.pos_int("n_group"),
        topk_group=r.pos_int("topk_group"),
        routed_scale=r.req_float("routed_scaling_factor"),
    )


def kda_mla_stack(
    r: ConfigReader,
    types: Sequence[str],
    mlp_types: Sequence[str],
    kda: KDAConfig | None,
    mla: MLAConfig | None,
    act: str,
) -> HfArchitecture:
    """The architecture of layers `types` (MAMBA: `kda`, else `mla`) each followed by
    the dense MLP (`intermediate_size`) or the experts (`deepseek_moe`) as `mlp_types`
    says; the configs of kinds no layer uses may be None."""
    mlp = MLPConfig(r.req_int("intermediate_size"), act, gated=True)
    moe = deepseek_moe(r, act) if SPARSE in mlp_types else None
    layers: list[list[BlockConfig]] = []
    for t, m in zip(types, mlp_types, strict=True):
        mixer = kda if t == MAMBA else mla
        ffn = mlp if m == DENSE else moe
        assert mixer is not None and ffn is not None
        layers.append([mixer, ffn])
    return architecture(r, per_layer(layers))
