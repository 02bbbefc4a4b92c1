"""Mixture-of-experts feed-forward block: a top-k router (`route`: softmax or sigmoid
scores, an optional selection bias and expert groups, renormalised or not, scaled), gated
experts run grouped by expert, and an optional shared expert behind a sigmoid gate
(Qwen3.5-MoE, Qwen3-Next). The router is a function of the logits and the config, apart
from the expert computation.

Tensor parallelism: every rank holds every expert, each with its slice of the
intermediate width (gate/up split by rows, down by columns, as a dense MLP is split), so
routing needs no communication and the routed and shared outputs are summed and
all-reduced once. The router and the shared expert's gate are replicated.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from marconi_ray.engine.layers.mlp import MLP, activation
from marconi_ray.engine.layers.weights import WeightSpec
from marconi_ray.engine.model_config import MLPConfig, MoEConfig
from marconi_ray.engine.parallel import Segment, TPGroup


def route(
    logits: torch.Tensor, cfg: MoEConfig, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router weights and experts of `cfg`'s router (see `MoEConfig`), in float32.

    Scores are `cfg.scoring` of the logits; the `top_k` experts are chosen by score plus
    `bias` [E] (the selection bias; None: none) within the best `topk_group` of `n_group`
    groups; their weights are the unbiased scores, renormalised when `cfg.norm_topk`,
    times `cfg.routed_scale`.

    Shapes: logits [N, E] -> (weights [N, top_k] in logits' dtype, experts [N, top_k]).
    """
    logits32 = logits.float()
    if cfg.scoring == "softmax":
        scores = torch.softmax(logits32, dim=-1)
    else:
        scores = torch.sigmoid(logits32)
    choice = scores if bias is None else scores + bias.float()
    if cfg.n_group > 1:
        n, e = choice.shape
        grouped = choice.view(n, cfg.n_group, e // cfg.n_group)
        group_score = grouped.topk(min(2, e // cfg.n_group), dim=-1).values.sum(dim=-1)
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(cfg.topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // cfg.n_group, dim=1), -torch.inf)
    experts = choice.topk(cfg.top_k, dim=-1).indices
    weights = scores.gather(1, experts)
    if cfg.norm_topk:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if cfg.routed_scale != 1.0:
        weights = weights * cfg.routed_scale
    return weights.to(logits.dtype), experts


class MoE(nn.Module):
    """`sum_k w_k * expert_k(x) + sigmoid(x . g) * shared(x)` for x [N, D] -> [N, D].

    Experts are gated MLPs `down(act(gate(x)) * up(x))`, stacked as [E, I', D] (gate, up)
    and [E, D, I'] (down) with I' this rank's slice of `cfg.intermediate_size`; their
    checkpoint keys are `{prefix}.experts.{e}.{gate,up,down}_proj.weight`. Tokens are
    sorted by expert and each expert runs once on all of its tokens (a loop over the
    experts hit, none over tokens); outputs are accumulated in expert order.
    """

    def __init__(
        self, d_model: int, cfg: MoEConfig, prefix: str, tp: TPGroup, dtype: torch.dtype
    ) -> None:
        super().__init__()
        if not cfg.gated:
            raise ValueError(f"{prefix}: plain (ungated) experts are not implemented")
        self.cfg = cfg
        self.tp = tp
        self.prefix = prefix
        self.act = activation(cfg.activation)
        width = tp.local(cfg.intermediate_size)
        e = cfg.n_experts
        self.router = nn.Parameter(torch.empty(e, d_model, dtype=dtype), requires_grad=False)
        self.selection_bias: nn.Parameter | None = None
        if cfg.selection_bias:
            self.selection_bias = nn.Parameter(
                torch.empty(e, dtype=torch.float32), requires_grad=False
            )
        self.w_gate = nn.Parameter(torch.empty(e, width, d_model, dtype=dtype), requires_grad=False)
        self.w_up = nn.Parameter(torch.empty(e, width, d_model, dtype=dtype), requires_grad=False)
        self.w_down = nn.Parameter(torch.empty(e, d_model, width, dtype=dtype), requires_grad=False)
        self.shared: MLP | None = None
        self.shared_gate: nn.Parameter | None = None
        if cfg.n_shared_experts:
            shared_cfg = MLPConfig(cfg.shared_intermediate_size, cfg.activation, gated=True)
            key = f"{prefix}.shared_expert"
            self.shared = MLP(d_model, shared_cfg, key, tp, dtype, reduce=False)
            if cfg.shared_expert_gate:
                self.shared_gate = nn.Parameter(
                    torch.empty(1, d_model, dtype=dtype), requires_grad=False
                )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        weights, experts = route(F.linear(x, self.router), cfg, self.selection_bias)
        flat = experts.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=cfg.n_experts).tolist()
        token = order // cfg.top_k
        scale = weights.reshape(-1)[order, None]
        out = torch.zeros_like(x)
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            rows = slice(start, start + n)
            start += n
            h = x.index_select(0, token[rows])
            h = self.act(F.linear(h, self.w_gate[e])) * F.linear(h, self.w_up[e])
            out.index_add_(0, token[rows], F.linear(h, self.w_down[e]) * scale[rows])
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(F.linear(x, self.shared_gate)) * shared
            out = out + shared
        return self.tp.all_reduce(out)

    def weight_specs(self) -> dict[str, WeightSpec]:
        p, e = self.prefix, self.cfg.n_experts
        width = (Segment(self.cfg.intermediate_size),)
        out = {
            "router": WeightSpec(f"{p}.gate.weight"),
            "w_gate": WeightSpec(f"{p}.experts.{{e}}.gate_proj.weight", 0, width, stack=e),
            "w_up": WeightSpec(f"{p}.experts.{{e}}.up_proj.weight", 0, width, stack=e),
            "w_down": WeightSpec(f"{p}.experts.{{e}}.down_proj.weight", 1, width, stack=e),
        }
        if self.shared is not None:
            out.update({f"shared.{k}": v for k, v in self.shared.weight_specs().items()})
        if self.shared_gate is not None:
            out["shared_gate"] = WeightSpec(f"{p}.shared_expert_gate.weight")
        if self.selection_bias is not None:
            out["selection_bias"] = WeightSpec(f"{p}.gate.e_score_correction_bias")
        return out
