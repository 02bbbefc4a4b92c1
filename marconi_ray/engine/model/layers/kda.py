"""KDA mixer (Kimi Delta Attention, Kimi Linear): q/k/v projections -> one causal conv1d
over [q, k, v] -> the gated delta rule with a per-channel decay -> per-head RMSNorm gated
by sigmoid -> o_proj, split across ranks by heads.

Per head h and token t (q and k L2-normalised, q scaled by head_dim**-0.5):
    S = diag(exp(g_t)) S;  S += k_t (x) beta_t (v_t - k_t^T S);  o_t = q_t^T S
with beta = sigmoid(b_proj(x)) and g = -exp(A_log_h) * softplus(f_b(f_a(x)) + dt_bias),
one log decay per key channel (`marconi_kernels.kda`). Ling (`bailing_hybrid`) projects the
decay and the output gate at full rank (`f_proj`, `g_proj`) and, with a lower bound b,
bounds the decay: g = b * sigmoid(exp(A_log_h) * (f_proj(x) + dt_bias)) (`KDAConfig`).

States per sequence (this rank's shard):
- conv [3 * heads_local * head_dim, d_conv] in the model dtype (the conv's last inputs),
- ssm [heads_local, head_dim, head_dim] in float32 (the delta rule's S).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from torch import nn
from torch.nn import functional as F

from marconi_kernels import KernelSet
from marconi_ray.engine.model.layers.linear import column, row
from marconi_ray.engine.model.layers.packed import (
    PackedMixer,
    PackedPart,
    PartStates,
    delta_rule_parts,
    packed_conv,
    part_states,
)
from marconi_ray.engine.model.layers.weights import WeightSpec
from marconi_ray.engine.model.model_config import KDAConfig
from marconi_ray.engine.model.parallel import Segment, TPGroup, local_size

MIN_CHUNK = 16
"""Shortest chunk a prefill uses."""


def sigmoid_gated_head_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """KDA's output norm: per head, `weight * x / rms(x) * sigmoid(gate)`, all in float32
    (the weight too), cast back to x's dtype. x, gate [..., heads, head_dim]."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf * torch.sigmoid(gate.float())).to(x.dtype)


class KDAMixer(PackedMixer, nn.Module):
    """One KDA layer's shard. `prefix` is the HF sub-module (`self_attn`).

    Checkpoint layout (Kimi Linear's, which transformers saves): `q_proj`, `k_proj`,
    `v_proj` (D -> H*dk each), `q_conv1d`, `k_conv1d`, `v_conv1d` ([H*dk, 1, d_conv]
    each; transformers concatenates them into one `conv1d` in memory), `f_a_proj`
    (D -> dk, replicated), `f_b_proj` (dk -> H*dk), `dt_bias` [H*dk], `A_log`
    [1, 1, H, 1], `b_proj` (D -> H),
    `g_a_proj` (D -> dk, replicated), `g_b_proj` (dk -> H*dk), `o_norm.weight` [dk],
    `o_proj` (H*dk -> D). Each rank keeps whole heads of every split part. Without
    `cfg.low_rank_gates` (Ling) `f_proj` and `g_proj` (D -> H*dk) replace the low-rank
    pairs and `A_log` is [H].
    """

    KERNEL_OPS: ClassVar[tuple[str, ...]] = (
        "causal_conv1d",
        "causal_conv1d_update",
        "causal_conv1d_varlen",
        "kda_chunk",
        "kda_chunk_varlen",
        "kda_step",
    )
    """The `KernelSet` ops this mixer calls (prefill and decode)."""

    def __init__(
        self,
        d_model: int,
        cfg: KDAConfig,
        eps: float,
        prefix: str,
        tp: TPGroup,
        dtype: torch.dtype,
        kernels: KernelSet,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.eps = eps
        self.kernels = kernels
        self.prefix = prefix
        self.heads = tp.local(cfg.n_heads)
        dk = cfg.head_dim
        self.key_local = self.heads * dk
        channels = Segment(cfg.key_dim)
        self.conv_segments = (channels, channels, channels)
        self.conv_dim = local_size(self.conv_segments, tp)
        latent = (Segment(dk, False),)
        self.q_proj = column(d_model, (channels,), False, f"{prefix}.q_proj", tp, dtype)
        self.k_proj = column(d_model, (channels,), False, f"{prefix}.k_proj", tp, dtype)
        self.v_proj = column(d_model, (channels,), False, f"{prefix}.v_proj", tp, dtype)
        self.b_proj = column(d_model, (Segment(cfg.n_heads),), False, f"{prefix}.b_proj", tp, dtype)
        self.gate_projs: tuple[str, ...]
        if cfg.low_rank_gates:
            self.gate_projs = ("f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj")
            self.f_a_proj = column(d_model, latent, False, f"{prefix}.f_a_proj", tp, dtype)
            self.f_b_proj = column(dk, (channels,), False, f"{prefix}.f_b_proj", tp, dtype)
            self.g_a_proj = column(d_model, latent, False, f"{prefix}.g_a_proj", tp, dtype)
            self.g_b_proj = column(dk, (channels,), False, f"{prefix}.g_b_proj", tp, dtype)
        else:
            self.gate_projs = ("f_proj", "g_proj")
            self.f_proj = column(d_model, (channels,), False, f"{prefix}.f_proj", tp, dtype)
            self.g_proj = column(d_model, (channels,), False, f"{prefix}.g_proj", tp, dtype)
        self.o_proj = row((channels,), d_model, False, f"{prefix}.o_proj", tp, dtype)
        self.q_conv, self.k_conv, self.v_conv = (
            nn.Parameter(
                torch.empty(self.key_local, 1, cfg.d_conv, dtype=dtype), requires_grad=False
            )
            for _ in range(3)
        )
        self.dt_bias = nn.Parameter(
            torch.zeros(self.key_local, dtype=torch.float32), requires_grad=False
        )
        a_shape = (1, 1, self.heads, 1) if cfg.low_rank_gates else (self.heads,)
        self.A_log = nn.Parameter(torch.zeros(a_shape, dtype=torch.float32), requires_grad=False)
        self.o_norm = nn.Parameter(torch.ones(dk, dtype=dtype), requires_grad=False)

    # ------------------------------------------------------------------ helpers
    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """[..., H' * dk] -> [..., H', dk]."""
        return t.reshape(*t.shape[:-1], self.heads, self.cfg.head_dim)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [..., D] -> the conv input [..., 3 * H' * dk] ([q, k, v]), the per-channel
        log decay g [..., H', dk] (float32) and beta [..., H'] (x's dtype), as transformers
        computes them."""
        qkv = torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)
        f = self._heads(self._forget(x).float() + self.dt_bias.float())
        rate = self.A_log.float().exp().view(self.heads, 1)
        bound = self.cfg.gate_lower_bound
        g = -rate * F.softplus(f) if bound is None else bound * torch.sigmoid(rate * f)
        return qkv, g, self.b_proj(x).sigmoid()

    def _forget(self, x: torch.Tensor) -> torch.Tensor:
        """The decay's projection of x [..., D]: [..., H' * dk]."""
        if self.cfg.low_rank_gates:
            return self.f_b_proj(self.f_a_proj(x))
        return self.f_proj(x)

    def _conv_weight(self) -> torch.Tensor:
        """The conv's weight over [q, k, v], [3 * H' * dk, d_conv]."""
        return torch.cat([self.q_conv[:, 0], self.k_conv[:, 0], self.v_conv[:, 0]])

    def _split(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Conv output [..., 3 * H' * dk] -> q, k, v [..., H', dk]."""
        q, k, v = torch.split(mixed, [self.key_local] * 3, dim=-1)
        return self._heads(q), self._heads(k), self._heads(v)

    def _output(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """o [..., H', dk], the mixer input x [..., D] -> o_proj(norm(o) * sigmoid(gate))."""
        if self.cfg.low_rank_gates:
            gate = self._heads(self.g_b_proj(self.g_a_proj(x)))
        else:
            gate = self._heads(self.g_proj(x))
        y = sigmoid_gated_head_norm(o, gate, self.o_norm, self.eps)
        return self.o_proj(y.reshape(*y.shape[:-2], self.key_local))

    def _chunk(self, n: int) -> int:
        """The chunk length for an n-token prefill: `cfg.chunk_size`, or the power of two
        (at least `MIN_CHUNK`) that covers a shorter prefill."""
        fit = max(MIN_CHUNK, 1 << max(0, n - 1).bit_length())
        return min(self.cfg.chunk_size, fit)

    def empty_state(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero conv [conv_local, d_conv] (model dtype) and ssm [H', dk, dk] (float32)."""
        conv = torch.zeros(self.conv_dim, self.cfg.d_conv, dtype=self.q_conv.dtype, device=device)
        dk = self.cfg.head_dim
        return conv, torch.zeros(self.heads, dk, dk, dtype=torch.float32, device=device)

    # ------------------------------------------------------------------ forward
    def prefill_packed(
        self, x: torch.Tensor, parts: Sequence[PackedPart]
    ) -> tuple[torch.Tensor, list[PartStates]]:
        """Several sequences' new tokens x [T, d_model] (packed, see `packed`): row-wise
        work once over all rows, the conv and the chunked KDA once for all parts (each
        from its own states). Returns y [T, d_model] and per part its final states
        (conv [C, K], ssm [H', dk, dk]) and those at its `emit_at`."""
        qkv, g, beta = self._project(x)
        k = self.kernels
        mixed, convs = packed_conv(k, qkv, self._conv_weight(), None, parts, "silu")
        q, kk, v = self._split(mixed)
        o, ssms = delta_rule_parts(
            k.kda_chunk, k.kda_chunk_varlen, (q, kk, v, g, beta), parts,
            self._chunk, lambda: self.empty_state(x.device)[1],
        )  # fmt: skip
        return self._output(o, x), part_states(convs, ssms)

    def decode(self, x: torch.Tensor, conv: torch.Tensor, ssm: torch.Tensor) -> torch.Tensor:
        """One token per sequence. x [B, d_model]; conv [B, C, K] and ssm [B, H', dk, dk]
        are updated in place. Returns [B, d_model]."""
        qkv, g, beta = self._project(x)
        k = self.kernels
        mixed = k.causal_conv1d_update(qkv, conv, self._conv_weight(), None, activation="silu")
        q, kk, v = self._split(mixed)
        o = k.kda_step(ssm, q, kk, v, g, beta, use_qk_l2norm=True)
        return self._output(o, x)

    def weight_specs(self) -> dict[str, WeightSpec]:
        p = self.prefix
        out: dict[str, WeightSpec] = {}
        for name in ("q_proj", "k_proj", "v_proj", "b_proj", "o_proj", *self.gate_projs):
            mod = getattr(self, name)
            out.update({f"{name}.{k}": v for k, v in mod.weight_specs().items()})
        channels = (Segment(self.cfg.key_dim),)
        for name in ("q_conv", "k_conv", "v_conv"):
            out[name] = WeightSpec(f"{p}.{name}1d.weight", 0, channels)
        out["dt_bias"] = WeightSpec(f"{p}.dt_bias", 0, channels)
        heads_dim = 2 if self.cfg.low_rank_gates else 0
        out["A_log"] = WeightSpec(f"{p}.A_log", heads_dim, (Segment(self.cfg.n_heads),))
        out["o_norm"] = WeightSpec(f"{p}.o_norm.weight")
        return out
