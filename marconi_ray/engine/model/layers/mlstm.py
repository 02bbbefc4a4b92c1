"""xLSTM's mLSTM mixer: q, k, v, output-gate and gate projections -> the mLSTM recurrence
per head -> a layer norm per head -> sigmoid(output gate) gate -> out_proj.

Per head h of the layer (see `MLSTMConfig`), token t, x the block's normed input:
    q, k, v = q(x), k(x), v(x) split per head;  i, f = cap(igate(x)), cap(fgate(x))
    h_t = the mLSTM cell (`marconi_kernels.mlstm`) over (q, k, v, i, f)
    y = out_proj(sigmoid(ogate(x)) * w * layernorm_per_head(h))
with cap(z) = c * tanh(z / c) (`gate_soft_cap`), each head's layer norm in float32 over
its v_head_dim channels (no bias), its result cast to the model dtype before the weight
(transformers' `xLSTMMultiHeadLayerNorm`).

Tensor parallelism splits the heads: q, k, v, ogate and the two gates column-parallel by
heads, the norm weight by channels, out_proj row-parallel (its one all-reduce). The norm
spans one head only, so no other all-reduce is needed and tp > 1 equals tp 1.

States per sequence (this rank's shard), in the shape every recurrent mixer has:
- conv [0, 0] in the model dtype: empty (the layer has no conv), priced at 0 bytes;
- ssm [heads_local, P] in float32, P = qk_head_dim * v_head_dim + qk_head_dim + 1: each
  head's packed (C, n, m) (`marconi_kernels.mlstm.pack_mlstm_state`); zeros is the empty
  state (transformers' `xLSTMCache` starts from zeros, m included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn

from marconi_kernels import KernelSet
from marconi_kernels.mlstm import mlstm_state_size
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.packed import (
    PackedMixer,
    PackedPart,
    PartStates,
    cu_seqlens,
    part_states,
    split_states,
    stacked_states,
)
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import MLSTMConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup

MIN_CHUNK = 16
"""Shortest chunk a prefill uses."""


class MLSTMMixer(PackedMixer, nn.Module):
    """One mLSTM layer's shard. `prefix` is the HF sub-module (`layers.{i}.mlstm_layer`,
    which the checkpoint calls `blocks.{i}.mlstm_layer`), holding `q`, `k`, `v`,
    `ogate_preact`, `igate_preact`, `fgate_preact`, `multihead_norm` and `out_proj`.
    `prefill` (one sequence) is `prefill_packed` of one part."""

    KERNEL_OPS: ClassVar[tuple[str, ...]] = ("mlstm_chunk", "mlstm_chunk_varlen", "mlstm_step")
    """The `KernelSet` ops this mixer calls (prefill and decode)."""

    def __init__(
        self,
        d_model: int,
        cfg: MLSTMConfig,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.kernels = kernels
        self.prefix = prefix
        self.tp = tp
        self.heads = tp.local(cfg.n_heads)
        self.v_local = self.heads * cfg.v_head_dim
        qk, v, heads = (Segment(cfg.qk_width),), (Segment(cfg.v_width),), (Segment(cfg.n_heads),)
        self.q = column(d_model, qk, False, f"{prefix}.q", tp, dtype)
        self.k = column(d_model, qk, False, f"{prefix}.k", tp, dtype)
        self.v = column(d_model, v, False, f"{prefix}.v", tp, dtype)
        self.ogate_preact = column(d_model, v, False, f"{prefix}.ogate_preact", tp, dtype)
        self.igate_preact = column(d_model, heads, True, f"{prefix}.igate_preact", tp, dtype)
        self.fgate_preact = column(d_model, heads, True, f"{prefix}.fgate_preact", tp, dtype)
        self.norm_weight = nn.Parameter(torch.ones(self.v_local, dtype=dtype), requires_grad=False)
        self.out_proj = row(v, d_model, False, f"{prefix}.out_proj", tp, dtype)

    def _cap(self, z: torch.Tensor) -> torch.Tensor:
        """The gates' soft cap c * tanh(z / c) (z itself when uncapped)."""
        c = self.cfg.gate_soft_cap
        return z if c is None else c * torch.tanh(z / c)

    def _inputs(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """x [..., D] -> q, k [..., H', dqk], v [..., H', dv], igate, fgate [..., H']."""
        lead, cfg = x.shape[:-1], self.cfg
        q = self.q(x).view(*lead, self.heads, cfg.qk_head_dim)
        k = self.k(x).view(*lead, self.heads, cfg.qk_head_dim)
        v = self.v(x).view(*lead, self.heads, cfg.v_head_dim)
        return q, k, v, self._cap(self.igate_preact(x)), self._cap(self.fgate_preact(x))

    def _output(self, h: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """h [..., H', dv], the layer input x [..., D] -> out_proj(sigmoid(ogate(x)) * w *
        norm(h)) [..., D], each head normed on its own."""
        hf = h.float()
        centred = hf - hf.mean(-1, keepdim=True)
        var = hf.var(-1, keepdim=True, unbiased=False)
        normed = (centred * torch.rsqrt(var + self.cfg.norm_eps)).to(h.dtype)
        flat = normed.reshape(*h.shape[:-2], self.v_local) * self.norm_weight
        return self.out_proj(torch.sigmoid(self.ogate_preact(x)) * flat)

    def _chunk(self, n: int) -> int:
        """The chunk length for an n-token prefill: `cfg.chunk_size`, or the power of two
        (at least `MIN_CHUNK`) that covers a shorter prefill."""
        fit = max(MIN_CHUNK, 1 << max(0, n - 1).bit_length())
        return min(self.cfg.chunk_size, fit)

    def empty_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """The empty conv [0, 0] (model dtype) and zero ssm [heads_local, P] (float32)."""
        size = mlstm_state_size(self.cfg.qk_head_dim, self.cfg.v_head_dim)
        conv = torch.zeros(0, 0, dtype=self.norm_weight.dtype, device=device)
        return conv, torch.zeros(self.heads, size, dtype=torch.float32, device=device)

    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        """Several sequences' new tokens x [T, d_model] (packed, see `packed`): the
        projections, gates and norm once over all rows, the chunked recurrence once for
        all parts (`mlstm_chunk_varlen`, each part from its own state). Returns
        y [T, d_model] and per part its final states (conv [0, 0], ssm [H', P]) and those
        at its `emit_at`."""
        q, k, v, ig, fg = self._inputs(x)
        kern, eps = self.kernels, self.cfg.eps
        if len(parts) == 1:
            (p,) = parts
            h, final, emitted = kern.mlstm_chunk(
                q[None], k[None], v[None], ig[None], fg[None],
                chunk_size=self._chunk(p.length),
                initial_state=None if p.ssm is None else p.ssm[None],
                emit_at=p.emit_at, eps=eps,
            )  # fmt: skip
            h, ssms = h[0], [(final[0], emitted[:, 0])]
        else:
            h, finals, emitted = kern.mlstm_chunk_varlen(
                q, k, v, ig, fg, cu_seqlens=cu_seqlens(parts),
                chunk_size=self._chunk(max(p.length for p in parts)),
                initial_states=stacked_states(
                    [p.ssm for p in parts], lambda: self.empty_state(x.device)[1]
                ),
                emit_at=[p.emit_at for p in parts], eps=eps,
            )  # fmt: skip
            ssms = split_states(parts, finals, emitted)
        conv = self.empty_state(x.device)[0]
        convs = [(conv, conv.new_zeros(len(p.emit_at), 0, 0)) for p in parts]
        return self._output(h, x), part_states(convs, ssms)

    def decode(self, x: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """One token per sequence. x [B, d_model]; ssm [B, H', P] is updated in place;
        conv [B, 0, 0] is untouched. Returns [B, d_model]."""
        q, k, v, ig, fg = self._inputs(x)
        h = self.kernels.mlstm_step(ssm, q, k, v, ig, fg, self.cfg.eps)
        return self._output(h, x)

    def weight_specs(self) -> dict[str, WeightSpec]:
        out: dict[str, WeightSpec] = {}
        names = ("q", "k", "v", "ogate_preact", "igate_preact", "fgate_preact", "out_proj")
        for name in names:
            mod = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in mod.weight_specs().items()})
        out["norm_weight"] = WeightSpec(
            f"{self.prefix}.multihead_norm.weight", 0, (Segment(self.cfg.v_width),)
        )
        return out
