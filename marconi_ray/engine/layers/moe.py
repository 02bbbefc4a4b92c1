"""Mixture-of-experts feed-forward block: a top-k softmax router, gated experts run
grouped by expert, and an optional shared expert behind a sigmoid gate (Qwen3.5-MoE,
Qwen3-Next). The router is a function of the logits (`softmax_topk`), so the other MoE
hybrids' routers (sigmoid with a correction bias, un-renormalised softmax) can be added
beside it without touching the expert computation.

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


def softmax_topk(
    logits: torch.Tensor, top_k: int, renormalise: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router weights and experts: softmax over the experts in float32, the `top_k`
    largest per token (renormalised to sum to 1 when `renormalise`).

    Shapes: logits [N, E] -> (weights [N, top_k] in logits' dtype, experts [N, top_k]).
    """
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    weights, experts = torch.topk(probs, top_k, dim=-1)
    if renormalise:
        weights = weights / weights.sum(dim=-1, keepdim=True)
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
        weights, experts = softmax_topk(F.linear(x, self.router), cfg.top_k, cfg.norm_topk)
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
        return out
