"""Mixture-of-experts feed-forward block: a top-k router (`route`: softmax or sigmoid
scores, an optional selection bias and expert groups, renormalised or not, scaled),
gated or plain experts run grouped by expert, optionally between latent projections
D -> latent -> D (NemotronH), and an optional shared expert, plain or behind a sigmoid
gate (Qwen3.5-MoE, Qwen3-Next). The router is a function of the logits and the config,
apart from the expert computation. Where each family keeps the weights: `MoELayout`.

Tensor parallelism: every rank holds every expert, each with its slice of the
intermediate width (gate/up split by rows, down by columns, as a dense MLP is split), so
routing needs no communication and the routed and shared outputs are summed and
all-reduced once. The router, the shared expert's gate and the latent projections are
replicated: each rank projects to the whole latent width, its experts' partial sum is in
latent space and the (linear, bias-free) up-projection maps it to a partial sum in D,
which joins the one all-reduce. The latent width is small (NemotronH: D / 4) and the
projections run once per token, so splitting them would cost a second all-reduce to
save little.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from marconi_kernels import KernelSet, get_kernels
from marconi_ray.engine.model.layers.fused_mlp import FusedGatedMLP
from marconi_ray.engine.model.layers.mlp import MLP, activation
from marconi_ray.engine.model.layers.moe_layout import MoELayout
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import MLPConfig, MoEConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup


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


GATHER_BUDGET = 1 << 24
"""Most weight elements the gathered dispatch may gather in one call (pairs x the
experts' gate, up and down weights of this rank); larger inputs take the grouped one."""


class MoE(nn.Module):
    """`fc2(sum_k w_k * expert_k(fc1(x))) + gate(x) * shared(x)` for x [N, D] -> [N, D]
    (fc1, fc2 the latent projections, identities without a latent width; gate 1 without
    a shared-expert gate; no shared term without a shared expert).

    Experts are `down(act(gate(h)) * up(h))` (gated) or `down(act(up(h)))`, h of width
    D or the latent width, stacked as [E, I', h] (gate, up; [E, 2I', h] gate then up in
    the fused layout) and [E, h, I'] (down) with I' this rank's slice of
    `cfg.intermediate_size`. Two dispatches, chosen by shape alone:
    - grouped (prefill-sized inputs): the (token, choice) pairs run through each
      weight as one grouped matmul (the kernel set's `grouped_matmul`: rows grouped by
      expert, each expert's weight read once for all of its rows). The reference reads
      the per-expert counts to the host (free on CPU); the Triton kernel lays the rows
      out on the device and reads nothing back, so no dispatch makes a host sync;
    - gathered (decode-sized inputs, `GATHER_BUDGET`): every (token, choice) pair gathers
      its expert's weights and runs as one batched matmul: static shapes, no host sync,
      so a decode step can be replayed as a CUDA graph. It reads each chosen expert once
      per pair, the bytes a decode step reads anyway while its tokens choose distinct
      experts.
    Both sum a token's pairs in choice order (the same sums up to float rounding).

    Args:
        layer: the HF decoder layer's key prefix (`layers.{i}`); `layout` says where the
            block's weights are below it.
    """

    KERNEL_OPS: ClassVar[tuple[str, ...]] = ("grouped_matmul",)

    def __init__(
        self,
        d_model: int,
        cfg: MoEConfig,
        layer: str,
        layout: MoELayout,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet | None = None,
    ) -> None:
        super().__init__()
        self.kernels = kernels or get_kernels("cpu", prefer="ref")
        if layout.expert_layout == "fused" and not cfg.gated:
            raise ValueError(f"{layer}: fused expert weights must be gated")
        self.cfg = cfg
        self.tp = tp
        self.layer = layer
        self.layout = layout
        self.act = activation(cfg.activation)
        width = tp.local(cfg.intermediate_size)
        e = cfg.n_experts
        d_in = d_model if cfg.latent_dim is None else cfg.latent_dim

        def param(*shape: int, dt: torch.dtype = dtype) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, dtype=dt), requires_grad=False)

        self.router = param(e, d_model, dt=torch.float32 if layout.router_fp32 else dtype)
        self.selection_bias = param(e, dt=torch.float32) if cfg.selection_bias else None
        self.latent_in: nn.Parameter | None = None
        self.latent_out: nn.Parameter | None = None
        if cfg.latent_dim is not None:
            self.latent_in = param(cfg.latent_dim, d_model)
            self.latent_out = param(d_model, cfg.latent_dim)
        fused = layout.expert_layout == "fused"
        self.w_gate_up = param(e, 2 * width, d_in) if fused else None
        self.w_gate = param(e, width, d_in) if cfg.gated and not fused else None
        self.w_up = None if fused else param(e, width, d_in)
        self.w_down = param(e, d_in, width)
        self.shared: MLP | FusedGatedMLP | None = None
        self.shared_gate = param(1, d_model) if cfg.shared_expert_gate else None
        if cfg.n_shared_experts:
            shared_cfg = MLPConfig(cfg.shared_intermediate_size, cfg.activation, cfg.gated)
            key = f"{layer}.{layout.shared}"
            mlp = FusedGatedMLP if layout.shared_fused else MLP
            self.shared = mlp(d_model, shared_cfg, key, tp, dtype, reduce=False)

    def expert_elems(self) -> int:
        """Weight elements of one expert on this rank (gate, up and down)."""
        mats = (self.w_gate_up, self.w_gate, self.w_up, self.w_down)
        return sum(w[0].numel() for w in mats if w is not None)

    def gathers(self, n_tokens: int) -> bool:
        """Whether `n_tokens` tokens take the gathered (sync-free) dispatch."""
        return n_tokens * self.cfg.top_k * self.expert_elems() <= GATHER_BUDGET

    def _grouped(
        self, h_in: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """h_in [N, d_in], experts and weights [N, top_k] -> [N, d_in]: the N * top_k
        (token, expert) pairs through each weight as one `grouped_matmul`."""
        n, k = experts.shape
        flat = experts.reshape(-1)
        h = h_in.repeat_interleave(k, dim=0)
        mm = self.kernels.grouped_matmul
        if self.w_gate_up is not None:
            gate, up = mm(h, self.w_gate_up, flat).chunk(2, dim=-1)
            act = self.act(gate) * up
        else:
            assert self.w_up is not None
            up = mm(h, self.w_up, flat)
            act = self.act(up) if self.w_gate is None else self.act(mm(h, self.w_gate, flat)) * up
        y: torch.Tensor = mm(act, self.w_down, flat) * weights.reshape(-1, 1)
        return y.view(n, k, -1).sum(dim=1)

    def _gathered(
        self, h_in: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        """h_in [N, d_in], experts and weights [N, top_k] -> [N, d_in], one batched
        matmul per weight over the N * top_k (token, expert) pairs."""
        n, k = experts.shape
        flat = experts.reshape(-1)
        h = h_in.repeat_interleave(k, dim=0)[:, :, None]

        def mm(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return torch.bmm(w.index_select(0, flat), x)

        if self.w_gate_up is not None:
            gate, up = mm(self.w_gate_up, h).chunk(2, dim=1)
            act = self.act(gate) * up
        else:
            assert self.w_up is not None
            up = mm(self.w_up, h)
            act = self.act(up) if self.w_gate is None else self.act(mm(self.w_gate, h)) * up
        y = mm(self.w_down, act)[:, :, 0] * weights.reshape(-1, 1)
        return y.view(n, k, -1).sum(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        logits = F.linear(x.to(self.router.dtype), self.router)
        weights, experts = route(logits, cfg, self.selection_bias)
        weights = weights.to(x.dtype)
        h_in = x if self.latent_in is None else F.linear(x, self.latent_in)
        dispatch = self._gathered if self.gathers(x.shape[0]) else self._grouped
        out = dispatch(h_in, experts, weights)
        if self.latent_out is not None:
            out = F.linear(out, self.latent_out)
        if self.shared is not None:
            shared = self.shared(x)
            if self.shared_gate is not None:
                shared = torch.sigmoid(F.linear(x, self.shared_gate)) * shared
            out = out + shared
        return self.tp.all_reduce(out)

    def weight_specs(self) -> dict[str, WeightSpec]:
        lay, e = self.layout, self.cfg.n_experts
        p = f"{self.layer}.{lay.experts}"
        width = (Segment(self.cfg.intermediate_size),)
        out = {"router": WeightSpec(f"{self.layer}.{lay.router}")}
        if self.w_gate_up is not None:
            out["w_gate_up"] = WeightSpec(f"{p}.input_linear.weight", 1, width * 2)
            out["w_down"] = WeightSpec(f"{p}.output_linear.weight", 2, width)
        else:
            out["w_up"] = WeightSpec(f"{p}.{{e}}.up_proj.weight", 0, width, stack=e)
            out["w_down"] = WeightSpec(f"{p}.{{e}}.down_proj.weight", 1, width, stack=e)
            if self.w_gate is not None:
                out["w_gate"] = WeightSpec(f"{p}.{{e}}.gate_proj.weight", 0, width, stack=e)
        if self.latent_in is not None:
            out["latent_in"] = WeightSpec(f"{self.layer}.{lay.latent_in}")
            out["latent_out"] = WeightSpec(f"{self.layer}.{lay.latent_out}")
        if self.shared is not None:
            out.update({f"shared.{k}": v for k, v in self.shared.weight_specs().items()})
        if self.shared_gate is not None:
            out["shared_gate"] = WeightSpec(f"{self.layer}.{lay.shared_gate}")
        if self.selection_bias is not None:
            out["selection_bias"] = WeightSpec(f"{self.layer}.{lay.selection_bias}")
        return out
